"""How agents share one context: the chat format that turns turns into token ids and back, each
speaker's view of the transcript, the router that picks who speaks, and an environment's session
(``environment_session``: what the world adds between turns, replayed bit for bit).

Room 4 of 13 in data-flow order: it imports only from ``llm.common``, ``llm.problems`` and the
core ``teamtr``, never from a room after it (tests/test_package_imports.py).
"""
