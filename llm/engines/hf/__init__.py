"""The in-process engine: Hugging Face ``generate`` on the speaker's policy (``engine``), the
messages it samples with each group's prompt run once (``messages``), the keys and values an
unchanged speaker kept from the draw before (``context_cache``) and how each token is drawn
from softmax(logits / T) (``draw``).
"""
