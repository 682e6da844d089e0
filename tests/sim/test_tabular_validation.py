"""Teams are checked against the MDP wherever both meet; agent maps, overflow and solver options.

Each test is a case that used to pass silently: a team whose agent map differs from its MDP's
updated the wrong states, ids 0.5 were truncated to 0, ids with gaps inflated the number of
agents, R = 1e308 gave J = nan with only RuntimeWarnings, and rtol <= 0 ran tens of thousands
of matrix-vector products before failing.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
import sim.agent_alignment
from teamtr import StageConfig, run_stage

S, A = 12, 3


@pytest.fixture
def mdp() -> sim.TurnTakingMDP:
    return sim.random_mdp(S, A, 2, gamma=0.9, seed=0)


def team_with_map(mdp: sim.TurnTakingMDP, agent_of_state: Any) -> sim.TabularTeam:
    return sim.TabularTeam(
        np.full((mdp.n_states, mdp.n_actions), 1.0 / mdp.n_actions), agent_of_state
    )


def swapped_map_team(mdp: sim.TurnTakingMDP) -> sim.TabularTeam:
    """Same shape and number of agents as ``mdp``'s teams, agents 0 and 1 exchanged."""
    return team_with_map(mdp, 1 - mdp.agent_of_state)


CONSUMERS: dict[str, Callable[[sim.TurnTakingMDP, sim.TabularTeam], Any]] = {
    "evaluate": lambda mdp, team: sim.evaluate(mdp, team),
    "ExactSampler.sample": lambda mdp, team: sim.ExactSampler(mdp).sample(team),
    "ExactSampler.importance_weighted": lambda mdp, team: sim.ExactSampler(mdp).importance_weighted(
        sim.ExactSampler(mdp).sample(sim.uniform_team(mdp)), team
    ),
    "SampledSampler.sample": lambda mdp, team: sim.SampledSampler(mdp, 2).sample(team),
    "ExactUpdater.update": lambda mdp, team: sim.ExactUpdater(mdp).update(
        team, 0, sim.ExactSampler(mdp).sample(sim.uniform_team(mdp)), 0.1
    ),
    "swap_certificate": lambda mdp, team: sim.agent_alignment.swap_certificate(
        mdp, team, 0, np.full((S, A), 1.0 / A)
    ),
    "align_agent": lambda mdp, team: sim.agent_alignment.align_agent(
        mdp, team, 0, np.full((S, A), 1.0 / A), 0.1
    ),
    "run_stage": lambda mdp, team: run_stage(
        team,
        sim.ExactSampler(mdp),
        sim.ExactUpdater(mdp),
        StageConfig(radius=0.1),
        mdp.penalty_model(),
    ),
}


@pytest.mark.parametrize("consumer", list(CONSUMERS))
def test_team_with_another_agent_map_is_refused(mdp: sim.TurnTakingMDP, consumer: str) -> None:
    with pytest.raises(sim.TeamMismatchError, match="agent map differs from the MDP's at 12"):
        CONSUMERS[consumer](mdp, swapped_map_team(mdp))


@pytest.mark.parametrize("consumer", list(CONSUMERS))
def test_team_of_another_shape_or_size_is_refused(mdp: sim.TurnTakingMDP, consumer: str) -> None:
    three_agents = team_with_map(mdp, np.arange(S) % 3)
    with pytest.raises(sim.TeamMismatchError, match="the team has 3 agents but the MDP has 2"):
        CONSUMERS[consumer](mdp, three_agents)
    wider = sim.TabularTeam(np.full((S, A + 1), 1.0 / (A + 1)), mdp.agent_of_state)
    with pytest.raises(sim.TeamMismatchError, match=r"shape \(12, 4\) but the MDP has"):
        CONSUMERS[consumer](mdp, wider)


def test_fitting_team_passes_and_shares_the_mdps_map(mdp: sim.TurnTakingMDP) -> None:
    team = sim.random_team(mdp, 0)
    assert team.agent_of_state is mdp.agent_of_state
    assert team.with_agent(1, team.agent(1)).agent_of_state is mdp.agent_of_state
    # An equal map built independently fits too.
    copy = sim.TabularTeam(team.table, mdp.agent_of_state.tolist())
    np.testing.assert_allclose(sim.evaluate(mdp, copy).J, sim.evaluate(mdp, team).J, rtol=1e-12)


def test_run_stage_refuses_before_changing_anything(mdp: sim.TurnTakingMDP) -> None:
    seen: list[Any] = []
    with pytest.raises(sim.TeamMismatchError):
        run_stage(
            swapped_map_team(mdp),
            sim.ExactSampler(mdp),
            sim.ExactUpdater(mdp),
            StageConfig(radius=0.1),
            mdp.penalty_model(),
            on_update=seen.append,
        )
    assert seen == []


BAD_MAPS = {
    "negative": ([0, 1, -1, 0], "state 2 has agent -1"),
    "fraction": ([0, 1, 0.5, 0], "state 2 has 0.5"),
    "nan": ([0, 1, np.nan, 0], "state 2 has nan"),
    "bool": ([True, False, True, False], "must hold integers"),
    "gap": ([0, 3, 0, 1], r"agent\(s\) 2 act in no state while agent 3 does"),
    "huge": ([0, 2**40, 0, 1], "state 1 has agent 1099511627776 but there are only 4 states"),
    "huge float": ([0, 1e300, 0, 1], "but there are only 4 states"),
    "shape": ([0, 1, 0], r"agent_of_state must have shape \(S,\) = \(4,\)"),
}


@pytest.mark.parametrize("case", list(BAD_MAPS))
def test_bad_agent_maps_are_refused_by_team_and_mdp(case: str) -> None:
    agent_of_state, message = BAD_MAPS[case]
    with pytest.raises(sim.PolicyValidationError, match=message):
        sim.TabularTeam(np.full((4, 2), 0.5), agent_of_state)
    P = np.full((4, 2, 4), 0.25)
    with pytest.raises(sim.MDPValidationError, match=message):
        sim.TurnTakingMDP(P, np.zeros((4, 2)), np.full(4, 0.25), 0.9, agent_of_state)


def test_ids_with_gaps_are_accepted_only_when_n_agents_is_given() -> None:
    with pytest.raises(sim.PolicyValidationError, match=r"2, 3, 4 act in no state .* n_agents=6"):
        sim.TabularTeam(np.full((6, 2), 0.5), [0, 5, 0, 1, 1, 0])
    team = sim.TabularTeam(np.full((6, 2), 0.5), [0, 5, 0, 1, 1, 0], n_agents=6)
    assert team.n_agents == 6 and not team.states_of(3).any()
    P = np.full((6, 2, 6), 1 / 6)
    mdp = sim.TurnTakingMDP(
        P, np.ones((6, 2)), np.full(6, 1 / 6), 0.5, [0, 5, 0, 1, 1, 0], n_agents=6
    )
    np.testing.assert_allclose(sim.evaluate(mdp, team).J, 2.0, rtol=1e-12)
    with pytest.raises(sim.MDPValidationError, match="n_agents = 7 exceeds the number of states"):
        sim.TurnTakingMDP(P, np.ones((6, 2)), np.full(6, 1 / 6), 0.5, [0] * 6, n_agents=7)
    with pytest.raises(sim.PolicyValidationError, match="state 1 has agent 5"):
        sim.TabularTeam(np.full((6, 2), 0.5), [0, 5, 0, 1, 1, 0], n_agents=5)
    with pytest.raises(sim.PolicyValidationError, match="n_agents must be an int >= 1"):
        sim.TabularTeam(np.full((6, 2), 0.5), [0] * 6, n_agents=0)


def overflowing_mdp(horizon: int | None) -> sim.TurnTakingMDP:
    P = np.full((2, 2, 2), 0.5)
    R = np.full((2, 2), 1e308)
    gamma = 0.9 if horizon is None else 1.0
    return sim.TurnTakingMDP(P, R, [1.0, 0.0], gamma, [0, 0], horizon)


@pytest.mark.parametrize("horizon", [None, 3])
def test_overflowing_values_raise_without_warnings(horizon: int | None) -> None:
    mdp = overflowing_mdp(horizon)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(sim.NonFiniteResultError, match=r"V is not finite \(V\[0") as error:
            sim.evaluate(mdp, sim.uniform_team(mdp))
        with pytest.raises(sim.NonFiniteResultError):
            sim.ExactSampler(mdp).sample(sim.uniform_team(mdp))
    assert "Rescale the rewards" in str(error.value)


def test_overflow_in_the_threaded_krylov_solver_raises_without_warnings() -> None:
    """The iterative solver runs on worker threads, whose numpy error state is their own."""
    base = sim.random_mdp(2000, 3, 2, gamma=0.9, seed=0)
    mdp = sim.TurnTakingMDP(base.P, base.R * 1e308, base.rho0, 0.9, base.agent_of_state)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(sim.NonFiniteResultError, match="V is not finite"):
            sim.evaluate(mdp, sim.uniform_team(mdp), method="krylov-gmres")


def test_updater_refuses_non_finite_rollouts(mdp: sim.TurnTakingMDP) -> None:
    rollouts = sim.ExactSampler(mdp).sample(sim.uniform_team(mdp))
    advantage = rollouts.advantage.copy()
    advantage[3, 1] = np.nan
    broken = sim.TabularRollouts(
        rollouts.behaviour, rollouts.occupancy, advantage, rollouts.surrogate_scale
    )
    with pytest.raises(sim.NonFiniteResultError, match=r"advantage is not finite at \(3, 1\)"):
        sim.ExactUpdater(mdp).update(sim.uniform_team(mdp), 0, broken, 0.1)
    short = sim.TabularRollouts(
        rollouts.behaviour, rollouts.occupancy[:-1], rollouts.advantage, rollouts.surrogate_scale
    )
    with pytest.raises(sim.TeamMismatchError, match="do not fit the MDP"):
        sim.ExactUpdater(mdp).update(sim.uniform_team(mdp), 0, short, 0.1)


def test_updater_handles_advantage_spreads_beyond_float_range() -> None:
    """A-hat in [-1.7e308, 1.7e308]: max - min overflows, the update must not.

    Both maximisers depend on A-hat / temperature only, so the update on A-hat and on
    A-hat * 1e-300 must be the same policy.
    """
    mdp = sim.random_mdp(6, 3, 1, gamma=0.5, seed=1)
    team = sim.random_team(mdp, 1)
    occupancy = np.full(6, 1 / 6)
    unit = np.random.default_rng(1).uniform(-1.0, 1.0, size=(6, 3))
    unit[:, 0], unit[:, 1] = 0.95, -0.95
    for direction in ("reverse", "forward"):
        updates = []
        for scale in (1.7e308, 1.7e8):
            rollouts = sim.TabularRollouts(team, occupancy, unit * scale, 1.0)
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                updater = sim.ExactUpdater(mdp, direction)
                updates.append(updater.update(team, 0, rollouts, 0.05))
        np.testing.assert_allclose(updates[0].policy, updates[1].policy, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(updates[0].kl, 0.05, rtol=1e-8)
        assert np.isfinite(updates[0].surrogate) and np.isfinite(updates[0].advantage_bound)


@pytest.mark.parametrize("rtol", [0.0, -1.0, float("nan"), float("inf"), 1.0, True, "1e-9"])
def test_solver_tolerance_is_validated_at_once(mdp: sim.TurnTakingMDP, rtol: Any) -> None:
    # A ValueError, not the SolverError that rtol <= 0 used to end in after ~40,000 products.
    large = sim.random_mdp(2000, 3, 2, gamma=0.9, seed=0)
    with pytest.raises(ValueError, match=r"rtol must be a real number in \(0, 1\)"):
        sim.evaluate(large, sim.uniform_team(large), rtol=rtol, method="krylov-gmres")
    with pytest.raises(ValueError, match=r"rtol must be a real number in \(0, 1\)"):
        sim.ExactSampler(mdp, rtol=rtol)


def test_unknown_solver_method_is_refused_even_when_unused() -> None:
    episodic = sim.random_mdp(10, 2, 2, horizon=4, seed=0)
    with pytest.raises(ValueError, match="method must be one of auto, direct-lu"):
        sim.evaluate(episodic, sim.uniform_team(episodic), method="lu")


def test_tiny_positive_tolerance_fails_fast_with_the_residual_reached() -> None:
    mdp = sim.random_mdp(2000, 3, 2, gamma=0.999, seed=0)
    with pytest.raises(sim.SolverError, match="stopped at relative residual") as error:
        sim.evaluate(mdp, sim.uniform_team(mdp), rtol=1e-15, method="krylov-gmres")
    products = int(str(error.value).split(" after ")[1].split()[0])
    assert products < 1000


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.integers(-3, 12), min_size=1, max_size=10), st.none() | st.integers(1, 14))
def test_agent_ids_rule(ids: list[int], n_agents: int | None) -> None:
    """Accepted iff ids are 0..max with none missing (or, given n, all in [0, n) and n <= S)."""
    n_states = len(ids)
    if n_agents is None:
        valid = min(ids) >= 0 and set(ids) == set(range(max(ids) + 1))
    else:
        valid = min(ids) >= 0 and max(ids) < n_agents <= n_states
    try:
        team = sim.TabularTeam(np.full((n_states, 2), 0.5), ids, n_agents=n_agents)
    except sim.PolicyValidationError:
        assert not valid
        return
    assert valid
    assert team.n_agents == (max(ids) + 1 if n_agents is None else n_agents)
    np.testing.assert_array_equal(team.agent_of_state, ids)
