"""Where a dialogue starts and how it is graded: the task sources (arithmetic suite, JSONL files,
private notes and the running-sum chain), their phrasings, and the verifiable rewards.

Room 2 of 9 in data-flow order: it imports only from ``llm.common`` and the core ``teamtr``,
never from a room after it (tests/test_package_imports.py).
"""
