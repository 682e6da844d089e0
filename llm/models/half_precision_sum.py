"""How an adapted layer of a half-precision model adds its LoRA branch: where bfloat16 training
lost its signal.

A LoRA layer computes ``y = W x + s B A x``. PEFT computes ``W x`` in the base weights' dtype,
so in bfloat16 its output is already rounded onto bfloat16's grid (8 significant bits), adds
the float32 branch ``s B A x`` and rounds the sum to bfloat16 again. A branch under half the
grid's spacing at ``W x`` (2^-9 of it, relatively) is then rounded away *deterministically*:
the output is exactly the base's, whatever the adapter. An update's first steps (from B = 0)
are such small branches, so the bfloat16 model's policy moves a fraction of what the same
parameters move the float32 model's: the same Adam step, from the same weights, on the same
batch, reaches only part of float32's KL (``bench/precision_diagnosis.py``, measured in
docs/scaling_out.md, "Where bfloat16 loses its signal"). The gradient is not at fault:
rounding's backward pass is the identity, so the bfloat16 gradient matches float32's (their
cosine is measured there too).

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


_last_cast: tuple[torch.Tensor, int, torch.Tensor] | None = None


def to_product_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` rounded to a half-precision product's dtype (a cast of the float32 stream).

    Without gradients (sampling, the passes that only measure), the products that read one
    input (a layer's query, key and value projections; its gate and up projections) share one
    cast: the last cast is handed out again while its input is the same tensor, unchanged
    since (its version counter). Rounding is a function of the value, so the shared cast is
    the cast each would compute, bit for bit. With gradients each product casts its own: a
    shared cast would sum the products' input gradients in the half-precision dtype (one
    rounding more) where separate casts sum them in float32."""
    global _last_cast
    if x.dtype == dtype:
        return x
    if torch.is_grad_enabled():
        return x.to(dtype)
    last = _last_cast
    if last is not None and last[0] is x and last[1] == x._version and last[2].dtype == dtype:
        return last[2]
    rounded = x.to(dtype)
    _last_cast = (x, x._version, rounded)
    return rounded


def to_float32(y: torch.Tensor) -> torch.Tensor:
    """A half-precision product's output converted to float32 (exact: every bfloat16 and
    float16 is a float32)."""
    return y.float()


def _add_scaled_product(
    result: torch.Tensor, down: torch.Tensor, lora_b: torch.nn.Linear, scaling: float
) -> torch.Tensor:
    """``result + B(down) * scaling`` as one ``addmm`` into ``result`` (a float32 tensor this
    layer made, read by nothing else yet): no float32 tensor of the output's size for the
    product, the scaled product and the sum, where a whole-transcript pass spends most of a
    layer's time (docs/stage_cost.md). It computes the separate sum's value to float32's
    rounding, not its bits: the BLAS library picks the rank-r sum's order and where the
    scaling and ``result`` enter it (MKL on AMD scales B before the products), so each term
    passes through at most r + 2 roundings on either side (r + 1 when the scaling is a power
    of two, exact: the default alpha 32 / rank 16); tests bound the difference by that count
    (docs/float_tolerances.md)."""
    if lora_b.bias is not None or not result.is_contiguous():
        return result + lora_b(down) * scaling
    width = result.shape[-1]
    fused = result.view(-1, width).addmm_(
        down.reshape(-1, down.shape[-1]), lora_b.weight.t(), alpha=scaling
    )
    return fused.view(result.shape)


class Float32SumLoraLinear(LoraLinear):
    """A PEFT LoRA ``Linear`` whose output is the half-precision product ``W x`` plus the
    float32 branch, kept in float32 (``half_precision_sum = "float32"``). Its input is rounded
    to the base weights' dtype for the product only: the branch reads it in float32.

    The forward pass computes what PEFT's vanilla LoRA computes, ``W x + (B (A x)) s``, but
    calls the functional products directly instead of the submodules (a decoding step runs 7
    such layers in each of 30 layers, for one token a row, where the calls cost as much as the
    products) and adds the branch with one ``addmm`` (``_add_scaled_product``)."""

    def forward(self, x: torch.Tensor, *args: typing.Any, **kwargs: typing.Any) -> torch.Tensor:
        base = self.base_layer
        if (
            args
            or kwargs
            or type(base) is not torch.nn.Linear
            or self.disable_adapters
            or self.merged
            or self.lora_variant
        ):
            dtype = _base_linear(self).weight.dtype
            if self.disable_adapters or self.merged or kwargs.get("adapter_names") is not None:
                return super().forward(x.to(dtype), *args, **kwargs)
            result = to_float32(base(to_product_dtype(x, dtype), *args, **kwargs))
            branch = _lora_branch(self, x)
            return result if branch is None else result + branch
        weight = typing.cast(torch.Tensor, base.weight)
        product = torch.nn.functional.linear(to_product_dtype(x, weight.dtype), weight, base.bias)
        result = to_float32(product)
        for name in self.active_adapters:
            if name not in self.lora_A:
                continue
            lora_a = typing.cast(torch.nn.Linear, self.lora_A[name])
            lora_b = typing.cast(torch.nn.Linear, self.lora_B[name])
            dropout = self.lora_dropout[name]
            read = x.to(lora_a.weight.dtype)
            read = read if type(dropout) is torch.nn.Identity else dropout(read)
            down = torch.nn.functional.linear(read, lora_a.weight, lora_a.bias)
            result = _add_scaled_product(result, down, lora_b, self.scaling[name])
        return result


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
    return (to_product_dtype(args[0], weight.dtype), *args[1:])


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
