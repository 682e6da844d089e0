"""Exact and sampled rollouts: what they estimate, importance weighting, determinism."""

from __future__ import annotations

import numpy as np
import pytest

import sim


def small_mdp(horizon: int | None = None) -> sim.TurnTakingMDP:
    if horizon is None:
        return sim.random_mdp(8, 3, 2, gamma=0.75, seed=11, successors=3)
    return sim.random_mdp(8, 3, 2, seed=11, successors=3, horizon=horizon)


def test_exact_sampler_returns_the_evaluation() -> None:
    mdp = small_mdp()
    team = sim.random_team(mdp, 0)
    rollouts = sim.ExactSampler(mdp).sample(team)
    evaluation = sim.evaluate(mdp, team.table)
    np.testing.assert_allclose(rollouts.occupancy, evaluation.d, atol=1e-15)
    np.testing.assert_allclose(rollouts.advantage, evaluation.A, atol=1e-13)
    assert rollouts.surrogate_scale == pytest.approx(4.0)
    assert rollouts.behaviour is team and rollouts.evaluation is not None
    assert isinstance(rollouts, sim.ExactRollouts)


def test_exact_importance_weighting_is_new_occupancy_with_stale_advantages() -> None:
    mdp = small_mdp()
    sampler = sim.ExactSampler(mdp)
    team = sim.random_team(mdp, 0)
    cache = sampler.sample(team)
    moved = team.with_agent(0, sim.random_team(mdp, 1).table)
    weighted = sampler.importance_weighted(cache, moved)
    np.testing.assert_allclose(weighted.occupancy, sim.evaluate(mdp, moved).d, atol=1e-15)
    np.testing.assert_array_equal(weighted.advantage, cache.advantage)
    assert weighted.behaviour is team and weighted.reweighted_for is moved


def test_exact_episodic_importance_weighting_reaverages_stale_advantages() -> None:
    mdp = small_mdp(horizon=5)
    sampler = sim.ExactSampler(mdp)
    team = sim.random_team(mdp, 0)
    cache = sampler.sample(team)
    moved = team.with_agent(1, sim.random_team(mdp, 2).table)
    weighted = sampler.importance_weighted(cache, moved)
    probe = sim.random_team(mdp, 3).table
    target = sim.evaluate(mdp, moved)
    assert cache.evaluation is not None and target.rho is not None
    # H sum_s d_team(s) sum_a probe A_bar = sum_t E_{rho_t^team, probe}[A_t^behaviour]
    direct = np.einsum("ts,sa,tsa->", target.rho, probe, cache.evaluation.A)
    assert weighted.surrogate(probe) == pytest.approx(direct, rel=1e-12)


def occupancy_standard_errors(batch: sim.EpisodeBatch, n_states: int) -> np.ndarray:
    """Delta-method standard error of the ratio estimator sum_e c_e(s) / sum_e L_e."""
    counts = np.zeros((batch.n_episodes, n_states))
    np.add.at(counts, (batch.episode, batch.state), 1.0)
    lengths = counts.sum(axis=1)
    estimate = counts.sum(axis=0) / lengths.sum()
    deviations = counts - estimate[None, :] * lengths[:, None]
    return deviations.std(axis=0, ddof=1) / (np.sqrt(batch.n_episodes) * lengths.mean())


@pytest.mark.parametrize("horizon", [None, 4])
def test_sampled_occupancy_within_five_standard_errors(horizon: int | None) -> None:
    mdp = small_mdp(horizon)
    team = sim.random_team(mdp, 0)
    sampled = sim.SampledSampler(mdp, n_episodes=4000, seed=1).sample(team)
    assert sampled.episodes is not None and sampled.evaluation is None
    exact = sim.evaluate(mdp, team).d
    errors = occupancy_standard_errors(sampled.episodes, mdp.n_states)
    assert np.all(np.abs(sampled.occupancy - exact) <= 5 * errors + 1e-12)


def test_monte_carlo_return_matches_exact_J() -> None:
    mdp = small_mdp()
    team = sim.random_team(mdp, 0)
    batch = sim.SampledSampler(mdp, n_episodes=4000, seed=2).rollout(team)
    returns = np.bincount(batch.episode, weights=batch.reward, minlength=batch.n_episodes)
    # Geometric termination makes the undiscounted return an unbiased estimate of J.
    standard_error = returns.std(ddof=1) / np.sqrt(returns.size)
    assert abs(returns.mean() - sim.evaluate(mdp, team).J) <= 5 * standard_error


def weighted_advantage_error(mdp: sim.TurnTakingMDP, n_episodes: int) -> float:
    team = sim.random_team(mdp, 0)
    sampled = sim.SampledSampler(mdp, n_episodes=n_episodes, seed=3).sample(team)
    exact = sim.ExactSampler(mdp).sample(team)
    weights = exact.occupancy[:, None] * team.table
    return float(np.sum(weights * np.abs(sampled.advantage - exact.advantage)))


@pytest.mark.parametrize("horizon", [None, 4])
def test_sampled_advantages_approach_exact_ones(horizon: int | None) -> None:
    mdp = small_mdp(horizon)
    coarse = weighted_advantage_error(mdp, 250)
    fine = weighted_advantage_error(mdp, 4000)
    # 16x the episodes: the error should shrink roughly 4x; ask for 2x.
    assert fine < 0.5 * coarse
    assert fine < 0.05 * mdp.r_max * sim.surrogate_scale(mdp)


def test_sampled_importance_weighting_tracks_the_new_occupancy() -> None:
    mdp = small_mdp()
    sampler = sim.SampledSampler(mdp, n_episodes=4000, seed=4)
    team = sim.random_team(mdp, 0, concentration=5.0)
    cache = sampler.sample(team)
    moved = team.with_agent(1, sim.random_team(mdp, 1, concentration=5.0).table)
    weighted = sampler.importance_weighted(cache, moved)
    target = sim.evaluate(mdp, moved).d
    behaviour = sim.evaluate(mdp, team).d
    assert np.abs(weighted.occupancy - target).sum() < 0.5 * np.abs(behaviour - target).sum()
    np.testing.assert_array_equal(weighted.advantage, cache.advantage)
    assert weighted.occupancy.sum() == pytest.approx(1.0)


def test_unchanged_team_gets_unit_weights() -> None:
    mdp = small_mdp()
    sampler = sim.SampledSampler(mdp, n_episodes=50, seed=5)
    team = sim.random_team(mdp, 0)
    cache = sampler.sample(team)
    np.testing.assert_allclose(sampler.importance_weighted(cache, team).occupancy, cache.occupancy)


def test_sampled_rollouts_are_seeded() -> None:
    mdp = small_mdp()
    team = sim.random_team(mdp, 0)
    first = sim.SampledSampler(mdp, n_episodes=30, seed=9).rollout(team)
    second = sim.SampledSampler(mdp, n_episodes=30, seed=9).rollout(team)
    other = sim.SampledSampler(mdp, n_episodes=30, seed=10).rollout(team)
    np.testing.assert_array_equal(first.state, second.state)
    np.testing.assert_array_equal(first.action, second.action)
    assert first.state.size != other.state.size or np.any(first.state != other.state)


def test_returns_to_go_restart_at_each_episode() -> None:
    mdp = small_mdp(horizon=3)
    batch = sim.SampledSampler(mdp, n_episodes=5, seed=0).rollout(sim.uniform_team(mdp))
    for e in range(5):
        rewards = batch.reward[batch.episode == e]
        expected = np.cumsum(rewards[::-1])[::-1]
        np.testing.assert_allclose(batch.return_to_go[batch.episode == e], expected)
