"""Bounds of THEORY.md §2: hand computations, monotonicity, and exact tabular checks.

The tabular checks solve small random MDPs here with dense linear algebra (independent of
``sim/``) and assert every inequality on every instance.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from teamtr.bounds import (
    advantage_bound_sup,
    average_occupancy_shift_bound,
    certificate_proxy,
    episodic_performance_difference_rhs,
    episodic_update_lower_bound,
    estimation_bias_term,
    hoeffding_term,
    horizon_constant,
    intermediate_penalty_sum,
    kl_penalty_coefficient,
    marginal_shift_bounds,
    occupancy_shift_bound,
    occupancy_shift_bound_sup,
    performance_difference_rhs,
    stale_penalty_sum,
    theorem_3_4_lower_bound,
    theorem_3_6_stage_bound,
    theorem_3_7_drift_bound,
)
from teamtr.divergence import expected, kl, tv
from teamtr.penalty import DiscountedPenalty, EpisodicPenalty
from teamtr.surrogate import exact_surrogate
from teamtr.turns import intermediate_tables

# --- hand computations ----------------------------------------------------------------------


def test_occupancy_shift_by_hand() -> None:
    assert occupancy_shift_bound(0.9, 0.01) == pytest.approx(2 * 0.9 / 0.1 * 0.01, rel=1e-14)
    assert occupancy_shift_bound_sup(0.5, 0.2) == pytest.approx(0.4, rel=1e-14)
    assert occupancy_shift_bound(0.0, 0.3) == 0.0


def test_marginal_shift_by_hand() -> None:
    np.testing.assert_allclose(marginal_shift_bounds([0.1, 0.2, 0.05]), [0.0, 0.2, 0.6], rtol=1e-14)
    assert average_occupancy_shift_bound(4, 0.1) == pytest.approx(0.6, rel=1e-14)


def test_theorem_3_4_by_hand() -> None:
    model = DiscountedPenalty(gamma=0.9)
    # TV form: L - 2 gamma eps/(1-gamma)^2 E[TV] = 1 - 2*0.9*0.5/0.01*0.001 = 1 - 0.09.
    assert theorem_3_4_lower_bound(1.0, 0.5, model, mean_tv=0.001) == pytest.approx(0.91, rel=1e-13)
    # KL form: L - sqrt(2) gamma eps/(1-gamma)^2 sqrt(delta).
    delta = 1e-4
    expected_kl_form = 1.0 - math.sqrt(2) * 0.9 * 0.5 / 0.01 * math.sqrt(delta)
    assert theorem_3_4_lower_bound(1.0, 0.5, model, mean_kl=delta) == pytest.approx(
        expected_kl_form, rel=1e-13
    )
    both = theorem_3_4_lower_bound(1.0, 0.5, model, mean_tv=0.001, mean_kl=delta)
    assert both == pytest.approx(max(0.91, expected_kl_form), rel=1e-13)
    with pytest.raises(ValueError, match="mean_tv, mean_kl"):
        theorem_3_4_lower_bound(1.0, 0.5, model)


def test_kl_penalty_coefficient_matches_theorem_3_6_constant() -> None:
    gamma, eps = 0.8, 0.3
    assert kl_penalty_coefficient(eps, DiscountedPenalty(gamma)) == pytest.approx(
        math.sqrt(2) * gamma * eps / (1 - gamma) ** 2, rel=1e-14
    )
    assert kl_penalty_coefficient(eps, EpisodicPenalty(5)) == pytest.approx(
        math.sqrt(2) * 4 * 5 * eps, rel=1e-14
    )


def test_theorem_3_6_by_hand() -> None:
    model = DiscountedPenalty(gamma=0.5)
    c = kl_penalty_coefficient(1.0, model)  # sqrt(2) * 0.5 / 0.25 = 2 sqrt(2)
    value = theorem_3_6_stage_bound([0.3, 0.2], [1.0, 1.0], [0.01, 0.04], model)
    assert value == pytest.approx(0.5 - c * (0.1 + 0.2), rel=1e-13)
    # Shared scalars broadcast.
    assert theorem_3_6_stage_bound([0.3, 0.2], 1.0, [0.01, 0.04], model) == value
    with pytest.raises(ValueError, match="kls"):
        theorem_3_6_stage_bound([0.3, 0.2], 1.0, [0.01], model)


def test_theorem_3_7_drift_and_penalty_sums_by_hand() -> None:
    gamma = 0.9
    assert theorem_3_7_drift_bound(gamma, [0.02, 0.08]) == pytest.approx(
        18 * (0.1 + 0.2), rel=1e-13
    )
    assert theorem_3_7_drift_bound(gamma, []) == 0.0
    assert theorem_3_7_drift_bound(0.0, [0.02], horizon=3) == pytest.approx(4 * 0.1, rel=1e-13)
    radii = [0.01, 0.04, 0.09]
    # sqrt: 0.1, 0.2, 0.3 -> cumulative 0.1, 0.3, 0.6.
    assert stale_penalty_sum([1.0, 2.0, 3.0], radii) == pytest.approx(0.1 + 0.6 + 1.8, rel=1e-13)
    assert intermediate_penalty_sum([1.0, 2.0, 3.0], radii) == pytest.approx(
        0.1 + 0.4 + 0.9, rel=1e-13
    )


def test_penalty_sums_grow_like_n_squared_versus_n() -> None:
    ns = np.array([2, 4, 8, 16])
    stale = [stale_penalty_sum(1.0, [0.01] * n) for n in ns]
    inter = [intermediate_penalty_sum(1.0, [0.01] * n) for n in ns]
    # Exactly n(n+1)/2 * 0.1 and n * 0.1.
    np.testing.assert_allclose(stale, ns * (ns + 1) / 2 * 0.1, rtol=1e-13)
    np.testing.assert_allclose(inter, ns * 0.1, rtol=1e-13)
    slope = np.polyfit(np.log(ns), np.log(stale), 1)[0]
    assert 1.7 < slope < 2.0


def test_hoeffding_term_uses_the_full_range() -> None:
    assert hoeffding_term(1.0, 100, 0.05) == pytest.approx(
        2 * math.sqrt(math.log(40) / 200), rel=1e-14
    )
    # Monte-Carlo sanity: Rademacher-like +-B samples, the bound covers >= 1 - eta of means.
    rng = np.random.default_rng(0)
    means = rng.choice([-1.0, 1.0], size=(2000, 50)).mean(axis=1)
    assert np.mean(np.abs(means) <= hoeffding_term(1.0, 50, 0.1)) >= 0.9
    with pytest.raises(ValueError, match="eta"):
        hoeffding_term(1.0, 10, 1.0)


def test_horizon_constant_and_certificate_proxy() -> None:
    assert horizon_constant(0.5, 4) == pytest.approx(2 * 0.5 * 4 * 3, rel=1e-15)
    c = horizon_constant(0.5, 4)
    penalty = EpisodicPenalty(4)
    assert c * math.sqrt(0.02 / 2) == pytest.approx(penalty.kl_penalty(0.5, 0.02), rel=1e-14)
    value = certificate_proxy([0.4, 0.1], [0.02, 0.0], c)
    assert value == pytest.approx(0.5 - c * 0.1, rel=1e-14)
    # With exact inputs and c = horizon constant, the proxy is the Thm 3.6 bound.
    assert value == pytest.approx(
        theorem_3_6_stage_bound([0.4, 0.1], 0.5, [0.02, 0.0], penalty), rel=1e-14
    )
    assert horizon_constant(1.0, 1) == 0.0
    with pytest.raises(ValueError, match="kls"):
        certificate_proxy([0.1], [math.nan], 1.0)
    # A negative KL estimate (possible with k1) is charged as 0, never as a bonus.
    assert certificate_proxy([0.1], [-0.1], 1.0) == pytest.approx(0.1, rel=1e-15)


def test_small_helpers() -> None:
    assert advantage_bound_sup(1.0, 0.5) == pytest.approx(4.0, rel=1e-15)
    assert estimation_bias_term(0.1, 0.9) == pytest.approx(1.0, rel=1e-13)
    with pytest.raises(ValueError, match="gamma"):
        occupancy_shift_bound(1.0, 0.1)


def test_bounds_monotone() -> None:
    model = DiscountedPenalty(gamma=0.7)
    kls = np.linspace(0.0, 0.5, 20)
    lower = [theorem_3_4_lower_bound(1.0, 0.4, model, mean_kl=k) for k in kls]
    assert np.all(np.diff(lower) < 0)
    eps = np.linspace(0.0, 2.0, 20)
    lower_eps = [theorem_3_4_lower_bound(1.0, e, model, mean_tv=0.05) for e in eps]
    assert np.all(np.diff(lower_eps) < 0)
    gammas = np.linspace(0.0, 0.99, 20)
    shifts = [occupancy_shift_bound(g, 0.1) for g in gammas]
    assert np.all(np.diff(shifts) > 0)
    drift = [theorem_3_7_drift_bound(0.9, [0.01] * n) for n in range(6)]
    assert np.all(np.diff(drift) > 0)


# --- exact tabular checks -------------------------------------------------------------------


def _random_mdp(rng: np.random.Generator, n_states: int, n_actions: int):  # type: ignore[no-untyped-def]
    P = rng.dirichlet(np.full(n_states, 0.5), size=(n_states, n_actions))
    R = rng.uniform(-1.0, 1.0, size=(n_states, n_actions))
    rho0 = rng.dirichlet(np.ones(n_states))
    return P, R, rho0


def _evaluate(P, R, rho0, gamma, pi):  # type: ignore[no-untyped-def]
    n = P.shape[0]
    P_pi = np.einsum("sa,sat->st", pi, P)
    r_pi = np.sum(pi * R, axis=1)
    V = np.linalg.solve(np.eye(n) - gamma * P_pi, r_pi)
    Q = R + gamma * P @ V
    d = (1 - gamma) * np.linalg.solve((np.eye(n) - gamma * P_pi).T, rho0)
    return float(rho0 @ V), Q - V[:, None], d


def _tilted(rng: np.random.Generator, pi: np.ndarray, scale: float) -> np.ndarray:
    logits = np.log(pi) + scale * rng.normal(size=pi.shape)
    out = np.exp(logits - logits.max(axis=1, keepdims=True))
    return out / out.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("seed", range(20))
def test_discounted_theorems_on_random_turn_taking_mdps(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n_states, n_actions, n_agents = 8, 3, 3
    gamma = float(rng.uniform(0.3, 0.95))
    P, R, rho0 = _random_mdp(rng, n_states, n_actions)
    agent_of_state = rng.integers(0, n_agents, size=n_states)
    start = rng.dirichlet(np.ones(n_actions), size=n_states)
    targets = [_tilted(rng, start, float(rng.uniform(0.05, 1.0))) for _ in range(n_agents)]
    order = list(rng.permutation(n_agents))
    teams = intermediate_tables(start, targets, order, agent_of_state)
    model = DiscountedPenalty(gamma)

    evals = [_evaluate(P, R, rho0, gamma, t) for t in teams]
    surrogates, eps, kls, tvs = [], [], [], []
    for i in range(1, len(teams)):
        (j_prev, adv_prev, d_prev), (j_new, _, d_new) = evals[i - 1], evals[i]
        new = teams[i]
        # Performance difference identity, exact.
        assert j_new - j_prev == pytest.approx(
            performance_difference_rhs(new, adv_prev, d_new, gamma), abs=1e-10
        )
        mean_tv = expected(tv(new, teams[i - 1]), d_prev)
        mean_kl = expected(kl(new, teams[i - 1]), d_prev)
        # Occupancy shift, expectation and sup forms.
        shift = float(np.abs(d_new - d_prev).sum())
        assert shift <= occupancy_shift_bound(gamma, mean_tv) + 1e-12
        assert shift <= occupancy_shift_bound_sup(gamma, float(tv(new, teams[i - 1]).max())) + 1e-12
        l_i = exact_surrogate(new, adv_prev, d_prev, 1 / (1 - gamma))
        eps_i = float(np.max(np.abs(np.sum(new * adv_prev, axis=1))))
        # Theorem 3.4, TV and KL forms.
        assert j_new - j_prev >= theorem_3_4_lower_bound(l_i, eps_i, model, mean_tv=mean_tv) - 1e-12
        assert j_new - j_prev >= theorem_3_4_lower_bound(l_i, eps_i, model, mean_kl=mean_kl) - 1e-12
        surrogates.append(l_i)
        eps.append(eps_i)
        kls.append(mean_kl)
        tvs.append(mean_tv)
        # Theorem 3.7 drift, with each KL measured under the occupancy its update started from.
        drift = float(np.abs(d_prev - evals[0][2]).sum())
        assert drift <= theorem_3_7_drift_bound(gamma, kls[:-1]) + 1e-12
    # Theorem 3.6: the stage telescopes.
    gain = evals[-1][0] - evals[0][0]
    assert gain >= theorem_3_6_stage_bound(surrogates, eps, kls, model) - 1e-12
    assert gain >= theorem_3_6_stage_bound(surrogates, eps, kls, model, mean_tvs=tvs) - 1e-12


def _evaluate_episodic(P, R, rho0, horizon, pi):  # type: ignore[no-untyped-def]
    n = P.shape[0]
    P_pi = np.einsum("sa,sat->st", pi, P)
    V_next = np.zeros(n)
    advantages = np.zeros((horizon,) + R.shape)
    V0 = V_next
    for t in reversed(range(horizon)):
        Q = R + P @ V_next
        V = np.sum(pi * Q, axis=1)
        advantages[t] = Q - V[:, None]
        V_next = V
        V0 = V
    rho = np.zeros((horizon, n))
    rho[0] = rho0
    for t in range(1, horizon):
        rho[t] = rho[t - 1] @ P_pi
    return float(rho0 @ V0), advantages, rho


@pytest.mark.parametrize("seed", range(20))
def test_episodic_theorems_on_random_mdps(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    n_states, n_actions = 6, 3
    horizon = int(rng.integers(1, 7))
    P, R, rho0 = _random_mdp(rng, n_states, n_actions)
    pi = rng.dirichlet(np.ones(n_actions), size=n_states)
    new = _tilted(rng, pi, float(rng.uniform(0.05, 1.0)))
    j_old, adv, rho = _evaluate_episodic(P, R, rho0, horizon, pi)
    j_new, _, rho_new = _evaluate_episodic(P, R, rho0, horizon, new)
    assert j_new - j_old == pytest.approx(
        episodic_performance_difference_rhs(new, adv, rho_new), abs=1e-10
    )
    tv_states = tv(new, pi)
    tv_per_step = rho @ tv_states
    shifts = np.abs(rho_new - rho).sum(axis=1)
    assert np.all(shifts <= marginal_shift_bounds(tv_per_step) + 1e-12)
    d_avg, d_avg_new = rho.mean(axis=0), rho_new.mean(axis=0)
    mean_tv = expected(tv_states, d_avg)
    mean_kl = expected(kl(new, pi), d_avg)
    assert (
        np.abs(d_avg_new - d_avg).sum() <= average_occupancy_shift_bound(horizon, mean_tv) + 1e-12
    )
    surrogate = float(np.sum(rho * np.sum(new * adv, axis=2)))
    eps = float(np.max(np.abs(np.sum(new * adv, axis=2))))
    gain = j_new - j_old
    model = EpisodicPenalty(horizon)
    per_step = episodic_update_lower_bound(surrogate, eps, tv_per_step)
    assert gain >= per_step - 1e-12
    # The per-step form is tighter than the EpisodicPenalty constant, which is still valid.
    tv_form = theorem_3_4_lower_bound(surrogate, eps, model, mean_tv=mean_tv)
    assert per_step >= tv_form - 1e-12
    assert gain >= tv_form - 1e-12
    assert gain >= theorem_3_4_lower_bound(surrogate, eps, model, mean_kl=mean_kl) - 1e-12
    assert gain >= certificate_proxy([surrogate], [mean_kl], horizon_constant(eps, horizon)) - 1e-12
