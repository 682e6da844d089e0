"""Stochastic rounding of float32 values onto a half-precision grid (torch only).

A float32 value v between two neighbouring half-precision values lo <= v <= hi is rounded to hi
with probability (v - lo) / (hi - lo) and to lo otherwise, so that E[round(v)] = v exactly: the
rounding is unbiased wherever v lies on the grid. Round-to-nearest is not: an output already on
the grid (a half-precision product's) plus a branch under half the grid's spacing rounds back to
the same output every time, and the branch is lost (``llm/models/half_precision_sum.py`` tells
the same of PEFT's sum, which vLLM's LoRA layers share).

The uniform each value is compared with is not drawn from a generator: it is a hash of the
value's own float32 bits and of its column (its output feature), a counter-based stream in the
manner of Philox and Random123 (Salmon et al., SC 2011) keyed by what is computed. A server's
global generator would hand a token the uniforms left over by whichever requests were batched
before it, so that the same request rounded differently from one batch to the next; the hash
makes a row's rounding a function of that row alone, whatever shares its batch or its position
in it. Across distinct values the hashed uniforms behave as independent draws (the hash mixes
every input bit into every output bit), so the rounding stays unbiased over the many values a
layer computes; the same value in the same column is rounded the same way each time it occurs.
"""

from __future__ import annotations

import torch

HALF_DTYPES = (torch.bfloat16, torch.float16)
WORD = 0xFFFFFFFF
COLUMN_STRIDE = 0x9E3779B9
"""2^32 / the golden ratio (Knuth's multiplicative hashing): columns far apart in the hash's
input, so that neighbouring features of an equal value draw unrelated uniforms."""
MIX_MULTIPLIERS = (0x7FEB352D, 0x846CA68B)
"""The multipliers of ``lowbias32``, a 32-bit integer finaliser (xor-shift, multiply,
xor-shift, multiply, xor-shift) whose every output bit depends on every input bit (C. Wellons,
"Hash Prospector")."""
UNIFORM_BITS = 24
"""The uniform's resolution: 2^-24, below float32's spacing in [0.5, 1), so that the chance of
rounding away, compared against it, is resolved to float32's own precision."""


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


def _times(words: torch.Tensor, constant: int) -> torch.Tensor:
    """``words * constant`` modulo 2^32 in int64, by 16-bit halves of the constant: no product
    exceeds 2^49, so nothing overflows (a signed overflow has no defined result)."""
    low, high = constant & 0xFFFF, constant >> 16
    return (words * low + (((words * high) & 0xFFFF) << 16)) & WORD


def _mix(words: torch.Tensor) -> torch.Tensor:
    first, second = MIX_MULTIPLIERS
    words = words ^ (words >> 16)
    words = _times(words, first)
    words = words ^ (words >> 15)
    words = _times(words, second)
    return words ^ (words >> 16)


def hashed_uniforms(values: torch.Tensor) -> torch.Tensor:
    """One number in [0, 1) per float32 value, a function of the value's bits and of its index
    along the last dimension (its column) alone, never of the other rows."""
    if values.dtype != torch.float32:
        raise ValueError(f"hashed uniforms of float32 values, got {values.dtype}")
    bits = values.contiguous().view(torch.int32).to(torch.int64) & WORD
    columns = torch.arange(values.shape[-1] if values.dim() else 1, device=values.device)
    words = _mix(bits ^ _times(columns.to(torch.int64) + 1, COLUMN_STRIDE))
    return (words >> (32 - UNIFORM_BITS)).to(torch.float32) * 2.0**-UNIFORM_BITS


def stochastic_round(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``values`` (float32) rounded to ``dtype``, up or down, unbiased; values already on the
    grid, infinities and NaN come back unchanged. Each value's draw is ``hashed_uniforms``:
    the same row rounds to the same bits in any batch."""
    nearest, other, chance = neighbours(values, dtype)
    return torch.where(hashed_uniforms(values) < chance, other, nearest)
