"""Coupled continuations (sim.coupling): common random numbers between a held-out episode and
its continuation leave the pairs' mean at the exact improvement and cut their variance.

Statistical tolerances: a sampled mean against its exact value within 4 standard errors.
"""

from __future__ import annotations

import numpy as np
import pytest

import sim
from proofs_check.measured_certificate import FAMILIES
from sim.coupling import CHUNK, StepNumbers
from sim.pairing import return_estimates
from tests.sim.test_measured_certificate import moved_team

PAIRS = 6000


def within_four_standard_errors(values: np.ndarray, exact: float) -> bool:
    return abs(values.mean() - exact) <= 4 * values.std(ddof=1) / np.sqrt(values.size)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_coupled_pairs_estimate_the_exact_improvement(family: str) -> None:
    mdp = FAMILIES[family](3, 0)
    old, new = moved_team(mdp, 1, 0)
    sampler = sim.SampledSampler(mdp, n_episodes=1, seed=0, coupled=True)
    batch = sampler.rollout(old, PAIRS, coupled=True)
    assert batch.seeds is not None and batch.seeds.size == PAIRS
    exact_old, exact_new = sim.evaluate(mdp, old).J, sim.evaluate(mdp, new).J
    # Both sides keep their marginals: each averages to its team's J.
    assert within_four_standard_errors(return_estimates(mdp, batch), exact_old)
    continued = sampler.continued(batch, new, 1)
    assert within_four_standard_errors(return_estimates(mdp, continued), exact_new)
    # So the pairs average to the exact improvement.
    differences = sampler.paired_differences(batch, new, 1).differences
    assert within_four_standard_errors(differences, exact_new - exact_old)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_coupled_continuation_by_the_same_team_repeats_the_episode(family: str) -> None:
    mdp = FAMILIES[family](3, 1)
    team = sim.random_team(mdp, 1)
    sampler = sim.SampledSampler(mdp, n_episodes=1, seed=1, coupled=True)
    batch = sampler.rollout(team, 300, coupled=True)
    again = sampler.continued(batch, team, 2)
    for name in ("episode", "time", "state", "action", "reward"):
        np.testing.assert_array_equal(getattr(again, name), getattr(batch, name))
    assert np.all(sampler.paired_differences(batch, team, 2).differences == 0.0)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_coupling_cuts_the_variance_of_a_small_update_s_pairs(family: str) -> None:
    """A tenth of the way from one policy to another for agent 1: most coupled continuations
    repeat their episode. The pairs' variance falls at least fourfold (the sample variances of
    6000 pairs each are within a few percent of their own values)."""
    mdp = FAMILIES[family](3, 0)
    old, far = moved_team(mdp, 1, 0)
    new = old.with_agent(1, 0.9 * old.agent(1) + 0.1 * far.agent(1))
    variances = {}
    for coupled in (False, True):
        sampler = sim.SampledSampler(mdp, n_episodes=1, seed=2, coupled=coupled)
        batch = sampler.rollout(old, PAIRS, coupled=coupled)
        variances[coupled] = sampler.paired_differences(batch, new, 1).differences.var(ddof=1)
    assert variances[True] * 4 < variances[False]


def test_held_out_episodes_of_a_coupled_sampler_are_coupled_and_its_training_ones_not() -> None:
    mdp = FAMILIES["dialogue"](2, 0)
    team = sim.random_team(mdp, 0)
    sampler = sim.SampledSampler(mdp, n_episodes=5, seed=0, coupled=True).with_held_out(7)
    rollouts = sampler.sample(team)
    assert rollouts.held_out is not None and rollouts.held_out.seeds is not None
    assert rollouts.held_out.seeds.size == 7 and rollouts.episodes.seeds is None
    assert sampler.draw_pairs(team, team, 1, 9).differences.tolist() == [0.0] * 9


def test_an_episode_s_numbers_are_distinct_draws() -> None:
    """The first state's number and each step's come from distinct streams (a seed list that
    ended in 0 once gave the start and step 0's action the same number, and biased J)."""
    for seed in range(200):
        numbers = StepNumbers(seed)
        assert numbers.start() not in numbers.at(0)
        assert not np.array_equal(numbers.at(0), numbers.at(CHUNK))
