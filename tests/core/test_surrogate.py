"""Surrogates against hand computations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from teamtr.surrogate import clipped_surrogate, exact_surrogate, group_normalised_advantages


def test_group_advantages_by_hand() -> None:
    rewards = [1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0]
    adv = group_normalised_advantages(rewards, group_size=4, a_max=10.0, eps=0.0)
    # Group 1: mean 1/4, population std sqrt(3)/4.
    std = math.sqrt(3) / 4
    np.testing.assert_allclose(adv[:4], [0.75 / std] + [-0.25 / std] * 3, rtol=1e-14)
    # A constant group has no signal.
    np.testing.assert_array_equal(adv[4:], 0.0)


def test_group_advantages_eps_and_clip() -> None:
    adv = group_normalised_advantages([0.0, 1.0], group_size=2, a_max=0.9, eps=1e-6)
    # mean 1/2, std 1/2: +-0.5/(0.5 + 1e-6), then clipped to +-0.9.
    np.testing.assert_allclose(adv, [-0.9, 0.9], rtol=0)
    adv = group_normalised_advantages([0.0, 1.0], group_size=2, a_max=5.0, eps=1e-6)
    np.testing.assert_allclose(adv, [-0.5 / (0.5 + 1e-6), 0.5 / (0.5 + 1e-6)], rtol=1e-15)


@pytest.mark.parametrize(
    ("rewards", "group_size", "a_max", "match"),
    [
        ([1.0, 2.0], 1, 1.0, "group_size must be >= 2"),
        ([1.0, 2.0, 3.0], 2, 1.0, "not a multiple"),
        ([1.0, 2.0], 2, 0.0, "a_max"),
        ([1.0, math.nan], 2, 1.0, "finite"),
        ([[1.0, 2.0]], 2, 1.0, "one-dimensional"),
    ],
)
def test_group_advantages_validation(rewards, group_size, a_max, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=match):
        group_normalised_advantages(rewards, group_size, a_max)


def test_clipped_surrogate_by_hand() -> None:
    logp_old = np.log(np.array([[0.5, 0.5, 0.5], [0.4, 0.4, 0.4]]))
    # Ratios: row 0 -> 1.5, 0.8, 1.0 ; row 1 -> 0.5, 1.1, (padding).
    logp_new = np.log(np.array([[0.75, 0.4, 0.5], [0.2, 0.44, 1.0]]))
    mask = np.array([[1, 1, 1], [1, 1, 0]])
    advantages = np.array([2.0, -1.0])
    eps = 0.2
    # Row 0 (A=+2): min(rA, clip(r)A) = min(3.0, 2.4), min(1.6, 1.6), 2.0.
    # Row 1 (A=-1): min(-0.5, -0.8) = -0.8, min(-1.1, -1.1) = -1.1.
    by_hand = (2.4 + 1.6 + 2.0 - 0.8 - 1.1) / 5
    assert clipped_surrogate(logp_new, logp_old, advantages, mask, eps) == pytest.approx(
        by_hand, rel=1e-14
    )
    # Per-token advantages give the same when they repeat the per-sequence ones.
    per_token = np.repeat(advantages[:, None], 3, axis=1)
    assert clipped_surrogate(logp_new, logp_old, per_token, mask, eps) == pytest.approx(
        by_hand, rel=1e-14
    )


def test_clipped_surrogate_at_old_policy_is_mean_advantage() -> None:
    logp = np.log(np.full((2, 3), 0.3))
    logp_pad = logp.copy()
    logp_pad[1, 2] = -np.inf  # padding must not produce nan
    mask = np.array([[1, 1, 1], [1, 1, 0]], dtype=bool)
    value = clipped_surrogate(logp_pad, logp, np.array([1.0, 4.0]), mask, 0.1)
    assert value == pytest.approx((3 * 1.0 + 2 * 4.0) / 5, rel=1e-15)


def test_clipped_surrogate_validation() -> None:
    z = np.zeros((2, 3))
    with pytest.raises(ValueError, match="no tokens"):
        clipped_surrogate(z, z, np.ones(2), np.zeros((2, 3)), 0.2)
    with pytest.raises(ValueError, match="advantages"):
        clipped_surrogate(z, z, np.ones(3), np.ones((2, 3)), 0.2)
    with pytest.raises(ValueError, match="clip_eps"):
        clipped_surrogate(z, z, np.ones(2), np.ones((2, 3)), 0.0)


def test_exact_surrogate_by_hand() -> None:
    pi = np.array([[0.2, 0.8], [1.0, 0.0]])
    adv = np.array([[1.0, -0.5], [0.3, 7.0]])
    d = np.array([0.6, 0.4])
    # 0.6 * (0.2 - 0.4) + 0.4 * 0.3 = -0.12 + 0.12 = 0; scale irrelevant -> use another d.
    assert exact_surrogate(pi, adv, d, scale=10.0) == pytest.approx(0.0, abs=1e-15)
    d2 = np.array([0.5, 0.5])
    assert exact_surrogate(pi, adv, d2, scale=4.0) == pytest.approx(4.0 * (-0.1 + 0.15), rel=1e-14)
    with pytest.raises(ValueError, match="occupancy"):
        exact_surrogate(pi, adv, np.ones(3) / 3, 1.0)
