"""sim.agent_alignment: the Stage-0 projection of a replacement agent on exact tabular teams.

The closed form (THEORY.md §2, last part) is checked against a generic optimiser that solves
the full problem, E_{d_cur}-weighted objective over all of agent k's states at once, so the
per-state decoupling is checked too; then feasibility, complementary slackness and the
Thm 3.4 certificate of the swap.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize

import sim
from sim.agent_alignment import align_agent, swap_certificate
from teamtr.divergence import kl


def _small_mdp(seed: int, episodic: bool = False) -> sim.TurnTakingMDP:
    """2 agents x 3 states, 3 actions, random dense transitions and rewards in [0, 1]."""
    rng = np.random.default_rng(seed)
    n_states, n_actions = 6, 3
    transitions = rng.dirichlet(np.ones(n_states), size=(n_states, n_actions))
    rewards = rng.uniform(0.0, 1.0, size=(n_states, n_actions))
    start = rng.dirichlet(np.ones(n_states))
    agent_of_state = np.array([0, 1, 0, 1, 0, 1])
    if episodic:
        return sim.TurnTakingMDP(transitions, rewards, start, 1.0, agent_of_state, horizon=4)
    return sim.TurnTakingMDP(transitions, rewards, start, 0.8, agent_of_state)


def _dirichlet_table(mdp: sim.TurnTakingMDP, seed: int, concentration: float) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.full(mdp.n_actions, concentration), size=mdp.n_states)


def _joint_slsqp(
    pre: np.ndarray, cur: np.ndarray, weights: np.ndarray, delta0: float
) -> np.ndarray:
    """min sum_s w(s) KL(pi_s || pre_s) s.t. KL(pi_s || cur_s) <= delta0, sum pi_s = 1 (all s)."""
    n_states, n_actions = pre.shape
    floor = 1e-12

    def rows(x: np.ndarray) -> np.ndarray:
        return np.maximum(x.reshape(n_states, n_actions), floor)

    def objective(x: np.ndarray) -> float:
        p = rows(x)
        return float(weights @ np.sum(p * np.log(p / pre), axis=1))

    def objective_grad(x: np.ndarray) -> np.ndarray:
        return (weights[:, None] * (np.log(rows(x) / pre) + 1.0)).ravel()

    constraints = []
    for s in range(n_states):
        block = np.zeros((n_states, n_actions))
        block[s] = 1.0

        def total(x: np.ndarray, s: int = s) -> float:
            return float(np.sum(rows(x)[s]) - 1.0)

        def inside(x: np.ndarray, s: int = s) -> float:
            p = rows(x)[s]
            return float(delta0 - np.sum(p * np.log(p / cur[s])))

        def inside_grad(x: np.ndarray, s: int = s) -> np.ndarray:
            grad = np.zeros((n_states, n_actions))
            grad[s] = -(np.log(rows(x)[s] / cur[s]) + 1.0)
            return grad.ravel()

        constraints.append({"type": "eq", "fun": total, "jac": lambda x, b=block: b.ravel()})
        constraints.append({"type": "ineq", "fun": inside, "jac": inside_grad})
    result = minimize(
        objective,
        cur.ravel(),
        jac=objective_grad,
        method="SLSQP",
        bounds=[(floor, 1.0)] * pre.size,
        constraints=constraints,
        options={"ftol": 1e-14, "maxiter": 2000},
    )
    # Status 8 is SLSQP stalling at float precision next to the optimum; the comparison judges it.
    assert result.success or result.status == 8, result.message
    return rows(result.x) / rows(result.x).sum(axis=1, keepdims=True)


@pytest.mark.parametrize("seed", range(6))
def test_alignment_matches_generic_optimiser_on_the_full_problem(seed: int) -> None:
    mdp = _small_mdp(seed)
    team = sim.random_team(mdp, seed)
    pre = _dirichlet_table(mdp, seed + 100, concentration=0.7)
    agent = seed % 2
    mine = mdp.states_of(agent)
    delta0 = 0.05
    d_cur = sim.evaluate(mdp, team.table).d

    result = align_agent(mdp, team, agent, pre, delta0)
    reference = _joint_slsqp(pre[mine], team.table[mine], d_cur[mine], delta0)

    np.testing.assert_allclose(result.table[mine], reference, atol=5e-5)
    closed_form_objective = float(d_cur[mine] @ kl(result.table[mine], pre[mine]))
    optimiser_objective = float(d_cur[mine] @ kl(reference, pre[mine]))
    assert closed_form_objective <= optimiser_objective + 1e-9
    assert result.expected_kl_to_pre == pytest.approx(closed_form_objective, rel=1e-12)


@pytest.mark.parametrize("delta0", [1e-3, 0.02, 0.3])
@pytest.mark.parametrize("episodic", [False, True], ids=["discounted", "episodic"])
def test_constraint_holds_per_state_and_binds_where_active(delta0: float, episodic: bool) -> None:
    mdp = _small_mdp(7, episodic)
    team = sim.random_team(mdp, 3)
    pre = _dirichlet_table(mdp, 11, concentration=0.5)
    for agent in range(mdp.n_agents):
        mine = mdp.states_of(agent)
        result = align_agent(mdp, team, agent, pre, delta0)
        kl_to_cur = kl(result.table, team.table)
        assert np.all(kl_to_cur[mine] <= delta0 + 1e-9)
        assert result.max_kl_to_cur <= delta0 + 1e-9
        outside = kl(pre, team.table) > delta0
        np.testing.assert_array_equal(result.active, mine & outside)
        # Complementary slackness: lambda > 0 exactly where the constraint binds.
        np.testing.assert_allclose(kl_to_cur[result.active], delta0, rtol=0, atol=1e-9)
        assert np.all(result.lambdas[result.active] > 0)
        assert np.all(result.lambdas[~result.active] == 0)
        # Only agent k's rows move (Lemma 3.1).
        np.testing.assert_array_equal(result.table[~mine], team.table[~mine])
        np.testing.assert_array_equal(result.team(team).table[~mine], team.table[~mine])


def test_lambda_is_zero_when_the_replacement_is_already_inside() -> None:
    mdp = _small_mdp(2)
    team = sim.random_team(mdp, 5)
    # A small mixture towards another policy stays well inside a generous radius.
    pre = 0.97 * team.table + 0.03 * _dirichlet_table(mdp, 9, concentration=1.0)
    delta0 = 1.5 * float(kl(pre, team.table).max())
    result = align_agent(mdp, team, 1, pre, delta0)
    mine = mdp.states_of(1)
    assert not result.active.any()
    np.testing.assert_array_equal(result.lambdas, 0.0)
    np.testing.assert_allclose(result.table[mine], pre[mine], rtol=0, atol=1e-15)
    assert result.expected_kl_to_pre == pytest.approx(0.0, abs=1e-15)
    assert result.expected_kl_to_cur == pytest.approx(result.direct_expected_kl_to_cur)


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("episodic", [False, True], ids=["discounted", "episodic"])
def test_certificate_covers_the_aligned_and_the_direct_swap(seed: int, episodic: bool) -> None:
    mdp = _small_mdp(seed, episodic)
    team = sim.random_team(mdp, seed, concentration=0.5)
    pre = _dirichlet_table(mdp, seed + 50, concentration=0.3)
    agent = seed % 2
    result = align_agent(mdp, team, agent, pre, delta0=0.05)
    certificate = result.certificate
    aligned_j = sim.evaluate(mdp, result.team(team).table).J
    assert certificate.j_after == pytest.approx(aligned_j, rel=1e-12)
    assert certificate.realised_gain >= certificate.certificate - 1e-9
    assert certificate.realised_gain >= certificate.certificate_tv - 1e-9
    assert certificate.certificate_at_radius is not None
    # E_d[KL] <= delta0, so the radius-only bound is the weaker of the two KL forms.
    assert certificate.certificate_at_radius <= certificate.certificate + 1e-12
    assert certificate.covers
    # Thm 3.4 holds for any replacement, so it also covers the direct swap, if more loosely.
    direct = swap_certificate(mdp, team, agent, pre)
    assert direct.expected_kl == pytest.approx(result.direct_expected_kl_to_cur)
    assert direct.realised_gain >= direct.certificate - 1e-9
    assert direct.covers


def test_rejects_bad_inputs_with_a_clear_message() -> None:
    mdp = _small_mdp(0)
    team = sim.uniform_team(mdp)
    with pytest.raises(ValueError, match="delta0"):
        align_agent(mdp, team, 0, team.table, delta0=0.0)
    with pytest.raises(ValueError, match="agent"):
        align_agent(mdp, team, 5, team.table, delta0=0.1)
    with pytest.raises(ValueError, match="pi_pre_table"):
        align_agent(mdp, team, 0, team.table[:2], delta0=0.1)


def test_episodic_advantage_bound_uses_the_per_step_advantages() -> None:
    mdp = _small_mdp(3, episodic=True)
    team = sim.random_team(mdp, 4, concentration=0.5)
    new = _dirichlet_table(mdp, 8, concentration=0.3)
    evaluation = sim.evaluate(mdp, team.table)
    assert evaluation.rho is not None
    mine = mdp.states_of(0)
    moved = team.with_agent(0, new).table
    per_step = np.abs(np.einsum("sa,tsa->ts", moved, evaluation.A))
    expected_bound = per_step[(evaluation.rho > 0) & mine[None, :]].max()
    averaged_bound = np.abs(np.sum(moved * evaluation.surrogate_advantage, axis=1))[mine].max()
    certificate = swap_certificate(mdp, team, 0, new)
    assert certificate.advantage_bound == pytest.approx(expected_bound, rel=1e-12)
    # Thm 3.4 needs max over t of |E A_t|; the time-averaged advantage never exceeds it.
    assert certificate.advantage_bound >= averaged_bound - 1e-12
