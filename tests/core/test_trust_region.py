"""Trust region: statistic, admission, quantile monitor and backtracking."""

from __future__ import annotations

import math

import numpy as np
import pytest

from teamtr.trust_region import (
    BacktrackResult,
    QuantileMonitor,
    TrustRegion,
    backtrack,
    per_agent_radii,
    weighted_quantile,
)


def test_mean_statistic_weighted() -> None:
    region = TrustRegion(radius=0.1)
    assert region.statistic_of([0.0, 0.2, 0.4]) == pytest.approx(0.2, abs=1e-15)
    # Weights are an occupancy; zero-weight states never count, even with infinite KL.
    assert region.statistic_of([0.1, 0.3, math.inf], [1.0, 3.0, 0.0]) == pytest.approx(
        0.25, abs=1e-15
    )


def test_quantile_statistic_matches_numpy_inverted_cdf() -> None:
    rng = np.random.default_rng(0)
    values = rng.exponential(size=101)
    region = TrustRegion(radius=1.0, statistic="quantile", quantile=0.9)
    assert region.statistic_of(values) == np.quantile(values, 0.9, method="inverted_cdf")
    # Weighted by hand: weights 1,1,2 on 1,2,3 -> CDF 0.25, 0.5, 1.0.
    assert weighted_quantile([3.0, 1.0, 2.0], 0.5, [2.0, 1.0, 1.0]) == 2.0
    assert weighted_quantile([3.0, 1.0, 2.0], 0.51, [2.0, 1.0, 1.0]) == 3.0


def test_admits_with_relative_tolerance() -> None:
    region = TrustRegion(radius=0.01, tolerance=1e-9)
    assert region.admits(0.01)
    assert region.admits(0.01 * (1 + 5e-10))
    assert not region.admits(0.01 * (1 + 2e-9))
    assert not region.admits(math.nan)
    assert not region.admits(math.inf)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"radius": 0.0}, "radius"),
        ({"radius": math.inf}, "radius"),
        ({"radius": 0.1, "statistic": "max"}, "statistic"),
        ({"radius": 0.1, "quantile": 0.0}, "quantile"),
        ({"radius": 0.1, "tolerance": -1.0}, "tolerance"),
    ],
)
def test_trust_region_validation(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TrustRegion(**kwargs)


def test_quantile_monitor_exact_and_bounded() -> None:
    rng = np.random.default_rng(1)
    batches = [rng.exponential(size=(4, 50)) for _ in range(5)]
    masks = [rng.random(size=(4, 50)) < 0.8 for _ in range(5)]
    monitor = QuantileMonitor(quantile=0.95)
    for b, m in zip(batches, masks, strict=True):
        monitor.update(b, m)
    kept = np.concatenate([b[m] for b, m in zip(batches, masks, strict=True)])
    assert monitor.count == kept.size
    assert monitor.value == np.quantile(kept, 0.95, method="inverted_cdf")
    bounded = QuantileMonitor(quantile=0.5, capacity=2000, seed=0)
    stream = rng.exponential(size=20_000)
    for chunk in np.split(stream, 20):
        bounded.update(chunk)
    assert bounded.count == stream.size
    # A uniform subsample of 2000: its median is within a few percent of log 2.
    assert bounded.value == pytest.approx(math.log(2.0), rel=0.08)
    bounded.reset()
    with pytest.raises(ValueError, match="no values"):
        _ = bounded.value


def test_backtrack_accepts_first_admitted_scale() -> None:
    region = TrustRegion(radius=0.01)
    tried: list[float] = []

    def propose(scale: float) -> float:
        tried.append(scale)
        return scale

    # KL grows like scale^2 / 2 * 0.64: scale 1 -> 0.32, 0.5 -> 0.08, 0.25 -> 0.02, 0.125 -> 0.005
    result = backtrack(propose, lambda s: 0.32 * s * s, region, shrink=0.5, max_backtracks=10)
    assert isinstance(result, BacktrackResult)
    assert result.accepted
    assert result.step_scale == 0.125
    assert result.candidate == 0.125
    assert result.backtracks == 3
    assert result.statistic == pytest.approx(0.005, rel=1e-15)
    assert tried == [1.0, 0.5, 0.25, 0.125]


def test_backtrack_accepts_without_shrinking_when_inside() -> None:
    result = backtrack(lambda s: s, lambda s: 0.001 * s, TrustRegion(radius=0.01))
    assert result.accepted and result.backtracks == 0 and result.step_scale == 1.0


def test_backtrack_rejects_and_keeps_nothing() -> None:
    region = TrustRegion(radius=0.01)
    # A candidate whose KL never shrinks (e.g. a broken optimiser step): must be rejected.
    result = backtrack(lambda s: {"scale": s}, lambda c: 1.0, region, max_backtracks=4)
    assert not result.accepted
    assert result.candidate is None
    assert result.step_scale == 0.0
    assert result.backtracks == 4
    assert result.statistic == 1.0
    nan_result = backtrack(lambda s: s, lambda c: math.nan, region, max_backtracks=2)
    assert not nan_result.accepted and nan_result.candidate is None


def test_backtrack_never_returns_a_candidate_outside() -> None:
    rng = np.random.default_rng(2)
    for _ in range(200):
        radius = float(rng.uniform(1e-3, 1.0))
        curvature = float(rng.uniform(0.0, 10.0))
        noise = rng.uniform(0.5, 1.5, size=20)
        calls = iter(noise)
        region = TrustRegion(radius=radius, tolerance=1e-9)
        result = backtrack(
            lambda s: s,
            lambda s, c=curvature, it=calls: c * s * s * next(it),  # type: ignore[misc]
            region,
            shrink=float(rng.uniform(0.1, 0.9)),
            max_backtracks=int(rng.integers(0, 8)),
        )
        if result.accepted:
            assert result.statistic <= radius * (1 + 1e-9)
            assert result.candidate == result.step_scale
        else:
            assert result.candidate is None


def test_backtrack_validation() -> None:
    region = TrustRegion(radius=0.1)
    with pytest.raises(ValueError, match="shrink"):
        backtrack(lambda s: s, lambda c: 0.0, region, shrink=1.0)
    with pytest.raises(ValueError, match="max_backtracks"):
        backtrack(lambda s: s, lambda c: 0.0, region, max_backtracks=-1)


def test_per_agent_radii() -> None:
    assert per_agent_radii(0.05, 3) == (0.05, 0.05, 0.05)
    assert per_agent_radii([0.1, 0.2], 2) == (0.1, 0.2)
    with pytest.raises(ValueError, match="one value per agent"):
        per_agent_radii([0.1, 0.2], 3)
    with pytest.raises(ValueError, match="agent 1"):
        per_agent_radii([0.1, -0.2], 2)
    with pytest.raises(ValueError, match="agent 0"):
        per_agent_radii(math.nan, 2)
    with pytest.raises(ValueError, match="n_agents"):
        per_agent_radii(0.1, 0)
