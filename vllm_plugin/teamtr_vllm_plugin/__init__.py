"""teamtr's vLLM plugin: LoRA branches that survive a half-precision server.

vLLM's adapted linear layers compute the base product in the model's dtype and add the LoRA
branch into that output in place (``vllm/lora/layers/base_linear.py``: ``_apply_sync``, then
``_apply_lora_to_output``; the row-parallel layer adds it the same way), every path through
the punica wrapper's ``add_expand``. In bfloat16 the product's output lies on bfloat16's grid,
and a branch under half its spacing, as the first steps of an update are, rounds away: the
served policy keeps a fraction of the trained change (0.29 and 0.62 of float32's on the default
relay's first updates, docs/scaling_out.md).

With ``TEAMTR_VLLM_LORA_SUM=stochastic`` in the server's environment, ``add_expand`` computes
the branch in float32 instead, adds it to the product's output there and rounds the sum back
to the model's dtype stochastically (``rounding.stochastic_round``): unbiased for a branch of
any size, at no extra product. Unset, or ``vllm``: vLLM's own sum, untouched. A float32 model
is never touched. vLLM calls ``register`` in every one of its processes (API server, engine
core, workers), before any model is built.
"""

from __future__ import annotations

import os

ENVIRONMENT = "TEAMTR_VLLM_LORA_SUM"
SUMS = ("vllm", "stochastic")
"""``vllm``: vLLM's own sum (rounded to nearest in the model's dtype); ``stochastic``: summed
in float32, rounded stochastically."""


def chosen_sum() -> str:
    value = os.environ.get(ENVIRONMENT, "vllm").strip() or "vllm"
    if value not in SUMS:
        raise ValueError(f"{ENVIRONMENT}={value!r}: one of {', '.join(SUMS)}")
    return value


def register() -> None:
    """vLLM's ``vllm.general_plugins`` entry point."""
    if chosen_sum() == "vllm":
        return
    from teamtr_vllm_plugin.lora_sum import install

    install()
