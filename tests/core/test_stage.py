"""The stage loop on exact tabular instances: each scheme trains on the rollouts THEORY.md says,
kept updates stay inside their radius, and TeamTR's certificates are lower bounds (Thm 3.4/3.6).
"""

from dataclasses import replace

import numpy as np
import pytest

import sim
from teamtr import StageConfig, run_stage, run_stages
from teamtr.surrogate import exact_surrogate

GAMMA = 0.9


def _instance(seed: int, n_agents: int = 3):
    mdp = sim.random_mdp(n_states=30, n_actions=3, n_agents=n_agents, gamma=GAMMA, seed=seed)
    team = sim.random_team(mdp, np.random.default_rng(seed), 1.0)
    return mdp, team


def _stage(mdp, team, **config):
    return run_stage(
        team,
        sim.ExactSampler(mdp),
        sim.ExactUpdater(mdp),
        StageConfig(**config),
        mdp.penalty_model(),
        evaluator=lambda t: sim.evaluate(mdp, t.table).J,
        keep_teams=True,
    )


def _exact_surrogate(mdp, agent, new_team, occupancy_team, advantage_team):
    """The agent's own term of L_i (Thm 3.4): its states only, as a sequential learner sees it."""
    d = sim.evaluate(mdp, occupancy_team.table).d
    advantage = sim.evaluate(mdp, advantage_team.table).A
    own = mdp.agent_of_state == agent
    return exact_surrogate(new_team.table[own], advantage[own], d[own], 1.0 / (1.0 - mdp.gamma))


@pytest.mark.parametrize("seed", range(4))
def test_teamtr_trains_each_agent_under_the_intermediate_team(seed):
    mdp, team = _instance(seed)
    report, final = _stage(mdp, team, scheme="teamtr", radius=0.05)
    for record, before, after in zip(report.records, report.teams, report.teams[1:], strict=False):
        assert record.kept and record.update.kl <= 0.05 * (1 + 1e-9)
        expected = _exact_surrogate(mdp, record.agent, after, before, before)
        assert record.update.surrogate == pytest.approx(expected, abs=1e-9)
        # Thm 3.4: the certificate is a lower bound on the realised gain of this update.
        assert record.realised_gain >= record.certificate - 1e-10
    # Thm 3.6: the stage certificate bounds the stage's gain; the gains telescope.
    assert report.realised_gain >= report.certificate - 1e-10
    assert sum(r.realised_gain for r in report.records) == pytest.approx(report.realised_gain)
    assert final is report.teams[-1]


@pytest.mark.parametrize("seed", range(3))
def test_stale_trains_every_agent_on_the_stage_start_cache(seed):
    mdp, team = _instance(seed)
    report, _ = _stage(mdp, team, scheme="stale", radius=0.05)
    for record, after in zip(report.records, report.teams[1:], strict=False):
        expected = _exact_surrogate(mdp, record.agent, after, team, team)
        assert record.update.surrogate == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize("seed", range(3))
def test_happo_uses_intermediate_occupancy_with_stage_start_advantages(seed):
    mdp, team = _instance(seed)
    report, _ = _stage(mdp, team, scheme="happo", radius=0.05)
    for record, before, after in zip(report.records, report.teams, report.teams[1:], strict=False):
        expected = _exact_surrogate(mdp, record.agent, after, before, team)
        assert record.update.surrogate == pytest.approx(expected, abs=1e-9)


def test_joint_swaps_every_agent_in_at_once_and_certifies_the_team_move():
    mdp, team = _instance(5)
    report, final = _stage(mdp, team, scheme="joint", radius=0.05)
    assert len(report.teams) == 2
    expected = team
    for record in report.records:
        assert record.j_before == pytest.approx(report.j_start)
        expected = expected.with_agent(record.agent, record.update.policy)
    np.testing.assert_array_equal(final.table, expected.table)
    assert report.realised_gain >= report.certificate - 1e-10


def test_random_orders_keep_the_stage_bound():
    mdp, team = _instance(7, n_agents=4)
    config = StageConfig(scheme="teamtr", radius=0.02, order="random", seed=3)
    reports = list(
        run_stages(
            team,
            sim.ExactSampler(mdp),
            sim.ExactUpdater(mdp),
            config,
            mdp.penalty_model(),
            n_stages=4,
            evaluator=lambda t: sim.evaluate(mdp, t.table).J,
        )
    )
    assert len({r.order for r, _ in reports}) > 1
    for report, _ in reports:
        assert report.realised_gain >= report.certificate - 1e-10
    # Consecutive stages chain: each starts where the previous ended.
    for (first, _), (second, _) in zip(reports, reports[1:], strict=False):
        assert second.j_start == pytest.approx(first.j_end, abs=1e-12)


class _OverreachingUpdater:
    """A real exact updater that steps to four times the radius it is given."""

    def __init__(self, mdp):
        self.inner = sim.ExactUpdater(mdp)

    def update(self, team, agent, rollouts, radius):
        return self.inner.update(team, agent, rollouts, 4.0 * radius)


def test_an_update_outside_its_radius_is_never_kept():
    mdp, team = _instance(2)
    report, final = run_stage(
        team,
        sim.ExactSampler(mdp),
        _OverreachingUpdater(mdp),
        StageConfig(scheme="teamtr", radius=0.01),
        mdp.penalty_model(),
    )
    assert all(r.update.kl > 0.01 for r in report.records)
    assert not any(r.kept for r in report.records)
    assert report.certificate == 0.0
    np.testing.assert_array_equal(final.table, team.table)


class _RejectingUpdater:
    """A real exact updater (inside its radius, a positive surrogate) whose every update says
    it was rejected (a backtracking search that gave up)."""

    def __init__(self, mdp):
        self.inner = sim.ExactUpdater(mdp)

    def update(self, team, agent, rollouts, radius):
        return replace(self.inner.update(team, agent, rollouts, radius), accepted=False)


@pytest.mark.parametrize("scheme", ["teamtr", "joint"])
def test_rejected_updates_leave_the_team_unchanged_and_charge_nothing(scheme):
    mdp, team = _instance(4)
    report, _ = _stage(mdp, team, scheme="teamtr", radius=0.03)
    record = report.records[0]
    rejected = replace(record.update, accepted=False)
    from teamtr.stage import inside_radius

    assert not inside_radius(rejected, 0.03, 1e-6)
    assert not inside_radius(replace(record.update, kl=float("nan")), 0.03, 1e-6)

    report, final = run_stage(
        team,
        sim.ExactSampler(mdp),
        _RejectingUpdater(mdp),
        StageConfig(scheme=scheme, radius=0.03),
        mdp.penalty_model(),
    )
    # The updates themselves would have been kept and charged: only the rejection stops them.
    assert all(r.update.kl <= 0.03 * (1 + 1e-9) and r.update.surrogate > 0 for r in report.records)
    assert report.records and not any(r.kept for r in report.records)
    assert all(r.penalty == 0.0 and r.certificate == 0.0 for r in report.records)
    assert report.certificate == 0.0
    np.testing.assert_array_equal(final.table, team.table)


def test_joint_tv_form_sums_the_agents_tv_and_still_bounds_the_gain():
    mdp, team = _instance(6)
    kl_report, _ = _stage(mdp, team, scheme="joint", radius=0.05)
    tv_report, _ = _stage(mdp, team, scheme="joint", radius=0.05, penalty_form="tv")
    assert tv_report.realised_gain >= tv_report.certificate - 1e-10
    # E[TV] <= sqrt(E[KL]/2) (Pinsker, Jensen): the TV form is never looser than the KL form.
    assert tv_report.certificate >= kl_report.certificate - 1e-12
