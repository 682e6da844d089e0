"""teamtr's vLLM plugin: LoRA branches that survive a half-precision server (and, on the CPU
build, an engine core forked rather than spawned: ``engine_core_fork``).

vLLM's adapted linear layers compute the base product in the model's dtype and add the LoRA
branch into that output in place (``vllm/lora/layers/base_linear.py``: ``_apply_sync``, then
``_apply_lora_to_output``; the row-parallel layer adds it the same way), every path through
the punica wrapper's ``add_expand``. In bfloat16 the product's output lies on bfloat16's grid,
and a branch under half its spacing, as the first steps of an update are, rounds away: the
served policy keeps only a fraction of the trained change (docs/scaling_out.md, "vLLM in half
precision: the LoRA sum", measures it).

With ``TEAMTR_VLLM_LORA_SUM=stochastic`` in the server's environment, ``add_expand`` computes
the branch into a float32 output instead, adds it to the product's output there and rounds the
sum back to the model's dtype stochastically (``rounding.stochastic_round``): unbiased for a
branch of any size, at no extra product, and the same bits for a request whatever else its
batch holds (the draws are hashed from what each row computes). Unset, or ``vllm``: vLLM's own
sum, untouched. A float32 model is never touched. vLLM calls ``register`` in every one of its
processes (API server, engine core, workers), before any model is built.

What the branch itself is computed in differs by device. On a CPU (``PunicaWrapperCPU``, the
torch ops) the expand casts the LoRA weights and its input to the output's dtype: into a
float32 output the branch is float32 throughout. On a GPU (``PunicaWrapperGPU``, the Triton
expand) the kernel accumulates in float32 but casts its tile to the LoRA weights' dtype before
it adds the output: a half-precision branch is rounded to nearest on its own grid, relative to
its own size (bfloat16: within 2^-9 of it), before it meets the float32 output. Either way it is
the branch alone that is rounded there, not the branch added to an output on a grid far
coarser than the branch, which is what loses it; the sum is rounded once, stochastically.
"""

from __future__ import annotations

import os

ENVIRONMENT = "TEAMTR_VLLM_LORA_SUM"
SUMS = ("vllm", "stochastic")
"""``vllm``: vLLM's own sum (rounded to nearest in the model's dtype); ``stochastic``: summed
in float32, rounded stochastically."""


def environment_choice(variable: str, choices: tuple[str, ...]) -> str:
    """The server environment's choice in ``variable``: one of ``choices``, the first where
    the variable is unset or empty."""
    value = os.environ.get(variable, "").strip() or choices[0]
    if value not in choices:
        raise ValueError(f"{variable}={value!r}: one of {', '.join(choices)}")
    return value


def chosen_sum() -> str:
    return environment_choice(ENVIRONMENT, SUMS)


def register() -> None:
    """vLLM's ``vllm.general_plugins`` entry point: the LoRA sum asked for, and on the CPU build
    the engine core forked where asked (``engine_core_fork``, ``TEAMTR_VLLM_ENGINE_CORE``)."""
    from teamtr_vllm_plugin import engine_core_fork

    if engine_core_fork.chosen_start() == "fork":
        engine_core_fork.install()
    if chosen_sum() == "vllm":
        return
    from teamtr_vllm_plugin.punica_patch import install

    install()
