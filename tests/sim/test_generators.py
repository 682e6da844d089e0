"""Generated families: seeding, structure, scale, and the coordination property."""

from __future__ import annotations

import numpy as np
import pytest

import sim
import sim.linear


def test_random_mdp_is_seeded() -> None:
    first = sim.random_mdp(50, 3, 2, seed=1)
    second = sim.random_mdp(50, 3, 2, seed=1)
    other = sim.random_mdp(50, 3, 2, seed=2)
    assert (first.P != second.P).nnz == 0 and np.array_equal(first.R, second.R)
    assert (first.P != other.P).nnz > 0


def test_random_mdp_structure() -> None:
    mdp = sim.random_mdp(2000, 4, 5, gamma=0.95, seed=0, successors=4)
    row_lengths = np.diff(mdp.P.indptr)
    assert row_lengths.max() <= 4 and row_lengths.mean() > 3.9
    assert np.bincount(mdp.agent_of_state).tolist() == [400] * 5
    dense = sim.random_mdp(20, 2, 2, seed=0, sparse=False)
    assert (dense.P != sim.random_mdp(20, 2, 2, seed=0).P).nnz == 0


def test_random_mdp_scales_to_many_states() -> None:
    mdp = sim.random_mdp(200_000, 4, 3, gamma=0.9, seed=0)
    assert mdp.P.shape == (800_000, 200_000) and mdp.P.indices.dtype == np.int32


def test_tree_mdp_kernel_is_upper_triangular() -> None:
    mdp = sim.tree_mdp(1000, n_actions=3, n_agents=3, seed=0, branching=3)
    kernel = sim.policy_kernel(mdp, sim.uniform_team(mdp).table)
    assert sim.linear._triangular_side(kernel) == "upper"
    depth = sim.generators.heap_depths(1000, 3)
    np.testing.assert_array_equal(mdp.agent_of_state, depth % 3)
    assert depth[0] == 0 and depth[1] == 1 and depth[4] == 2


def test_tree_leaves_are_absorbing() -> None:
    mdp = sim.tree_mdp(21, n_actions=2, branching=4, seed=0)
    dense = mdp.transitions_dense()
    for leaf in range(5, 21):
        np.testing.assert_array_equal(dense[leaf, :, leaf], 1.0)


@pytest.mark.parametrize("seed", range(3))
def test_later_agents_best_response_depends_on_earlier_agent(seed: int) -> None:
    mdp = sim.coordination_game(2, n_actions=3, gamma=0.9, seed=seed)
    m = mdp.n_actions
    copy = np.zeros((mdp.n_states, m))
    copy[np.arange(mdp.n_states), np.tile(np.arange(m), 2)] = 1.0
    favourite = np.zeros((mdp.n_states, m))
    favourite[:, int(np.argmax(mdp.R[0] - np.eye(m)[0]))] = 1.0
    copying = sim.TabularTeam(copy, mdp.agent_of_state)
    stubborn = copying.with_agent(0, favourite)
    agent_one = mdp.agent_of_state == 1
    best_when_copying = sim.evaluate(mdp, copying).Q[agent_one].argmax(axis=1)
    best_when_stubborn = sim.evaluate(mdp, stubborn).Q[agent_one].argmax(axis=1)
    assert np.any(best_when_copying != best_when_stubborn)


def test_coordination_game_episodic_variant() -> None:
    mdp = sim.coordination_game(3, horizon=6, seed=0)
    assert mdp.horizon == 6 and mdp.gamma == 1.0
    assert mdp.n_states == 9 and mdp.n_agents == 3
