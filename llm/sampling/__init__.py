"""Rollouts: groups of dialogues per problem played by the current team, with prefix reuse after an
update, dynamic sampling, rewards and advantages, and the behaviour log-probs each update checks
its ratio against. What draws each turn is an engine (``engine``): Hugging Face ``generate`` in
process (``engine_hf``) or a vLLM server with one adapter per agent (``engine_vllm``).

Room 7 of 12 in data-flow order: it imports only from ``llm.common``, ``llm.problems``,
``llm.conversation``, ``llm.models``, ``llm.logprobs`` and the core ``teamtr``, never from a
room after it (tests/test_package_imports.py).
"""
