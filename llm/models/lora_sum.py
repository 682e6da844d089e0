"""How an adapted layer of a half-precision model adds its LoRA branch: where bfloat16 training
lost its signal.

A LoRA layer computes ``y = W x + s B A x``. PEFT computes ``W x`` in the base weights' dtype,
so in bfloat16 its output is already rounded onto bfloat16's grid (8 significant bits), adds
the float32 branch ``s B A x`` and rounds the sum to bfloat16 again. A branch under half the
grid's spacing at ``W x`` (2^-9 of it, relatively) is then rounded away *deterministically*:
the output is exactly the base's, whatever the adapter. An update's first steps (from B = 0)
are such small branches, so the bfloat16 model's policy moves a fraction of what the same
parameters move the float32 model's (``bench/precision_diagnosis.py``: the same Adam step,
from the same weights, on the same batch, reaches ~0.4x the KL; docs/scaling_out.md, "Where
bfloat16 loses its signal"). The gradient is not at fault: rounding's backward pass is the
identity, so the bfloat16 gradient matches float32's (cosine ~0.99).

``half_precision_sum`` (``[lora]``) chooses the sum:

- ``"float32"`` (default): ``W x`` as a half-precision product (at half precision's speed),
  its output converted to float32 and the branch added there, and the sum *kept* in float32:
  the branch reaches the layer's output exactly. The next layers round their inputs to the
  base weights' dtype for their own products, but a float32 value that
  is off the grid rounds up or down with probabilities that follow its position between the two
  neighbours, so a small change survives in expectation instead of vanishing. The residual
  stream, the norms and the activations between products are float32.
- ``"round_once"``: ``W x`` in float32 (the base weight upcast for the product), the branch
  added, the sum rounded once to the base's dtype. Unbiased like "float32", but its products
  run at float32's speed.
- ``"peft"``: PEFT's own (the rounding that loses the signal), kept for the diagnosis.

A float32 model is left untouched by ``install_lora_sum``, so float32 runs do not change by a
bit.
"""

from __future__ import annotations

import typing

import torch
from peft.tuners.lora import Linear as LoraLinear

from llm.models.precision import HALF_DTYPES

HalfPrecisionSum = typing.Literal["float32", "round_once", "peft"]
HALF_PRECISION_SUMS: tuple[str, ...] = typing.get_args(HalfPrecisionSum)


def _base_linear(layer: LoraLinear) -> torch.nn.Linear:
    return typing.cast(torch.nn.Linear, layer.get_base_layer())


def _lora_branch(layer: LoraLinear, x: torch.Tensor) -> torch.Tensor | None:
    """``s B A x`` in float32 summed over the layer's active adapters (None: none active)."""
    total = None
    for name in layer.active_adapters:
        if name not in layer.lora_A:
            continue
        lora_a = typing.cast(torch.nn.Linear, layer.lora_A[name])
        branch = layer.lora_B[name](lora_a(layer.lora_dropout[name](x.to(lora_a.weight.dtype))))
        branch = branch * layer.scaling[name]
        total = branch if total is None else total + branch
    return total


class Float32SumLoraLinear(LoraLinear):
    """A PEFT LoRA ``Linear`` whose output is the half-precision product ``W x`` plus the
    float32 branch, kept in float32 (``half_precision_sum = "float32"``). Its input is rounded
    to the base weights' dtype for the product only: the branch reads it in float32."""

    def forward(self, x: torch.Tensor, *args: typing.Any, **kwargs: typing.Any) -> torch.Tensor:
        base = _base_linear(self)
        if self.disable_adapters or self.merged or kwargs.get("adapter_names") is not None:
            return super().forward(x.to(base.weight.dtype), *args, **kwargs)
        result = base(x.to(base.weight.dtype), *args, **kwargs).float()
        branch = _lora_branch(self, x)
        return result if branch is None else result + branch


class RoundOnceLoraLinear(LoraLinear):
    """A PEFT LoRA ``Linear`` computing ``W x + s B A x`` in float32 and rounding it once to
    the base weights' dtype (``half_precision_sum = "round_once"``)."""

    def forward(self, x: torch.Tensor, *args: typing.Any, **kwargs: typing.Any) -> torch.Tensor:
        base = _base_linear(self)
        dtype = base.weight.dtype
        if self.disable_adapters or self.merged or kwargs.get("adapter_names") is not None:
            return super().forward(x.to(dtype), *args, **kwargs)
        bias = None if base.bias is None else base.bias.float()
        result = torch.nn.functional.linear(x.float(), base.weight.float(), bias)
        branch = _lora_branch(self, x)
        return (result if branch is None else result + branch).to(dtype)


_SUM_CLASSES: dict[str, type[LoraLinear]] = {
    "float32": Float32SumLoraLinear,
    "round_once": RoundOnceLoraLinear,
    "peft": LoraLinear,
}


def _round_input_to_weights(module: torch.nn.Module, args: tuple) -> tuple:
    """Forward pre-hook of a plain half-precision ``Linear`` (a layer without an adapter, or a
    projection outside the adapted set): where ``"float32"`` sums make the residual stream
    float32, its input is rounded to its weights' dtype for the product."""
    weight = typing.cast(torch.Tensor, module.weight)
    return (args[0].to(weight.dtype), *args[1:])


ROUNDING_HOOK = "_teamtr_rounds_input"
"""Attribute marking a ``Linear`` that already carries ``_round_input_to_weights``."""


def install_lora_sum(model: torch.nn.Module, mode: str = "float32") -> int:
    """Make every LoRA ``Linear`` of ``model`` add its branch as ``mode`` says, where the base
    weights are half precision (in place). Returns how many layers were changed (0 for a
    float32 model, which is left as it is)."""
    if mode not in _SUM_CLASSES:
        raise ValueError(
            f"half_precision_sum must be one of {list(HALF_PRECISION_SUMS)}, got {mode!r}"
        )
    wanted = _SUM_CLASSES[mode]
    changed = 0
    for module in model.modules():
        if isinstance(module, LoraLinear):
            if _base_linear(module).weight.dtype not in HALF_DTYPES:
                continue
            if type(module) is not wanted:
                # The subclasses add no state: swapping the class keeps every parameter,
                # adapter and PEFT bookkeeping of the layer as it is.
                module.__class__ = wanted
                changed += 1
    if mode == "float32":
        adapted_bases = {
            id(module.get_base_layer())
            for module in model.modules()
            if isinstance(module, LoraLinear)
        }
        for module in model.modules():
            if (
                type(module) is torch.nn.Linear
                and module.weight.dtype in HALF_DTYPES
                and id(module) not in adapted_bases
                and not getattr(module, ROUNDING_HOOK, False)
            ):
                module.register_forward_pre_hook(_round_input_to_weights)
                setattr(module, ROUNDING_HOOK, True)
    return changed


def lora_sum_of(model: torch.nn.Module) -> str | None:
    """The ``half_precision_sum`` ``model``'s adapted layers use (None: no half-precision LoRA
    layer)."""
    for module in model.modules():
        if isinstance(module, LoraLinear) and _base_linear(module).weight.dtype in HALF_DTYPES:
            for mode, cls in _SUM_CLASSES.items():
                if type(module) is cls:
                    return mode
    return None
