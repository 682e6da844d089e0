"""The vLLM engine: the one description of a vLLM server's command line (``command``, also the
export's serving line), where vLLM is installed (``installation``), the server process behind
its guard (``server``, ``guard``), requests to it over a socket file or TCP (``server_address``,
each body from ``completions``), the probe of a server the run did not start (``probe``), the
plugin's half-precision LoRA sum as the engine asks for it (``engine_lora_sum``) and the client
that loads each agent's adapter and draws turns through it (``client``).
"""
