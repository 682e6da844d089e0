"""The key-value cache's name in Hugging Face model calls, across transformers versions.

transformers 5.2x calls it ``cache`` (argument and output field); earlier releases call it
``past_key_values``. ``pyproject.toml`` requires the release the suite is tested on (5.24); the
fallback for an older one (a GPU image may ship one) is kept, but no test runs it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from transformers.modeling_outputs import CausalLMOutputWithPast

CACHE_NAME = (
    "cache"
    if "cache" in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)}
    else "past_key_values"
)


def cache_of(output: Any) -> Any:
    """The key-value cache a forward pass with ``use_cache=True`` returned."""
    return getattr(output, CACHE_NAME)


def cache_argument(cache: Any) -> dict[str, Any]:
    """Keyword arguments that hand ``cache`` to a model's ``forward`` or ``generate``."""
    return {CACHE_NAME: cache}
