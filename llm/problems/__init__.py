"""Where a dialogue starts and how it is graded: the task sources (arithmetic suite, JSONL files,
private notes and the running-sum chain), their phrasings; their rewards live in ``llm.rewards``.

Room 3 of 13 in data-flow order: it imports only from ``llm.common``, ``llm.rewards`` and the
core ``teamtr``, never from a room after it (tests/test_package_imports.py).
"""
