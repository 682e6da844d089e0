"""``teamtr.check_backend`` passes on conforming backends and catches each broken promise."""

from __future__ import annotations

import numpy as np
import pytest
from toy_backend import (
    MislabellingSampler,
    MutatingTeam,
    OverreachingUpdater,
    StaleReusingSampler,
    ToySampler,
    ToyUpdater,
    toy_game,
    toy_statistic,
)

import sim
from teamtr import BackendCheckError, StageConfig, check_backend, run_stage
from teamtr.conformance import CHECKS, Backend


def test_the_toy_backend_conforms_and_trains():
    game = toy_game()
    team, sampler, updater = game.uniform_team(), ToySampler(game), ToyUpdater()
    assert check_backend(team, sampler, updater, radius=0.05, statistic=toy_statistic) == tuple(
        CHECKS
    )
    report, final = run_stage(
        team, sampler, updater, StageConfig(radius=0.05), game.penalty(), game.value
    )
    assert all(r.kept for r in report.records)
    # gamma = 0: the surrogate is the exact gain of each update (Thm 3.4 with zero penalty).
    for record in report.records:
        assert record.realised_gain == pytest.approx(record.update.surrogate, abs=1e-12)
    assert game.value(final) > game.value(team)


@pytest.mark.parametrize("sampled", [False, True], ids=["exact", "sampled"])
def test_the_tabular_backend_conforms(sampled):
    mdp = sim.random_mdp(n_states=20, n_actions=3, n_agents=3, gamma=0.9, seed=1)
    team = sim.random_team(mdp, np.random.default_rng(1), 1.0)
    if sampled:
        # Monte-Carlo rollouts: no statistic is deterministic, the other promises still hold.
        sampler = sim.SampledSampler(mdp, n_episodes=50, seed=1)
        statistic = None
    else:
        sampler = sim.ExactSampler(mdp)

        def statistic(rollouts):
            return np.concatenate([rollouts.occupancy, rollouts.advantage.ravel()])

    names = check_backend(team, sampler, sim.ExactUpdater(mdp), radius=0.02, statistic=statistic)
    assert names == tuple(CHECKS)


BROKEN = {
    "team_is_a_value": (MutatingTeam, ToySampler, ToyUpdater, "teams must be values"),
    "rollouts_record_their_team": (
        None,
        MislabellingSampler,
        ToyUpdater,
        "record another team",
    ),
    "updates_inside_radius": (None, ToySampler, OverreachingUpdater, "above its radius"),
    "resampling_is_on_policy": (None, StaleReusingSampler, ToyUpdater, "off-policy reuse"),
}


@pytest.mark.parametrize("promise", list(BROKEN))
def test_a_broken_backend_is_caught_by_the_check_of_its_promise(promise):
    team_type, sampler_type, updater_type, message = BROKEN[promise]
    assert set(BROKEN) == set(CHECKS)  # every promise has its broken backend
    game = toy_game(seed=3)
    team = game.uniform_team()
    if team_type is not None:
        team = team_type([team.agent(k).copy() for k in range(team.n_agents)])
    sampler, updater = sampler_type(game), updater_type()
    with pytest.raises(BackendCheckError, match=message):
        check_backend(team, sampler, updater, radius=0.05, statistic=toy_statistic)
    # The check of that promise, run on its own, catches it too.
    fresh_team = game.uniform_team()
    if team_type is not None:
        fresh_team = team_type([fresh_team.agent(k).copy() for k in range(team.n_agents)])
    with pytest.raises(BackendCheckError, match=message):
        CHECKS[promise](Backend(fresh_team, sampler, updater, 0.05, toy_statistic))


def test_a_team_that_cannot_improve_is_reported_not_passed():
    game = toy_game()
    sampler, updater = ToySampler(game), ToyUpdater(max_backtracks=0)
    with pytest.raises(BackendCheckError, match="no agent's update was accepted"):
        check_backend(game.uniform_team(), sampler, updater, radius=1e-12)
    with pytest.raises(ValueError, match="radius"):
        check_backend(game.uniform_team(), sampler, ToyUpdater(), radius=0.0)
