"""Held-out evaluation of a team: greedy (or sampled) dialogues on test problems, graded by the
task's own reward and metric, per question template, with transcripts and majority votes.

Room 9 of 13 in data-flow order: it imports only from ``llm.common``, ``llm.rewards``,
``llm.problems``, ``llm.conversation``, ``llm.models``, ``llm.engines``, ``llm.sampling`` and
the core ``teamtr``, never from a room after it (tests/test_package_imports.py).
"""
