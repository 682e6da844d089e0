"""What draws a turn: the engine protocol a sampler asks (``protocol``: a batch of contexts of
one speaker in, one message each and their log-probs out), the engine a config names
(``factory.make_engine``), and the two engines, each in a folder of its own: Hugging Face
``generate`` in process (``hf``: the engine, its prompt sharing, kept contexts and token draw)
and a vLLM server with one adapter per agent (``vllm``: the server's command, its
installation, process and guard, its requests and probe, and the client).

Room 7 of 13 in data-flow order: it imports only from ``llm.common``, ``llm.conversation``,
``llm.models`` and the core ``teamtr``, never from a room after it
(tests/test_package_imports.py).
"""
