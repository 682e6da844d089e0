"""TabularTeam is an immutable value; with_agent touches only the agent's rows."""

from __future__ import annotations

import numpy as np
import pytest

import sim
from teamtr.protocols import AgentUpdater, Rollouts, Sampler, TeamPolicy


def test_with_agent_copies_only_that_agents_rows() -> None:
    mdp = sim.random_mdp(20, 3, 3, seed=0)
    team = sim.random_team(mdp, 0)
    other = sim.random_team(mdp, 1)
    new = team.with_agent(1, other.table)
    mine = mdp.agent_of_state == 1
    np.testing.assert_array_equal(new.table[mine], other.table[mine])
    np.testing.assert_array_equal(new.table[~mine], team.table[~mine])
    assert new.changed_agents(team) == [1]
    assert team.changed_agents(team) == []


def test_team_is_immutable() -> None:
    mdp = sim.random_mdp(10, 2, 2, seed=0)
    team = sim.uniform_team(mdp)
    with pytest.raises(ValueError):
        team.table[0, 0] = 1.0
    copy = team.agent(0)
    copy[:] = 0.0
    np.testing.assert_allclose(team.table, 0.5)


def test_bad_policies_and_indices_are_rejected() -> None:
    mdp = sim.random_mdp(10, 2, 2, seed=0)
    team = sim.uniform_team(mdp)
    bad = team.agent(0)
    bad[np.flatnonzero(mdp.agent_of_state == 0)[0]] = [0.7, 0.7]
    with pytest.raises(sim.PolicyValidationError, match="sums to"):
        team.with_agent(0, bad)
    with pytest.raises(IndexError):
        team.agent(2)
    with pytest.raises(sim.PolicyValidationError, match="shape"):
        team.with_agent(0, np.ones((3, 2)) / 2)


def test_random_team_is_seeded_and_stochastic() -> None:
    mdp = sim.random_mdp(30, 4, 2, seed=0)
    first, second = sim.random_team(mdp, 7), sim.random_team(mdp, 7)
    np.testing.assert_array_equal(first.table, second.table)
    np.testing.assert_allclose(first.table.sum(axis=1), 1.0, atol=1e-14)
    peaked = sim.random_team(mdp, 7, concentration=0.05)
    assert peaked.table.max(axis=1).mean() > first.table.max(axis=1).mean()


def test_backend_satisfies_the_core_protocols() -> None:
    mdp = sim.random_mdp(10, 2, 2, seed=0)
    team = sim.uniform_team(mdp)
    assert isinstance(team, TeamPolicy)
    assert isinstance(sim.ExactSampler(mdp), Sampler)
    assert isinstance(sim.SampledSampler(mdp, 5), Sampler)
    assert isinstance(sim.ExactUpdater(mdp), AgentUpdater)
    assert isinstance(sim.ExactSampler(mdp).sample(team), Rollouts)
