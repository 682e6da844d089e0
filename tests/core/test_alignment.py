"""Stage-0 alignment: the closed form against a generic constrained optimiser and KKT."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize

from teamtr.alignment import stage0_projection
from teamtr.divergence import kl


def _slsqp_projection(pre: np.ndarray, cur: np.ndarray, delta0: float) -> np.ndarray:
    """min KL(pi || pre) s.t. KL(pi || cur) <= delta0 on the simplex, by SLSQP (generic)."""
    floor = 1e-12

    def kl_to(x: np.ndarray, ref: np.ndarray) -> float:
        x = np.maximum(x, floor)
        return float(np.sum(x * np.log(x / ref)))

    def kl_grad(x: np.ndarray, ref: np.ndarray) -> np.ndarray:
        return np.log(np.maximum(x, floor) / ref) + 1.0

    constraints = [
        {"type": "eq", "fun": lambda x: np.sum(x) - 1.0, "jac": lambda x: np.ones_like(x)},
        {
            "type": "ineq",
            "fun": lambda x: delta0 - kl_to(x, cur),
            "jac": lambda x: -kl_grad(x, cur),
        },
    ]
    result = minimize(
        lambda x: kl_to(x, pre),
        0.5 * (pre + cur),
        jac=lambda x: kl_grad(x, pre),
        method="SLSQP",
        bounds=[(floor, 1.0)] * pre.size,
        constraints=constraints,
        options={"ftol": 1e-12, "maxiter": 1000},
    )
    # Status 8 ("positive directional derivative") is SLSQP stalling at float precision near
    # the optimum; accept it only with a feasible point, which the comparison then judges.
    assert result.success or result.status == 8, result.message
    assert abs(np.sum(result.x) - 1.0) < 1e-9 and kl_to(result.x, cur) <= delta0 + 1e-9
    return np.asarray(result.x)


@pytest.mark.parametrize("seed", range(8))
def test_closed_form_matches_slsqp(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n_states, n_actions = 3, int(rng.integers(2, 6))
    pre = rng.dirichlet(np.ones(n_actions), size=n_states)
    cur = rng.dirichlet(np.ones(n_actions), size=n_states)
    delta0 = float(rng.uniform(0.2, 0.8)) * float(kl(pre, cur).min())  # active in every state
    policy, lam = stage0_projection(pre, cur, delta0)
    for s in range(n_states):
        reference = _slsqp_projection(pre[s], cur[s], delta0)
        np.testing.assert_allclose(policy[s], reference, atol=2e-5)
        # The closed form is at least as good as the optimiser's answer and feasible.
        assert kl(policy[s], pre[s]) <= kl(reference, pre[s]) + 1e-9
    assert np.all(lam > 0)


def test_constraint_active_to_relative_tolerance() -> None:
    rng = np.random.default_rng(10)
    pre = rng.dirichlet(np.full(6, 0.5), size=50)
    cur = rng.dirichlet(np.full(6, 0.5), size=50)
    delta0 = 0.02
    policy, lam = stage0_projection(pre, cur, delta0)
    divergence = kl(policy, cur)
    active = kl(pre, cur) > delta0
    assert active.sum() > 10
    assert np.all(divergence[active] <= delta0)
    assert np.all(divergence[active] >= delta0 * (1 - 1e-9))
    np.testing.assert_allclose(policy.sum(axis=1), 1.0, rtol=1e-14)
    # Inactive states keep pi_pre with lambda = 0.
    np.testing.assert_array_equal(policy[~active], pre[~active])
    np.testing.assert_array_equal(lam[~active], 0.0)


def test_kkt_form_reproduced_from_lambda() -> None:
    rng = np.random.default_rng(11)
    pre = rng.dirichlet(np.ones(4), size=5)
    cur = rng.dirichlet(np.ones(4), size=5)
    policy, lam = stage0_projection(pre, cur, 0.01)
    beta = 1 / (1 + lam)
    tilted = pre ** beta[:, None] * cur ** (1 - beta)[:, None]
    np.testing.assert_allclose(policy, tilted / tilted.sum(axis=1, keepdims=True), rtol=1e-12)
    # Stationarity: (1+lam) log pi - log pre - lam log cur is constant across actions.
    residual = (1 + lam)[:, None] * np.log(policy) - np.log(pre) - lam[:, None] * np.log(cur)
    np.testing.assert_allclose(residual - residual[:, :1], 0.0, atol=1e-10)


def test_vectorised_over_leading_axes_and_per_state_radius() -> None:
    rng = np.random.default_rng(12)
    pre = rng.dirichlet(np.ones(3), size=(2, 4))
    cur = rng.dirichlet(np.ones(3), size=(2, 4))
    radius = rng.uniform(0.001, 0.01, size=(2, 4))
    policy, lam = stage0_projection(pre, cur, radius)
    assert policy.shape == pre.shape and lam.shape == (2, 4)
    flat_policy, flat_lam = stage0_projection(pre.reshape(8, 3), cur.reshape(8, 3), radius.ravel())
    np.testing.assert_array_equal(policy.reshape(8, 3), flat_policy)
    assert np.all(kl(policy, cur) <= radius)


def test_supports() -> None:
    # pi_pre puts mass where pi_cur has none: the projection must remove it.
    pre = np.array([[0.5, 0.3, 0.2]])
    cur = np.array([[0.6, 0.4, 0.0]])
    policy, lam = stage0_projection(pre, cur, 0.05)
    assert policy[0, 2] == 0.0
    # On supp(pi_cur) the best is pi_pre restricted and renormalised; its KL to pi_cur
    # (about 0.0013) is inside the radius, so the optimum is the limit lambda -> 0+.
    np.testing.assert_allclose(policy[0], [0.625, 0.375, 0.0], atol=1e-12)
    assert kl(policy, cur)[0] < 0.05
    assert 0.0 <= lam[0] < 1e-12
    # A tighter radius that binds on the common support is met to 1e-9 relative.
    policy, lam = stage0_projection(pre, cur, 0.001)
    assert policy[0, 2] == 0.0
    assert kl(policy, cur)[0] == pytest.approx(0.001, rel=1e-9)
    assert kl(policy, cur)[0] <= 0.001
    # Nothing supported inside supp(pi_pre) is close enough to pi_cur: infeasible.
    with pytest.raises(ValueError, match="state 0"):
        stage0_projection(np.array([[1.0, 0.0]]), np.array([[0.1, 0.9]]), 0.05)
    with pytest.raises(ValueError, match="delta0"):
        stage0_projection(pre, cur, 0.0)
    with pytest.raises(ValueError, match="sum to 1"):
        stage0_projection(np.array([[0.5, 0.6]]), np.array([[0.5, 0.5]]), 0.1)
