"""What the stage loop reports about each update: the team it started from, the rollouts it was
trained on, whether the sampler produced them for it; and orders that name a subset of agents."""

from __future__ import annotations

import numpy as np
import pytest

import sim
from teamtr import StageConfig, run_stage, run_stages
from teamtr.evaluations import PerTeamCache


def _instance(seed: int, n_agents: int = 3):
    mdp = sim.random_mdp(n_states=30, n_actions=3, n_agents=n_agents, gamma=0.9, seed=seed)
    return mdp, sim.random_team(mdp, np.random.default_rng(seed), 1.0)


class CountingSampler:
    """The exact sampler, counting its calls (the record must name each sampled batch once)."""

    def __init__(self, mdp):
        self.inner = sim.ExactSampler(mdp)
        self.sampled: list = []

    def sample(self, team, *, previous=None, updated_agent=None):
        self.sampled.append(self.inner.sample(team))
        return self.sampled[-1]

    def importance_weighted(self, rollouts, team):
        return self.inner.importance_weighted(rollouts, team)


@pytest.mark.parametrize("scheme", ["teamtr", "stale", "joint", "happo"])
def test_each_record_names_its_base_team_and_its_rollouts(scheme):
    mdp, team = _instance(1)
    sampler = CountingSampler(mdp)
    report, _ = run_stage(
        team,
        sampler,
        sim.ExactUpdater(mdp),
        StageConfig(scheme=scheme, radius=0.05),
        mdp.penalty_model(),
        keep_teams=True,
    )
    for position, record in enumerate(report.records):
        # pi_hat^{i-1}: the intermediate team, or the stage-start team for joint.
        expected_base = team if scheme == "joint" else report.teams[position]
        assert record.base is expected_base
        if scheme == "teamtr":
            assert record.rollouts.behaviour is record.base  # Thm 3.4: intermediate occupancy
        elif scheme == "happo" and position > 0:
            assert (
                record.rollouts.behaviour is team and record.rollouts.reweighted_for is record.base
            )
        else:
            assert record.rollouts is report.records[0].rollouts  # the stage-start cache
            assert record.rollouts.behaviour is team
    assert list(report.sampled_rollouts) == sampler.sampled


def test_an_order_of_one_agent_updates_that_agent_alone():
    mdp, team = _instance(2)
    evaluations = PerTeamCache(lambda t: sim.evaluate(mdp, t.table).J)
    stages = list(
        run_stages(
            team,
            sim.ExactSampler(mdp),
            sim.ExactUpdater(mdp),
            StageConfig(radius=0.05, order=(1,)),
            mdp.penalty_model(),
            n_stages=3,
            evaluator=evaluations,
        )
    )
    final = stages[-1][1]
    for report, _ in stages:
        assert report.order == (1,) and [r.agent for r in report.records] == [1]
        # Thm 3.4 for the single update: its certificate bounds its realised gain.
        assert report.records[0].realised_gain >= report.records[0].certificate - 1e-10
    others = ~final.states_of(1)
    np.testing.assert_array_equal(final.table[others], team.table[others])
    assert not np.array_equal(final.table[final.states_of(1)], team.table[team.states_of(1)])
    # One update alone is the update the full-order stage makes first when agent 1 leads it.
    alone, _ = run_stage(
        team,
        sim.ExactSampler(mdp),
        sim.ExactUpdater(mdp),
        StageConfig(radius=0.05, order=(1,)),
        mdp.penalty_model(),
    )
    leading, _ = run_stage(
        team,
        sim.ExactSampler(mdp),
        sim.ExactUpdater(mdp),
        StageConfig(radius=0.05, order=(1, 0, 2)),
        mdp.penalty_model(),
    )
    np.testing.assert_array_equal(alone.records[0].update.policy, leading.records[0].update.policy)
    assert len(evaluations) == 4  # the start and three updates, each evaluated once


@pytest.mark.parametrize("order", [(3,), (0, 5)])
def test_an_order_naming_an_agent_outside_the_team_is_refused(order):
    mdp, team = _instance(3)
    with pytest.raises(ValueError, match="outside a team of 3"):
        run_stage(
            team,
            sim.ExactSampler(mdp),
            sim.ExactUpdater(mdp),
            StageConfig(order=order),
            mdp.penalty_model(),
        )


@pytest.mark.parametrize("order", [(), (1, 1), (-1,), (0.5,)])
def test_an_order_must_be_distinct_agent_indices(order):
    with pytest.raises(ValueError, match="order"):
        StageConfig(order=order)


def test_the_per_team_cache_computes_each_team_once():
    calls = []
    cache = PerTeamCache(lambda team: calls.append(team) or len(calls))
    mdp, team = _instance(4)
    other = team.with_agent(0, team.agent(1))
    assert [cache(team), cache(other), cache(team), cache(other)] == [1, 2, 1, 2]
    assert calls == [team, other] and len(cache) == 2
