"""Rollouts: groups of dialogues per problem played by the current team, with prefix reuse after an
update, dynamic sampling, rewards and advantages, and the behaviour log-probs each update checks
its ratio against. What draws each turn is an engine (``llm.engines``), which the sampler asks
by the engine protocol alone.

Room 8 of 13 in data-flow order: it imports only from ``llm.common``, ``llm.problems``,
``llm.conversation``, ``llm.models``, ``llm.logprobs``, ``llm.engines`` and the core
``teamtr``, never from a room after it (tests/test_package_imports.py).
"""
