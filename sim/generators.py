"""Seeded families of turn-taking MDPs, built with vectorised numpy (1e6 states in seconds).

* ``random_mdp``: every (s, a) moves to a few random successors; agents own random states.
* ``tree_mdp``: a rooted tree in heap order (children of s are b s + 1 .. b s + b), leaves
  absorbing; the agent of a state is its depth mod n. Its kernel is triangular, which
  ``sim.evaluate`` solves directly.
* ``coordination_game``: a ring of agents where each agent's best response depends on what
  the others do (see the function's docstring).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

from sim.mdp import TurnTakingMDP


def _gamma_for(gamma: float | None, horizon: int | None) -> float:
    if gamma is None:
        return 1.0 if horizon is not None else 0.9
    return gamma


def _random_rows(
    rng: np.random.Generator, n_rows: int, n_columns: int, width: int
) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """``width`` random columns per row with Dirichlet(1) weights (sorted, may repeat)."""
    columns = np.sort(rng.integers(0, n_columns, size=(n_rows, width)), axis=1)
    weights = rng.exponential(size=(n_rows, width))
    weights /= weights.sum(axis=1, keepdims=True)
    return columns, weights


def random_mdp(
    n_states: int,
    n_actions: int,
    n_agents: int,
    gamma: float | None = None,
    seed: int | np.random.Generator | None = 0,
    successors: int = 4,
    sparse: bool = True,
    horizon: int | None = None,
) -> TurnTakingMDP:
    """A random turn-taking MDP.

    Each (s, a) has ``successors`` next states drawn uniformly (duplicates merge) with
    Dirichlet(1) probabilities; r(s,a) ~ U[0, 1); rho0 ~ Dirichlet(1); each agent owns about
    S/n states, assigned at random. ``gamma`` defaults to 0.9, or 1 with a ``horizon``.
    ``sparse=False`` passes P to the MDP as a dense S x A x S array (small S only).
    """
    if n_states < n_agents:
        raise ValueError(f"need at least one state per agent: n_states={n_states} < {n_agents}")
    rng = np.random.default_rng(seed)
    width = min(successors, n_states)
    columns, weights = _random_rows(rng, n_states * n_actions, n_states, width)
    transitions = sp.csr_matrix(
        (weights.ravel(), columns.ravel().astype(np.int32), np.arange(0, columns.size + 1, width)),
        shape=(n_states * n_actions, n_states),
    )
    rewards = rng.random((n_states, n_actions))
    start = rng.exponential(size=n_states)
    start /= start.sum()
    agents = rng.permutation(n_states) % n_agents
    P = transitions if sparse else transitions.toarray().reshape(n_states, n_actions, n_states)
    return TurnTakingMDP(
        P, rewards, start, _gamma_for(gamma, horizon), agents, horizon, n_agents=n_agents
    )


def heap_depths(n_states: int, branching: int) -> NDArray[np.int64]:
    """Depth of every node of a ``branching``-ary tree stored in heap order."""
    depth = np.zeros(n_states, dtype=np.int64)
    first, size = 1, branching
    level = 1
    while first < n_states:
        depth[first : first + size] = level
        first += size
        size *= branching
        level += 1
    return depth


def tree_mdp(
    n_states: int,
    n_actions: int = 4,
    n_agents: int = 2,
    gamma: float | None = None,
    seed: int | np.random.Generator | None = 0,
    branching: int = 4,
    horizon: int | None = None,
) -> TurnTakingMDP:
    """A tree: action a in s moves to s's children with Dirichlet(1) probabilities.

    Leaves are absorbing. States are in heap order, so every transition goes to a larger
    index (the team kernel is upper triangular). Agent of s = depth(s) mod n_agents: agents
    take turns down the tree. The episode starts at the root.
    """
    if branching < 1:
        raise ValueError(f"branching must be >= 1, got {branching}")
    rng = np.random.default_rng(seed)
    states = np.arange(n_states)
    first_child = branching * states + 1
    n_children = np.clip(n_states - first_child, 0, branching)
    is_leaf = n_children == 0
    rows = n_states * n_actions
    # Internal nodes: the children b s + 1 .. b s + b (the last node may have fewer).
    offsets = np.arange(branching)
    children = first_child[:, None] + offsets[None, :]
    valid = offsets[None, :] < n_children[:, None]
    children = np.where(valid, children, states[:, None])
    weights = rng.exponential(size=(n_states, n_actions, branching))
    weights *= valid[:, None, :]
    # Leaves: all mass on the self-loop stored in the first slot.
    weights[is_leaf, :, 0] = 1.0
    weights /= weights.sum(axis=2, keepdims=True)
    columns = np.broadcast_to(children[:, None, :], (n_states, n_actions, branching))
    transitions = sp.csr_matrix(
        (
            weights.ravel(),
            columns.reshape(-1).astype(np.int32),
            np.arange(0, rows * branching + 1, branching),
        ),
        shape=(rows, n_states),
    )
    rewards = rng.random((n_states, n_actions))
    start = np.zeros(n_states)
    start[0] = 1.0
    agents = heap_depths(n_states, branching) % n_agents
    return TurnTakingMDP(
        transitions,
        rewards,
        start,
        _gamma_for(gamma, horizon),
        agents,
        horizon,
        n_agents=n_agents,
    )


def coordination_game(
    n_agents: int,
    n_actions: int = 3,
    gamma: float | None = None,
    seed: int | np.random.Generator | None = 0,
    horizon: int | None = None,
    coordination_reward: float = 1.0,
    preference_scale: float = 0.5,
    noise: float = 0.1,
) -> TurnTakingMDP:
    """Agents 0..n-1 speak in a ring; each is paid for agreeing with the previous speaker.

    State (i, x), index i * m + x: agent i is to act and the previous speaker said x. Agent i
    says y and receives ``coordination_reward`` * [y == x] + pref_i(y), with private
    preferences pref_i ~ ``preference_scale`` * U[-1, 1) that conflict between agents. Next
    state ((i + 1) mod n, y), or with probability ``noise`` a uniformly random word instead
    of y. Agent i's Q(y) = reward + gamma V((i+1) mod n, y): whether saying y pays depends on
    whether the next agent will agree with y, so a later agent's best response depends on
    the earlier agents' behaviour around the ring (and the other way round).
    """
    if n_agents < 1 or n_actions < 1:
        raise ValueError(f"need n_agents >= 1 and n_actions >= 1, got {n_agents}, {n_actions}")
    if not 0.0 <= noise <= 1.0:
        raise ValueError(f"noise must lie in [0, 1], got {noise!r}")
    rng = np.random.default_rng(seed)
    m = n_actions
    n_states = n_agents * m
    preference = preference_scale * rng.uniform(-1.0, 1.0, size=(n_agents, m))
    speaker = np.repeat(np.arange(n_agents), m)
    previous = np.tile(np.arange(m), n_agents)
    rewards = coordination_reward * (previous[:, None] == np.arange(m)[None, :])
    rewards = rewards + preference[speaker]
    P = np.full((n_states, m, n_states), 0.0)
    next_block = ((speaker + 1) % n_agents) * m
    for y in range(m):
        P[np.arange(n_states)[:, None], y, next_block[:, None] + np.arange(m)[None, :]] += noise / m
        P[np.arange(n_states), y, next_block + y] += 1.0 - noise
    start = np.zeros(n_states)
    start[:m] = 1.0 / m
    return TurnTakingMDP(
        P, rewards, start, _gamma_for(gamma, horizon), speaker, horizon, n_agents=n_agents
    )
