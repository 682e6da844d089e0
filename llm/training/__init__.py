"""A training run from a config to its results: assembling the parts, starting and resuming a
run, its stages (``llm.training.stages``: the loop with its budget, records and console lines),
checkpoints, run directories and their lock, the task checker, preflight checks and
data-parallel ranks.

Room 11 of 13 in data-flow order: it imports only from ``llm.common``, ``llm.problems``,
``llm.conversation``, ``llm.models``, ``llm.logprobs``, ``llm.engines``, ``llm.sampling``,
``llm.evaluation``, ``llm.update`` and the core ``teamtr``, never from a room after it
(tests/test_package_imports.py).
"""
