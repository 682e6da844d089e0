"""ExactUpdater: hits the radius, is optimal among feasible policies, handles degenerate cases."""

from __future__ import annotations

from typing import Literal

import numpy as np
import pytest

import sim

Direction = Literal["reverse", "forward"]
DIRECTIONS: tuple[Direction, ...] = ("reverse", "forward")


def setting(seed: int = 0) -> tuple[sim.TurnTakingMDP, sim.TabularTeam, sim.TabularRollouts]:
    mdp = sim.random_mdp(40, 4, 3, gamma=0.9, seed=seed)
    team = sim.random_team(mdp, seed, concentration=2.0)
    return mdp, team, sim.ExactSampler(mdp).sample(team)


def expected_kl(
    direction: Direction, new: np.ndarray, old: np.ndarray, d: np.ndarray, states: np.ndarray
) -> float:
    p, q = (new, old) if direction == "reverse" else (old, new)
    per_state = np.sum(np.where(p > 0, p * np.log(p / q), 0.0), axis=1)
    return float(d[states] @ per_state[states])


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("radius", [1e-5, 1e-3, 0.05])
@pytest.mark.parametrize("agent", [0, 2])
def test_expected_kl_hits_radius(direction: Direction, radius: float, agent: int) -> None:
    mdp, team, rollouts = setting()
    update = sim.ExactUpdater(mdp, direction).update(team, agent, rollouts, radius)
    assert update.extras["greedy"] == 0.0
    assert abs(update.kl - radius) <= 1e-9 * radius
    mine = team.states_of(agent)
    recomputed = expected_kl(direction, update.policy, team.table, rollouts.occupancy, mine)
    assert recomputed == pytest.approx(update.kl, rel=1e-12)
    # Other agents' rows are untouched; the new rows are distributions.
    np.testing.assert_array_equal(update.policy[~mine], team.table[~mine])
    np.testing.assert_allclose(update.policy.sum(axis=1), 1.0, atol=1e-14)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_report_fields_are_consistent(direction: Direction) -> None:
    mdp, team, rollouts = setting(1)
    update = sim.ExactUpdater(mdp, direction).update(team, 1, rollouts, 0.01)
    mine = team.states_of(1)
    d, adv = rollouts.occupancy, rollouts.advantage
    gains = np.sum(update.policy * adv, axis=1)
    assert update.surrogate == pytest.approx(d[mine] @ gains[mine] / (1 - mdp.gamma), rel=1e-12)
    assert update.advantage_bound == pytest.approx(np.abs(gains[mine]).max(), rel=1e-12)
    tv = 0.5 * np.abs(update.policy - team.table).sum(axis=1)
    assert update.tv == pytest.approx(d[mine] @ tv[mine], rel=1e-12)
    assert update.accepted and update.kl_quantile is None
    # Thm 3.4 (TV form) holds for this exact update.
    new_team = team.with_agent(1, update.policy)
    gain = sim.evaluate(mdp, new_team).J - sim.evaluate(mdp, team).J
    penalty = mdp.penalty_model().tv_penalty(update.advantage_bound, update.tv or 0.0)
    assert gain >= update.surrogate - penalty - 1e-12


def feasible_perturbation(
    rng: np.random.Generator,
    direction: Direction,
    old: np.ndarray,
    d: np.ndarray,
    mine: np.ndarray,
    radius: float,
) -> np.ndarray:
    """A random tilt of the agent's rows, scaled by bisection to lie inside the radius."""
    noise = rng.normal(size=old.shape)

    def tilted(scale: float) -> np.ndarray:
        logits = np.log(old) + scale * noise
        new = np.exp(logits - logits.max(axis=1, keepdims=True))
        new /= new.sum(axis=1, keepdims=True)
        return np.where(mine[:, None], new, old)

    low, high = 0.0, 1.0
    while expected_kl(direction, tilted(high), old, d, mine) < radius:
        high *= 2
    for _ in range(60):
        middle = 0.5 * (low + high)
        inside = expected_kl(direction, tilted(middle), old, d, mine) <= radius
        low, high = (middle, high) if inside else (low, middle)
    return tilted(low)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_beats_random_feasible_policies(direction: Direction) -> None:
    mdp, team, rollouts = setting(2)
    radius, agent = 0.02, 0
    update = sim.ExactUpdater(mdp, direction).update(team, agent, rollouts, radius)
    mine = team.states_of(agent)
    rng = np.random.default_rng(0)
    for _ in range(100):
        candidate = feasible_perturbation(
            rng, direction, team.table, rollouts.occupancy, mine, radius
        )
        assert expected_kl(direction, candidate, team.table, rollouts.occupancy, mine) <= radius
        assert rollouts.surrogate(candidate, mine) <= update.surrogate + 1e-12
    # The other direction's maximiser, shrunk into this direction's region, does not win either.
    other = "forward" if direction == "reverse" else "reverse"
    rival = sim.ExactUpdater(mdp, other).update(team, agent, rollouts, radius).policy
    if expected_kl(direction, rival, team.table, rollouts.occupancy, mine) <= radius:
        assert rollouts.surrogate(rival, mine) <= update.surrogate + 1e-12


def test_reverse_solution_is_an_exponential_tilt() -> None:
    mdp, team, rollouts = setting(3)
    update = sim.ExactUpdater(mdp, "reverse").update(team, 1, rollouts, 0.01)
    mine = team.states_of(1)
    beta = update.extras["temperature"]
    log_ratio = np.log(update.policy[mine] / team.table[mine]) - rollouts.advantage[mine] / beta
    np.testing.assert_allclose(log_ratio - log_ratio.mean(axis=1, keepdims=True), 0.0, atol=1e-9)


def test_forward_solution_satisfies_stationarity() -> None:
    mdp, team, rollouts = setting(3)
    update = sim.ExactUpdater(mdp, "forward").update(team, 1, rollouts, 0.01)
    mine = team.states_of(1)
    lam = update.extras["temperature"]
    # pi'(a) (c_s - A(a)) = lam pi(a)  =>  c_s = A(a) + lam pi(a)/pi'(a) is the same for all a.
    c = rollouts.advantage[mine] + lam * team.table[mine] / update.policy[mine]
    np.testing.assert_allclose(c - c.mean(axis=1, keepdims=True), 0.0, atol=1e-9)


def test_large_radius_takes_the_greedy_limit() -> None:
    mdp, team, rollouts = setting(4)
    update = sim.ExactUpdater(mdp, "reverse").update(team, 0, rollouts, 50.0)
    mine = team.states_of(0) & (rollouts.occupancy > 0)
    assert update.extras["greedy"] == 1.0
    assert update.kl < 50.0
    best = rollouts.advantage[mine].argmax(axis=1)
    np.testing.assert_allclose(update.policy[mine][np.arange(best.size), best], 1.0)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_zero_advantages_and_zero_radius_change_nothing(direction: Direction) -> None:
    mdp, team, rollouts = setting(5)
    updater = sim.ExactUpdater(mdp, direction)
    flat = sim.TabularRollouts(
        team, rollouts.occupancy, np.zeros_like(rollouts.advantage), rollouts.surrogate_scale
    )
    for given, radius in ((flat, 0.1), (rollouts, 0.0)):
        update = updater.update(team, 1, given, radius)
        np.testing.assert_array_equal(update.policy, team.table)
        assert update.kl == 0.0 and update.tv == 0.0
    # A per-state constant shift of the advantages changes nothing either.
    shifted = sim.TabularRollouts(
        team,
        rollouts.occupancy,
        rollouts.advantage + np.arange(mdp.n_states)[:, None],
        rollouts.surrogate_scale,
    )
    base = updater.update(team, 1, rollouts, 0.01)
    moved = updater.update(team, 1, shifted, 0.01)
    np.testing.assert_allclose(moved.policy, base.policy, atol=1e-12)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_unvisited_states_keep_their_policy(direction: Direction) -> None:
    mdp, team, rollouts = setting(6)
    mine = np.flatnonzero(team.states_of(2))
    occupancy = rollouts.occupancy.copy()
    occupancy[mine[:3]] = 0.0
    occupancy /= occupancy.sum()
    partial = sim.TabularRollouts(team, occupancy, rollouts.advantage, rollouts.surrogate_scale)
    update = sim.ExactUpdater(mdp, direction).update(team, 2, partial, 0.01)
    np.testing.assert_array_equal(update.policy[mine[:3]], team.table[mine[:3]])
    assert abs(update.kl - 0.01) <= 1e-11


def test_episodic_surrogate_is_the_time_indexed_sum() -> None:
    mdp = sim.dialogue_mdp(2, 2, 2, n_turns=3, seed=1)
    team = sim.random_team(mdp, 1)
    rollouts = sim.ExactSampler(mdp).sample(team)
    update = sim.ExactUpdater(mdp, "reverse").update(team, 1, rollouts, 0.05)
    evaluation = rollouts.evaluation
    assert evaluation is not None and evaluation.rho is not None
    mine = team.states_of(1).astype(float)
    time_indexed = np.einsum("ts,sa,tsa,s->", evaluation.rho, update.policy, evaluation.A, mine)
    assert update.surrogate == pytest.approx(time_indexed, rel=1e-12)


def test_bad_arguments_are_rejected() -> None:
    mdp, team, rollouts = setting()
    with pytest.raises(ValueError, match="direction"):
        sim.ExactUpdater(mdp, "sideways")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="radius"):
        sim.ExactUpdater(mdp).update(team, 0, rollouts, -1.0)


def averaged_eps_instance() -> tuple[sim.TurnTakingMDP, sim.TabularTeam]:
    """One agent, 2 states, H = 4, deterministic moves: A_bar is much flatter than A_t."""
    P = np.array([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [0.0, 1.0]]])
    mdp = sim.TurnTakingMDP(
        P,
        np.array([[-0.4, 0.81], [-0.6, -0.46]]),
        np.array([0.09, 0.91]),
        1.0,
        np.array([0, 0]),
        horizon=4,
    )
    team = sim.TabularTeam(np.array([[0.29, 0.71], [0.09, 0.91]]), mdp.agent_of_state)
    return mdp, team


def test_episodic_advantage_bound_is_the_max_over_steps_and_covers_the_gain() -> None:
    mdp, team = averaged_eps_instance()
    rollouts = sim.ExactSampler(mdp).sample(team)
    update = sim.ExactUpdater(mdp, "reverse").update(team, 0, rollouts, 0.24)
    evaluation = rollouts.evaluation
    assert evaluation is not None and evaluation.rho is not None
    per_step = np.abs(np.einsum("sa,tsa->ts", update.policy, evaluation.A))
    assert update.advantage_bound == pytest.approx(per_step[evaluation.rho > 0].max(), rel=1e-12)
    averaged = np.abs(np.sum(update.policy * rollouts.advantage, axis=1)).max()
    assert update.advantage_bound > averaged  # A_bar would understate eps here
    # The episodic Thm 3.4 (TV form) holds with this eps; with the averaged one it did not.
    gain = sim.evaluate(mdp, team.with_agent(0, update.policy)).J - evaluation.J
    penalty = mdp.penalty_model()
    assert gain >= update.surrogate - penalty.tv_penalty(update.advantage_bound, update.tv or 0.0)
    assert gain < update.surrogate - penalty.tv_penalty(averaged, update.tv or 0.0)


def test_sampled_episodic_advantage_bound_uses_the_estimated_advantages() -> None:
    mdp, team = averaged_eps_instance()
    rollouts = sim.SampledSampler(mdp, 200, seed=0).sample(team)
    update = sim.ExactUpdater(mdp, "reverse").update(team, 0, rollouts, 0.05)
    mine = team.states_of(0) & (rollouts.occupancy > 0)
    estimate = np.abs(np.sum(update.policy * rollouts.advantage, axis=1))[mine].max()
    assert update.advantage_bound == pytest.approx(estimate, rel=1e-12)


@pytest.mark.filterwarnings("error")
def test_forward_radius_above_every_representable_kl_returns_the_limit() -> None:
    """One state, gamma = 0: the only worse action has probability 1e-8, so the forward KL of
    the maximiser reaches 0.5 only at lambda ~ exp(-5e7); the update returns the limit."""
    pi = np.array([[9.9999e-01, 5.6048e-06, 7.9354e-14, 9.6723e-09]])
    pi /= pi.sum()
    rewards = np.array([[0.0, 0.0, 0.0, -0.0117]])
    mdp = sim.TurnTakingMDP(np.ones((1, 4, 1)), rewards, np.array([1.0]), 0.0, np.array([0]))
    team = sim.TabularTeam(pi, mdp.agent_of_state)
    rollouts = sim.ExactSampler(mdp).sample(team)
    update = sim.ExactUpdater(mdp, "forward").update(team, 0, rollouts, 0.5)
    assert update.extras["greedy"] == 1.0
    assert 0.0 < update.kl <= 0.5
    one = np.array([True])
    assert update.kl == pytest.approx(expected_kl("forward", update.policy, pi, np.ones(1), one))
    new = update.policy[0]
    assert 0.0 < new[3] < 1e-300  # emptied as far as a normal float allows
    np.testing.assert_allclose(new[:3], pi[0, :3] / pi[0, :3].sum(), rtol=1e-12)
    # The surrogate's supremum (pi restricted to the greedy set) to working precision.
    greedy = np.r_[pi[0, :3] / pi[0, :3].sum(), 0.0][None, :]
    assert update.surrogate == pytest.approx(rollouts.surrogate(greedy), rel=1e-12, abs=1e-300)


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("radius", [1e-4, 0.004322038820040048, 0.05, 3.0])
def test_forward_update_of_a_nearly_deterministic_state_raises_no_warnings(radius: float) -> None:
    """pi(worse action) = 3e-12: the temperature search visits lambdas whose squares underflow
    (the Newton step divided by zero and overflowed there before)."""
    pi = np.array([[3.0693343538519377e-12, 1.0 - 3.0693343538519377e-12]])
    advantage = np.array([[-8.6103321518527032e-01, 2.6427748878177226e-12]])
    mdp = sim.TurnTakingMDP(np.ones((1, 2, 1)), advantage, np.array([1.0]), 0.0, np.array([0]))
    team = sim.TabularTeam(pi, mdp.agent_of_state)
    rollouts = sim.ExactSampler(mdp).sample(team)
    update = sim.ExactUpdater(mdp, "forward").update(team, 0, rollouts, radius)
    assert update.kl <= radius * (1 + 1e-9)
    one = np.array([True])
    recomputed = expected_kl("forward", update.policy, pi, np.ones(1), one)
    assert recomputed == pytest.approx(update.kl, rel=1e-9)
    assert update.surrogate >= rollouts.surrogate(pi)


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("gamma", [1e-308, 5e-320])
def test_subnormal_advantage_spreads_still_hit_the_radius(
    direction: Direction, gamma: float
) -> None:
    """gamma ~ 1e-308 with zero rewards on agent 0's states: advantages there are ~gamma."""
    base = sim.random_mdp(6, 3, 2, gamma=0.5, seed=0)
    rewards = np.where(base.agent_of_state == 0, 0.0, np.arange(6.0) + 1)
    mdp = sim.TurnTakingMDP(
        base.P, np.repeat(rewards[:, None], 3, axis=1), base.rho0, gamma, base.agent_of_state
    )
    team = sim.random_team(mdp, 1)
    rollouts = sim.ExactSampler(mdp).sample(team)
    assert 0 < np.ptp(rollouts.advantage[team.states_of(0)]) < 1e-300
    update = sim.ExactUpdater(mdp, direction).update(team, 0, rollouts, 0.1)
    assert update.extras["greedy"] == 0.0
    assert abs(update.kl - 0.1) <= 1e-9 * 0.1
