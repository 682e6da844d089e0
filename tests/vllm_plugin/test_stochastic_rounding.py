"""The vLLM plugin's rounding (``vllm_plugin/teamtr_vllm_plugin/rounding.py``), exactly where
exact math applies and against its exact expectation where it samples."""

from __future__ import annotations

import math

import pytest
import torch
from teamtr_vllm_plugin.rounding import neighbours, stochastic_round

HALVES = [torch.bfloat16, torch.float16]
SIGNIFICAND_BITS = {torch.bfloat16: 8, torch.float16: 11}


def grid_neighbours(value: float, dtype: torch.dtype) -> tuple[float, float]:
    """The two grid points around ``value`` from the format's definition (a normal number's
    spacing is 2^(exponent - bits + 1)), independently of torch's rounding."""
    exponent = math.floor(math.log2(abs(value)))
    spacing = 2.0 ** (exponent - SIGNIFICAND_BITS[dtype] + 1)
    low = math.floor(value / spacing) * spacing
    return low, low + spacing


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_the_chance_of_rounding_up_is_the_exact_position_between_the_neighbours(dtype):
    generator = torch.Generator().manual_seed(0)
    values = (torch.rand(2000, generator=generator) * 8 - 4).float()
    values = values[values.abs() > 1e-3]  # normal numbers of both formats
    nearest, other, chance = neighbours(values, dtype)
    for v, n, o, c in zip(
        values.tolist(),
        nearest.float().tolist(),
        other.float().tolist(),
        chance.tolist(),
        strict=True,
    ):
        low, high = grid_neighbours(v, dtype)
        if v == low:  # on the grid: it stays, always
            assert (n, c) == (v, 0.0)
            continue
        assert {n, o} == {low, high}
        up = (v - low) / (high - low)  # P(high) that makes E[round(v)] = v
        assert (c if o == high else 1 - c) == pytest.approx(up, abs=1e-9)


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_rounding_is_unbiased_within_its_sampling_error(dtype):
    # A branch far under the grid's spacing on top of on-grid outputs: what vLLM's sum loses.
    torch.manual_seed(1)
    outputs = torch.randn(64).to(dtype).float()
    branch = 0.05 * (outputs.abs() * 2.0 ** -SIGNIFICAND_BITS[dtype])
    wanted = outputs + branch
    draws = torch.stack([stochastic_round(wanted, dtype).float() for _ in range(4000)])
    _, _, chance = neighbours(wanted, dtype)
    step = (neighbours(wanted, dtype)[1].float() - outputs).abs()
    # Each draw is a Bernoulli(chance) step: the mean's standard error is step sqrt(p(1-p)/N).
    standard_error = step * torch.sqrt(chance * (1 - chance) / draws.shape[0])
    error = (draws.mean(0) - wanted).abs()
    assert bool((error <= 5 * standard_error + 1e-12).all())
    # Round-to-nearest gives the outputs back: the branch is gone.
    assert torch.equal(wanted.to(dtype).float(), outputs)


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_values_on_the_grid_and_non_finite_values_come_back_unchanged(dtype):
    on_grid = torch.tensor([0.0, -0.0, 1.0, -3.5, 1024.0, float("inf"), float("-inf")])
    on_grid = on_grid.to(dtype).float()
    for _ in range(20):
        assert torch.equal(stochastic_round(on_grid, dtype).float(), on_grid)
    assert torch.isnan(stochastic_round(torch.tensor([float("nan")]), dtype)).all()


def test_only_half_precision_is_a_target():
    with pytest.raises(ValueError, match="only"):
        stochastic_round(torch.ones(3), torch.float32)
