"""The vLLM plugin's rounding (``vllm_plugin/teamtr_vllm_plugin/rounding.py``), exactly where
exact math applies and against its exact expectation where it samples; its draws hashed from
what each row computes, so that a row rounds the same in any batch."""

from __future__ import annotations

import math

import pytest
import torch
from teamtr_vllm_plugin.rounding import hashed_uniforms, neighbours, stochastic_round

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


def branch_on_grid_outputs(dtype: torch.dtype, rows: int, columns: int, seed: int):
    """On-grid outputs (a half-precision product's) plus a branch far under the grid's spacing
    (what vLLM's sum loses), as float32: (outputs, outputs + branch)."""
    generator = torch.Generator().manual_seed(seed)
    outputs = torch.randn(rows, columns, generator=generator).to(dtype).float()
    fraction = torch.rand(rows, columns, generator=generator) * 0.1
    branch = fraction * outputs.abs() * 2.0 ** -SIGNIFICAND_BITS[dtype]
    return outputs, outputs + branch


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_rounding_is_unbiased_over_distinct_values_within_its_sampling_error(dtype):
    """Each value's draw is a hash of it, so the expectation is over many distinct values: the
    count rounded away from the nearest matches the sum of their exact chances, within the
    binomial standard error sqrt(sum p (1 - p)) (5 of them: a false alarm once in ~3.5
    million), and the branch's total survives where round-to-nearest drops all of it."""
    outputs, wanted = branch_on_grid_outputs(dtype, 400, 128, seed=1)
    nearest, other, chance = neighbours(wanted, dtype)
    rounded = stochastic_round(wanted, dtype)
    away = (rounded != nearest).double()
    assert bool(((rounded == nearest) | (rounded == other)).all())
    p = chance.double()
    standard_error = math.sqrt(float((p * (1 - p)).sum()))
    assert abs(float(away.sum() - p.sum())) <= 5 * standard_error
    kept = float((rounded.double() - outputs.double()).sum() / (wanted - outputs).double().sum())
    assert kept == pytest.approx(1.0, abs=5 * standard_error / float(p.sum()))
    assert torch.equal(wanted.to(dtype).float(), outputs)  # round-to-nearest keeps none


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_a_row_rounds_to_the_same_bits_in_any_batch(dtype):
    """What a server's batch holds beside a request, and where, never changes the request's
    rounding: rows rounded alone and inside another batch (other rows around them, in another
    order) give the same bits; a global generator's draws would not."""
    _, rows = branch_on_grid_outputs(dtype, 6, 256, seed=2)
    _, others = branch_on_grid_outputs(dtype, 9, 256, seed=3)
    alone = stochastic_round(rows, dtype)
    order = [4, 0, 5, 2, 1, 3]
    batch = torch.cat([others[:5], rows[order], others[5:]])
    inside = stochastic_round(batch, dtype)[5 : 5 + len(order)]
    assert torch.equal(inside.view(torch.int16), alone[order].view(torch.int16))
    # Not a rounding that ignores the draw: some values went each way.
    nearest, _, _ = neighbours(rows, dtype)
    assert 0 < int((alone != nearest).sum()) < int((neighbours(rows, dtype)[2] > 0).sum())


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_one_value_in_many_columns_rounds_each_way_by_its_chance(dtype):
    """The column is part of the hash: a value repeated across a row's features (equal bits)
    rounds away from the nearest in a share of them near its chance, not in all or none."""
    value = torch.tensor(1.0 + 0.25 * 2.0 ** -(SIGNIFICAND_BITS[dtype] - 1))  # exact
    row = value.repeat(1, 20000)
    _, _, chance = neighbours(row, dtype)
    p = float(chance[0, 0])
    away = float((stochastic_round(row, dtype) != row.to(dtype)).double().mean())
    assert p == 0.25
    assert abs(away - p) <= 5 * math.sqrt(p * (1 - p) / row.shape[1])


def test_the_hashed_uniforms_are_uniform_and_keyed_by_value_and_column():
    """The draws' distribution: their mean and variance those of U[0, 1) within 5 standard
    errors (Var of the mean 1/(12 N); of the sample variance (1/80 - 1/144) / N), and a value
    one unit in the last place away draws an unrelated uniform (correlation within 5 / sqrt(N))."""
    generator = torch.Generator().manual_seed(4)
    values = torch.randn(500, 64, generator=generator)
    uniforms = hashed_uniforms(values).double().flatten()
    n = uniforms.numel()
    assert bool(((uniforms >= 0) & (uniforms < 1)).all())
    assert abs(float(uniforms.mean()) - 0.5) <= 5 * math.sqrt(1 / (12 * n))
    assert abs(float(uniforms.var()) - 1 / 12) <= 5 * math.sqrt((1 / 80 - 1 / 144) / n)
    next_up = (values.view(torch.int32) + 1).view(torch.float32)
    neighbour = hashed_uniforms(next_up).double().flatten()
    correlation = float(torch.corrcoef(torch.stack([uniforms, neighbour]))[0, 1])
    assert abs(correlation) <= 5 / math.sqrt(n)
    assert torch.equal(hashed_uniforms(values), hashed_uniforms(values.clone()))


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
