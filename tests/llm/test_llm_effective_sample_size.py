"""HAPPO's effective sample size: Kish's formula, and what an update records of its batch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from llm_test_support import arithmetic_sampler, perturb_agent, with_rewards

from llm.update.outcome import effective_sample_size
from llm.update.updater import TrustRegionUpdater, UpdaterSettings

REWARDS = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0]


def test_effective_sample_size_is_kish_share():
    assert effective_sample_size(np.ones(5)) == 1.0
    assert effective_sample_size(np.full(4, 3.7)) == pytest.approx(1.0, abs=1e-15)
    # One weight carries the batch: one episode's worth of N = 4.
    assert effective_sample_size(np.array([2.0, 0.0, 0.0, 0.0])) == 0.25
    # (1 + 2 + 3)^2 / (3 (1 + 4 + 9)) = 36 / 42.
    assert effective_sample_size(np.array([1.0, 2.0, 3.0])) == pytest.approx(6 / 7, abs=1e-15)
    # Scale-free: the share depends on the weights' proportions only.
    w = np.random.default_rng(0).lognormal(size=64)
    assert effective_sample_size(1e-3 * w) == pytest.approx(effective_sample_size(w), rel=1e-12)
    assert math.isnan(effective_sample_size(np.array([1.0, np.inf])))


@pytest.fixture
def team(char_team):
    for agent in range(char_team.n_agents):  # non-zero adapters: every agent is its own policy
        char_team = perturb_agent(char_team, agent, scale=0.3, seed=agent)
    return char_team


def test_an_update_records_its_batch_effective_sample_size(team, char_chat):
    sampler = arithmetic_sampler(char_chat, prompts_per_batch=2, group_size=4, temperature=1.0)
    torch.manual_seed(0)
    rollouts = with_rewards(sampler.sample(team), REWARDS)
    settings = UpdaterSettings(learning_rate=0.05, steps=1, warm_start=False)
    updater = TrustRegionUpdater(char_chat, settings)

    on_policy = updater.update(team, 1, rollouts, radius=10.0)
    assert on_policy.effective_sample_size == 1.0

    # HAPPO: agent 0 changed, so agent 1's batch is the cache weighted by agent 0's ratios.
    changed = perturb_agent(team, 0, scale=0.3, seed=11)
    reweighted = sampler.importance_weighted(rollouts, changed)
    update = updater.update(changed, 1, reweighted, radius=10.0)
    expected = effective_sample_size(reweighted.weights)
    assert expected < 0.99  # the perturbation moved the weights off 1
    assert update.effective_sample_size == expected
