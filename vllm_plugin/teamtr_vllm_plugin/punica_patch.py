"""The patch: every punica wrapper's ``add_expand`` adds the LoRA branch in float32 and rounds
the sum stochastically where its output is half precision (see the package's docstring)."""

from __future__ import annotations

import functools
import importlib
import os
from typing import Any

import torch

from teamtr_vllm_plugin.rounding import HALF_DTYPES, stochastic_round

WRAPPERS = (
    ("vllm.lora.punica_wrapper.punica_cpu", "PunicaWrapperCPU"),
    ("vllm.lora.punica_wrapper.punica_gpu", "PunicaWrapperGPU"),
)
"""The punica wrappers whose ``add_expand`` every linear LoRA layer's sum goes through."""
PATCHED = "_teamtr_stochastic_sum"


def stochastic_add_expand(original: Any) -> Any:
    @functools.wraps(original)
    def add_expand(
        self: Any,
        y: torch.Tensor,
        x: Any,
        lora_b_stacked: Any,
        output_slices: Any,
        offset_start: int = 0,
        add_inputs: bool = True,
        **kwargs: Any,
    ) -> Any:
        if y.dtype not in HALF_DTYPES or not add_inputs:
            return original(
                self, y, x, lora_b_stacked, output_slices, offset_start, add_inputs, **kwargs
            )
        # The branch alone, computed into a float32 output: on a CPU in float32 throughout (the
        # torch expand casts to the output's dtype); on a GPU the Triton expand rounds it to
        # the LoRA weights' dtype on its own grid first (the package's docstring) ...
        branch = torch.zeros(y.shape, dtype=torch.float32, device=y.device)
        original(self, branch, x, lora_b_stacked, output_slices, offset_start, True, **kwargs)
        # ... then the product's output plus the branch, rounded once, without bias. Rows of no
        # adapter get a zero branch: their output is on the grid already and comes back exact.
        y.copy_(stochastic_round(y.float() + branch, y.dtype))
        return y

    setattr(add_expand, PATCHED, True)
    return add_expand


def install() -> list[str]:
    """Patch every punica wrapper this vLLM has; returns the ones patched now (and prints them,
    so that a server's log shows the plugin ran in each process vLLM started afresh; a forked
    one inherits the patch)."""
    patched = []
    for module_name, class_name in WRAPPERS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # a build without this platform's wrapper
            continue
        cls = getattr(module, class_name, None)
        if cls is None or getattr(cls.add_expand, PATCHED, False):
            continue
        cls.add_expand = stochastic_add_expand(cls.add_expand)
        patched.append(class_name)
    if patched:  # the line teamtr's engine looks for in the server's log
        print(
            f"teamtr_vllm_plugin: LoRA sum 'stochastic' in process {os.getpid()} "
            f"({', '.join(patched)})",
            flush=True,
        )
    return patched
