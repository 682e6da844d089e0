"""The team itself: one base model with a LoRA adapter per agent (or separate models), loading the
real or a tiny model, the merged copy that samples at the bare model's speed, and the memory
estimate of a team.

Room 5 of 13 in data-flow order: it imports only from ``llm.common``, ``llm.problems``,
``llm.conversation`` and the core ``teamtr``, never from a room after it
(tests/test_package_imports.py).
"""
