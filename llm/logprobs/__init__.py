"""What the team's policies say about a transcript: chunked scoring of an agent's message tokens
(each group's prompt once), and the torch losses and divergences (clipped surrogate, exact and
sampled per-token KLs, group-normalised advantages).

Room 6 of 13 in data-flow order: it imports only from ``llm.common``, ``llm.problems``,
``llm.conversation``, ``llm.models`` and the core ``teamtr``, never from a room after it
(tests/test_package_imports.py).
"""
