"""Stochastic rounding of float32 values onto a half-precision grid (torch only).

A float32 value v between two neighbouring half-precision values lo <= v <= hi is rounded to hi
with probability (v - lo) / (hi - lo) and to lo otherwise, so that E[round(v)] = v exactly: the
rounding is unbiased wherever v lies on the grid. Round-to-nearest is not: an output already on
the grid (a half-precision product's) plus a branch under half the grid's spacing rounds back to
the same output every time, and the branch is lost (``llm/models/lora_sum.py`` tells the same of
PEFT's sum, which vLLM's LoRA layers share).
"""

from __future__ import annotations

import torch

HALF_DTYPES = (torch.bfloat16, torch.float16)


def neighbours(values: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """(nearest, other, chance): each float32 value's nearest ``dtype`` value, its neighbour on
    the other side of the value, and the probability that makes the expectation exact,
    |v - nearest| / |other - nearest| (at most 1/2; 0 for a value on the grid)."""
    if dtype not in HALF_DTYPES:
        raise ValueError(f"stochastic rounding onto {dtype}: only {HALF_DTYPES}")
    nearest = values.to(dtype)
    error = values - nearest.float()  # exact in float32: a half-precision grid is coarser
    toward = torch.where(error > 0, torch.full_like(nearest, float("inf")), nearest)
    toward = torch.where(error < 0, torch.full_like(nearest, float("-inf")), toward)
    other = torch.nextafter(nearest, toward)
    step = (other.float() - nearest.float()).abs()
    chance = torch.where(step > 0, error.abs() / step, torch.zeros_like(step))
    return nearest, other, chance


def stochastic_round(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``values`` (float32) rounded to ``dtype``, up or down, unbiased; values already on the
    grid, infinities and NaN come back unchanged."""
    nearest, other, chance = neighbours(values, dtype)
    return torch.where(torch.rand_like(chance) < chance, other, nearest)
