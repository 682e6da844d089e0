"""Changing one agent inside its trust region: the agent update (Thm 3.4), the backtracked Adam
step it shares with the Stage-0 alignment of a swapped-in agent, and the dialogue KL estimator
the drift study measures with.

Room 10 of 13 in data-flow order: it imports only from ``llm.common``, ``llm.problems``,
``llm.conversation``, ``llm.models``, ``llm.logprobs``, ``llm.engines``, ``llm.sampling`` and
the core ``teamtr``, never from a room after it (tests/test_package_imports.py).
"""
