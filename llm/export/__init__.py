"""A trained team taken out of its run: found in a run directory or an export and loaded to
play questions of one's own (``llm.load_team``), and written for the tools everyone else uses,
PEFT adapter folders, a team description and the lines that serve it with vLLM
(``llm.save_team``, ``teamtr export``).

Room 12 of 13 in data-flow order: it imports only from ``llm.common``, ``llm.rewards``,
``llm.problems``, ``llm.conversation``, ``llm.models``, ``llm.logprobs``, ``llm.engines``,
``llm.sampling``, ``llm.update``, ``llm.training`` and the core ``teamtr``, never from a room
after it (tests/test_package_imports.py).
"""
