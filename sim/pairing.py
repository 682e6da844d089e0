"""Episodes as flat arrays, and what pairs an update's continuation with the episodes it continues.

A pair (``teamtr.measured``) is one held-out episode of pi_hat^{i-1} and its continuation by
pi_hat^i from agent k's first turn; the difference of their return estimates has expectation
J(pi_hat^i) - J(pi_hat^{i-1}). The core's confidence bounds need estimates in a bounded range:

* episodic (horizon H, gamma = 1): the episode's return, between the least and the largest
  return of any path the MDP allows from rho0 (dynamic programming over P's support, whatever
  the policies);
* discounted, with the geometric termination of ``sim.env``: r(s_L, a_L) / (1 - gamma) at the
  episode's last step L. P(L = t) = (1 - gamma) gamma^t, so E = sum_t gamma^t E[r_t] = J
  exactly, in [min R, max R] / (1 - gamma) over the reachable states; the sum of rewards has
  the same mean but no bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from sim.mdp import TurnTakingMDP

Array = NDArray[np.float64]


@dataclass(frozen=True)
class EpisodeBatch:
    """Flat arrays over every step of a batch of episodes."""

    episode: NDArray[np.int64]
    """Which episode each step belongs to (0 .. n_episodes - 1); an episode's steps are
    contiguous and in time order."""
    time: NDArray[np.int64]
    state: NDArray[np.int64]
    action: NDArray[np.int64]
    reward: Array
    return_to_go: Array
    """Undiscounted sum of this and later rewards of the episode (see ``sim.env``)."""
    n_episodes: int
    seeds: NDArray[np.int64] | None = None
    """Per episode, the seed of its random numbers where it was played coupled
    (``sim.coupling``: a continuation reads the same numbers); None otherwise."""


@dataclass
class Steps:
    """Steps appended one by one (or copied from a batch), then frozen into an EpisodeBatch."""

    episode: list[int] = field(default_factory=list)
    time: list[int] = field(default_factory=list)
    state: list[int] = field(default_factory=list)
    action: list[int] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)

    def append(self, e: int, t: int, state: int, action: int, reward: float) -> None:
        self.episode.append(e)
        self.time.append(t)
        self.state.append(state)
        self.action.append(action)
        self.reward.append(reward)

    def extend(self, batch: EpisodeBatch, indices: NDArray[np.int64], e: int) -> None:
        """Copy the steps ``indices`` of ``batch`` as steps of episode ``e``."""
        self.episode.extend([e] * indices.size)
        self.time.extend(batch.time[indices].tolist())
        self.state.extend(batch.state[indices].tolist())
        self.action.extend(batch.action[indices].tolist())
        self.reward.extend(batch.reward[indices].tolist())

    def batch(self, n_episodes: int, seeds: NDArray[np.int64] | None = None) -> EpisodeBatch:
        episode = np.asarray(self.episode, dtype=np.int64)
        reward = np.asarray(self.reward, dtype=np.float64)
        return EpisodeBatch(
            episode=episode,
            time=np.asarray(self.time, dtype=np.int64),
            state=np.asarray(self.state, dtype=np.int64),
            action=np.asarray(self.action, dtype=np.int64),
            reward=reward,
            return_to_go=returns_to_go(episode, reward),
            n_episodes=n_episodes,
            seeds=seeds,
        )


def returns_to_go(episode: NDArray[np.int64], reward: Array) -> Array:
    """Sum of the rewards from each step to the end of its episode (steps are contiguous)."""
    if reward.size == 0:
        return reward.copy()
    total = np.cumsum(reward[::-1])[::-1]
    last_index = np.flatnonzero(np.r_[episode[1:] != episode[:-1], True])
    after_episode = np.zeros(reward.size)
    ends = np.searchsorted(last_index, np.arange(reward.size))
    following = last_index[ends] + 1
    inside = following < reward.size
    after_episode[inside] = total[following[inside]]
    return total - after_episode


def first_turns(mdp: TurnTakingMDP, batch: EpisodeBatch, agent: int) -> NDArray[np.int64]:
    """Per episode, the index (into the batch's steps) of ``agent``'s first turn; -1 if none."""
    first = np.full(batch.n_episodes, -1, dtype=np.int64)
    own = np.flatnonzero(mdp.agent_of_state[batch.state] == agent)
    # Steps are in episode order, so the first occurrence of each episode is its first turn.
    episodes, where = np.unique(batch.episode[own], return_index=True)
    first[episodes] = own[where]
    return first


def return_estimates(mdp: TurnTakingMDP, batch: EpisodeBatch) -> Array:
    """One bounded unbiased estimate of J per episode (module docstring)."""
    if mdp.horizon is not None:
        sums = np.bincount(batch.episode, weights=batch.reward, minlength=batch.n_episodes)
        return sums.astype(np.float64)
    last = np.r_[batch.episode[1:] != batch.episode[:-1], True]
    estimates = np.zeros(batch.n_episodes)
    estimates[batch.episode[last]] = batch.reward[last] / (1.0 - mdp.gamma)
    return estimates


def _successor_extreme(mdp: TurnTakingMDP, values: Array, largest: bool) -> Array:
    """max (or min) of ``values`` over the support of P(.|s, a), as an S x A array."""
    P = mdp.P
    fill = -np.inf if largest else np.inf
    candidates = np.where(P.data > 0, values[P.indices], fill)
    reduce = np.maximum if largest else np.minimum
    extreme = reduce.reduceat(candidates, P.indptr[:-1])
    return np.asarray(extreme).reshape(mdp.n_states, mdp.n_actions)


def reachable_states(mdp: TurnTakingMDP) -> NDArray[np.bool_]:
    """States some policy reaches from rho0's support (P's support, every action)."""
    reached = mdp.rho0 > 0
    frontier = reached.copy()
    support = mdp.P.copy()
    support.data = (support.data > 0).astype(np.float64)
    while frontier.any():
        rows = (frontier[:, None] & np.ones(mdp.n_actions, dtype=bool)).ravel()
        following = np.asarray(support[rows].sum(axis=0)).ravel() > 0
        frontier = following & ~reached
        reached |= following
    return reached


def estimate_range(mdp: TurnTakingMDP) -> tuple[float, float]:
    """Where every ``return_estimates`` value lies, whatever the team (module docstring)."""
    if mdp.horizon is None:
        rewards = mdp.R[reachable_states(mdp)]
        scale = 1.0 / (1.0 - mdp.gamma)
        return float(rewards.min()) * scale, float(rewards.max()) * scale
    highest = np.zeros(mdp.n_states)
    lowest = np.zeros(mdp.n_states)
    for _ in range(mdp.horizon):
        highest = (mdp.R + _successor_extreme(mdp, highest, largest=True)).max(axis=1)
        lowest = (mdp.R + _successor_extreme(mdp, lowest, largest=False)).min(axis=1)
    start = mdp.rho0 > 0
    return float(lowest[start].min()), float(highest[start].max())


def estimate_width(mdp: TurnTakingMDP) -> float:
    """The width of ``estimate_range``, the w of ``teamtr.measured.PairedDifferences``."""
    low, high = estimate_range(mdp)
    # A constant return gives differences of exactly 0; a positive width keeps the bound defined.
    return max(high - low, float(np.finfo(float).tiny))
