"""sim.evaluate against hand computations, value iteration and the performance-difference identity."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import scipy.sparse as sp
from sim_test_support import episodic_by_recursion, permuted_mdp, random_policy, value_iteration

import sim
import sim.linear


def two_state_mdp(gamma: float, p: float) -> sim.TurnTakingMDP:
    """State 0: action 0 stays (reward 1), action 1 moves to 1 (reward 0).
    State 1: either action returns to 0 w.p. p, else stays; action 0 pays 2, action 1 pays 0."""
    P = np.zeros((2, 2, 2))
    P[0, 0, 0] = 1.0
    P[0, 1, 1] = 1.0
    P[1, :, 0] = p
    P[1, :, 1] = 1.0 - p
    R = np.array([[1.0, 0.0], [2.0, 0.0]])
    return sim.TurnTakingMDP(P, R, [1.0, 0.0], gamma, [0, 1])


@pytest.mark.parametrize(("gamma", "p", "a", "b"), [(0.9, 0.3, 0.4, 0.7), (0.5, 1.0, 0.0, 1.0)])
def test_two_state_mdp_solved_by_hand(gamma: float, p: float, a: float, b: float) -> None:
    mdp = two_state_mdp(gamma, p)
    pi = np.array([[a, 1 - a], [b, 1 - b]])
    # V0 = a (1 + g V0) + (1-a) g V1 ;  V1 = 2b + g (p V0 + (1-p) V1)  =>  Cramer's rule.
    stay = 1 - gamma * (1 - p)
    determinant = (1 - a * gamma) * stay - (1 - a) * gamma**2 * p
    v0 = (a * stay + (1 - a) * gamma * 2 * b) / determinant
    v1 = (2 * b + gamma * p * v0) / stay
    # d0 = (1-g) + g (a d0 + p d1) ;  d1 = g ((1-a) d0 + (1-p) d1).
    d0 = (1 - gamma) / (1 - gamma * a - gamma**2 * p * (1 - a) / stay)
    d1 = gamma * (1 - a) * d0 / stay
    result = sim.evaluate(mdp, pi)
    np.testing.assert_allclose(result.V, [v0, v1], rtol=1e-13)
    np.testing.assert_allclose(result.d, [d0, d1], rtol=1e-13)
    assert result.J == pytest.approx(v0, rel=1e-13)
    q00 = 1 + gamma * v0
    q01 = gamma * v1
    np.testing.assert_allclose(result.Q[0], [q00, q01], rtol=1e-13)
    np.testing.assert_allclose(result.A[0], [q00 - v0, q01 - v0], atol=1e-12)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("gamma", [0.0, 0.5, 0.95])
def test_matches_value_iteration(seed: int, gamma: float) -> None:
    rng = np.random.default_rng(seed)
    mdp = sim.random_mdp(30, 3, 3, gamma=gamma, seed=seed, successors=5)
    pi = random_policy(rng, 30, 3)
    values, occupancy = value_iteration(mdp, pi)
    result = sim.evaluate(mdp, pi)
    np.testing.assert_allclose(result.V, values, rtol=0, atol=1e-9)
    np.testing.assert_allclose(result.d, occupancy, rtol=0, atol=1e-9)
    assert result.d.sum() == pytest.approx(1.0, abs=1e-14)
    assert result.residual <= 1e-10
    np.testing.assert_allclose((pi * result.A).sum(axis=1), 0.0, atol=1e-9)


def test_episodic_matches_explicit_recursion() -> None:
    rng = np.random.default_rng(7)
    mdp = sim.random_mdp(12, 3, 2, seed=7, horizon=6)
    pi = random_policy(rng, 12, 3)
    values, marginals = episodic_by_recursion(mdp, pi)
    result = sim.evaluate(mdp, pi)
    assert result.V.shape == (6, 12) and result.Q.shape == (6, 12, 3) and result.rho is not None
    np.testing.assert_allclose(result.V, values, atol=1e-12)
    np.testing.assert_allclose(result.rho, marginals, atol=1e-14)
    np.testing.assert_allclose(result.d, marginals.mean(axis=0), atol=1e-14)
    assert result.J == pytest.approx(mdp.rho0 @ values[0], abs=1e-12)
    assert result.A_bar is not None
    visits = marginals.sum(axis=0)
    expected_bar = np.einsum("ts,tsa->sa", marginals, result.A) / visits[:, None]
    np.testing.assert_allclose(result.A_bar, expected_bar, atol=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_performance_difference_identity(seed: int) -> None:
    rng = np.random.default_rng(seed)
    mdp = sim.random_mdp(40, 4, 3, gamma=0.9, seed=seed)
    pi, pi_new = random_policy(rng, 40, 4), random_policy(rng, 40, 4)
    old, new = sim.evaluate(mdp, pi), sim.evaluate(mdp, pi_new)
    # J(pi') - J(pi) = 1/(1-gamma) E_{s~d_pi', a~pi'}[A_pi(s,a)]   (THEORY.md §2)
    rhs = (new.d * (pi_new * old.A).sum(axis=1)).sum() / (1 - mdp.gamma)
    assert new.J - old.J == pytest.approx(rhs, abs=1e-9)


@pytest.mark.parametrize("seed", range(3))
def test_episodic_performance_difference_identity(seed: int) -> None:
    rng = np.random.default_rng(seed)
    mdp = sim.random_mdp(25, 3, 2, seed=seed, horizon=7)
    pi, pi_new = random_policy(rng, 25, 3), random_policy(rng, 25, 3)
    old, new = sim.evaluate(mdp, pi), sim.evaluate(mdp, pi_new)
    assert new.rho is not None
    # J(pi') - J(pi) = sum_t E_{rho_t^{pi'}, pi'}[A_t^pi]
    rhs = np.einsum("ts,sa,tsa->", new.rho, pi_new, old.A)
    assert new.J - old.J == pytest.approx(rhs, abs=1e-9)


def test_krylov_agrees_with_direct_solve() -> None:
    mdp = sim.random_mdp(800, 4, 3, gamma=0.99, seed=3)
    pi = random_policy(np.random.default_rng(3), 800, 4)
    direct = sim.evaluate(mdp, pi, method="direct-lu")
    krylov = sim.evaluate(mdp, pi, method="krylov-gmres")
    assert (direct.method, krylov.method) == ("direct-lu", "krylov-gmres")
    assert krylov.residual <= 1e-10
    np.testing.assert_allclose(krylov.V, direct.V, rtol=1e-9)
    np.testing.assert_allclose(krylov.d, direct.d, rtol=0, atol=1e-12)


def test_large_random_mdp_uses_krylov_with_tight_residual() -> None:
    mdp = sim.random_mdp(8_000, 4, 3, gamma=0.99, seed=0)
    result = sim.evaluate(mdp, sim.uniform_team(mdp))
    assert result.method == "krylov-gmres"
    assert result.residual <= 1e-10
    assert result.d.sum() == pytest.approx(1.0, abs=1e-12) and result.d.min() >= 0
    again = sim.evaluate(mdp, sim.uniform_team(mdp))
    assert (again.method, again.matvecs, again.residual) == (
        result.method,
        result.matvecs,
        result.residual,
    )


def test_large_random_mdp_is_never_factorised_even_if_richardson_looks_slow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever contraction Richardson observes, a random MDP's LU would fill in (a sparse LU
    at S = 8000 takes tens of seconds): the hand-over to a direct solve is decided by the
    kernel's structure, so it goes to GMRES instead. (What that saves is timed side by side in
    ``bench/slow_mixing_handover.py``.)"""
    monkeypatch.setattr(sim.linear, "RICHARDSON_SLOW_RATE", 0.0)  # every window looks slow
    calls = {"gmres": 0}
    gmres = sim.linear._gmres

    def counted_gmres(*args, **kwargs):
        calls["gmres"] += 1
        return gmres(*args, **kwargs)

    def refuse_to_factorise(*args, **kwargs):
        raise AssertionError("a random MDP was handed to a sparse LU")

    monkeypatch.setattr(sim.linear, "_gmres", counted_gmres)
    monkeypatch.setattr(sim.linear.spla, "splu", refuse_to_factorise)
    mdp = sim.random_mdp(8_000, 4, 3, gamma=0.99, seed=0)
    result = sim.evaluate(mdp, sim.uniform_team(mdp))
    assert calls["gmres"] >= 1  # Richardson did find it slow and handed over
    assert result.method == "krylov-gmres"
    assert result.residual <= 1e-10
    assert result.d.sum() == pytest.approx(1.0, abs=1e-12) and result.d.min() >= 0


def slow_ring(n_states: int, gamma: float) -> sim.TurnTakingMDP:
    """A slowly mixing ring (|lambda_2| close to 1) where Richardson is slow: GMRES takes over."""
    rows = np.arange(n_states)
    P = sp.lil_matrix((n_states, n_states))
    P[rows, rows] = 0.5
    P[rows, (rows + 1) % n_states] = 0.5
    rewards = np.sin(2 * np.pi * rows / n_states)[:, None]
    start = np.zeros(n_states)
    start[0] = 1.0
    return sim.TurnTakingMDP(sp.csr_matrix(P), rewards, start, gamma, rows % 2)


def test_slowly_mixing_chain_falls_back_to_gmres() -> None:
    mdp = slow_ring(400, 0.999)
    pi = np.ones((400, 1))
    direct = sim.evaluate(mdp, pi, method="direct-lu")
    krylov = sim.evaluate(mdp, pi, method="krylov-gmres")
    assert krylov.residual <= 1e-10
    np.testing.assert_allclose(krylov.V, direct.V, rtol=0, atol=1e-8 * np.abs(direct.V).max())
    np.testing.assert_allclose(krylov.d, direct.d, atol=1e-11)


def test_tiny_rewards_keep_relative_accuracy() -> None:
    mdp = sim.random_mdp(300, 3, 2, gamma=0.9, seed=1)
    tiny = sim.TurnTakingMDP(mdp.P, mdp.R * 1e-200, mdp.rho0, mdp.gamma, mdp.agent_of_state)
    pi = random_policy(np.random.default_rng(1), 300, 3)
    reference = sim.evaluate(mdp, pi, method="krylov-gmres")
    scaled = sim.evaluate(tiny, pi, method="krylov-gmres")
    np.testing.assert_allclose(scaled.V * 1e200, reference.V, rtol=1e-9)
    assert scaled.residual <= 1e-10


def test_tree_is_solved_by_triangular_substitution() -> None:
    mdp = sim.tree_mdp(8000, n_actions=3, gamma=0.9, seed=2)
    pi = random_policy(np.random.default_rng(2), 8000, 3)
    result = sim.evaluate(mdp, pi)
    assert result.method == "direct-triangular"
    assert result.residual <= 1e-10
    krylov = sim.evaluate(mdp, pi, method="krylov-gmres")
    np.testing.assert_allclose(result.V, krylov.V, rtol=1e-9)
    np.testing.assert_allclose(result.d, krylov.d, atol=1e-12)


def test_shuffled_tree_is_found_acyclic() -> None:
    mdp = sim.tree_mdp(6000, n_actions=2, gamma=0.95, seed=4)
    order = np.random.default_rng(4).permutation(6000)
    shuffled = permuted_mdp(mdp, order)
    pi = random_policy(np.random.default_rng(4), 6000, 2)
    original = sim.evaluate(mdp, pi)
    result = sim.evaluate(shuffled, pi[order])
    assert result.method == "direct-dag"
    assert result.residual <= 1e-10
    np.testing.assert_allclose(result.V, original.V[order], rtol=1e-12)
    np.testing.assert_allclose(result.d, original.d[order], atol=1e-15)


def test_topological_order_rejects_cycles() -> None:
    ring = sim.policy_kernel(slow_ring(10, 0.9), np.ones((10, 1)))
    assert sim.linear.topological_order(ring) is None


def test_frozen_lake_matches_dense_solve_and_gymnasium_rollouts() -> None:
    gamma = 0.9
    # FrozenLake from Gymnasium's own transition table (an MDP nobody here wrote); state 16 is
    # the absorbing state its terminating transitions lead to.
    env = gymnasium.make("FrozenLake-v1", map_name="4x4", is_slippery=True)
    mdp = sim.from_gymnasium(env, gamma=gamma)
    pi = np.full((17, 4), 0.25)
    result = sim.evaluate(mdp, pi)
    kernel = np.einsum("sa,sat->st", pi, mdp.transitions_dense())
    dense = np.linalg.solve(np.eye(17) - gamma * kernel, (pi * mdp.R).sum(axis=1))
    np.testing.assert_allclose(result.V, dense, atol=1e-12)

    # Discounted returns of Gymnasium's own FrozenLake under the uniform policy.
    env = gymnasium.make("FrozenLake-v1", map_name="4x4", is_slippery=True, max_episode_steps=300)
    rng = np.random.default_rng(0)
    returns = []
    env.reset(seed=0)
    for _ in range(4000):
        env.reset()
        total, discount, done = 0.0, 1.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(int(rng.integers(4)))
            total += discount * float(reward)
            discount *= gamma
            done = terminated or truncated
        returns.append(total)
    mean = np.mean(returns)
    standard_error = np.std(returns, ddof=1) / np.sqrt(len(returns))
    # 5 standard errors; truncation at 300 steps biases by at most gamma^300 ~ 2e-14.
    assert abs(mean - result.J) <= 5 * standard_error


def test_policy_is_validated() -> None:
    mdp = two_state_mdp(0.9, 0.5)
    with pytest.raises(sim.PolicyValidationError, match="state 1 sums to"):
        sim.evaluate(mdp, np.array([[0.5, 0.5], [0.5, 0.6]]))
    with pytest.raises(sim.PolicyValidationError, match="shape"):
        sim.evaluate(mdp, np.ones((3, 2)) / 2)
    with pytest.raises(sim.PolicyValidationError, match="negative at state 0, action 1"):
        sim.evaluate(mdp, np.array([[1.5, -0.5], [0.5, 0.5]]))


def test_slowly_mixing_chain_is_handed_to_a_direct_solve() -> None:
    mdp = slow_ring(2000, 0.999)
    pi = np.ones((2000, 1))
    result = sim.evaluate(mdp, pi)
    assert result.method == "direct-lu"
    assert result.residual <= 1e-10
