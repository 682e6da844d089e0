"""The vLLM engine: the one description of a vLLM server's command line (``command``, also the
export's serving line), the server process behind its guard (``server``, ``guard``) and the
client that loads each agent's adapter and draws turns through it (``client``).
"""
