"""The `teamtr` subcommands of the language-model backend (train, eval, swap, chat, export)
and their shared argument helpers.

Room 13 of 13 in data-flow order: it imports only from ``llm.common``, ``llm.problems``,
``llm.conversation``, ``llm.models``, ``llm.logprobs``, ``llm.engines``, ``llm.sampling``,
``llm.update``, ``llm.training``, ``llm.export`` and the core ``teamtr``, never from a room
after it (tests/test_package_imports.py).
"""
