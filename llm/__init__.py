"""teamtr's language-model backend (Hugging Face models taking turns in one shared context).

Note: PyPI has an unrelated distribution that also installs a top-level ``llm``; install teamtr
in its own virtual environment (``make test`` / ``make demo`` create one in ``.venv``).
"""
