"""Coupled continuations: common random numbers between a held-out episode and its
continuation by the updated team.

Each coupled episode has a seed of its own; every random number of its step t (the action's,
the transition's and, discounted, the termination's) is a fixed function of (seed, t), and
actions and next states are drawn by inverting their cumulative distributions. The old
episode reads the numbers of every step; its continuation by the new team from the updated
agent's first turn (step t0) reads those of steps t0, t0 + 1, ... of the same seed. Those were
not read by the kept prefix (steps before t0), so the continuation is an exact draw of the new
team given the prefix, as an uncoupled one: the pairs' mean is still J(new) - J(old). But where
the two teams act alike, the same numbers give the same action and the same next state, so the
continuation repeats the old episode and the difference is 0 (common random numbers; an
inverse-CDF coupling, whose actions differ with probability at most the total variation of the
two policies at the state).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from sim.mdp import TurnTakingMDP
from sim.pairing import Steps

CHUNK = 64
"""Steps whose numbers one generator call draws (an episode's numbers come in chunks)."""


class StepNumbers:
    """The random numbers of one coupled episode, (action, transition, termination) per step,
    each a function of (seed, step) alone."""

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)
        self._chunks: dict[int, NDArray[np.float64]] = {}

    def _generator(self, key: int) -> np.random.Generator:
        # Distinct spawn keys, all >= 1, give independent streams; entropy lists such as
        # [seed] and [seed, 0] would not (SeedSequence treats them alike).
        return np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=(key,)))

    def start(self) -> float:
        """The number that draws the episode's first state."""
        return float(self._generator(1).random())

    def at(self, t: int) -> NDArray[np.float64]:
        """The three numbers of step ``t``."""
        chunk = t // CHUNK
        if chunk not in self._chunks:
            self._chunks[chunk] = self._generator(2 + chunk).random((CHUNK, 3))
        return self._chunks[chunk][t % CHUNK]


def inverse_cdf(cumulative: NDArray[np.float64], u: float) -> int:
    """The index whose cumulative interval holds u (scaled to the row's total)."""
    position = int(np.searchsorted(cumulative, u * cumulative[-1], side="right"))
    return min(position, cumulative.size - 1)


def first_state(mdp: TurnTakingMDP, numbers: StepNumbers) -> int:
    return inverse_cdf(np.cumsum(mdp.rho0), numbers.start())


def play_coupled(
    mdp: TurnTakingMDP,
    cumulative: NDArray[np.float64],
    numbers: StepNumbers,
    e: int,
    state: int,
    t: int,
    steps: Steps,
    max_steps: int | None = None,
) -> None:
    """Play episode ``e`` from ``state`` at step ``t`` to its end with the team whose rows'
    cumulative sums are ``cumulative``, step t' reading ``numbers.at(t')``: the dynamics of
    ``sim.env.TurnTakingEnv`` (reward R[s, a], next state from P, the horizon's truncation or,
    discounted, termination with probability 1 - gamma after each step)."""
    P, n_actions = mdp.P, mdp.n_actions
    while True:
        u_action, u_next, u_end = numbers.at(t)
        action = inverse_cdf(cumulative[state], u_action)
        reward = float(mdp.R[state, action])
        row = state * n_actions + action
        begin, end = int(P.indptr[row]), int(P.indptr[row + 1])
        following = int(P.indices[begin + inverse_cdf(np.cumsum(P.data[begin:end]), u_next)])
        steps.append(e, t, state, action, reward)
        t += 1
        state = following
        if mdp.horizon is not None:
            done = t >= mdp.horizon
        else:
            done = bool(u_end >= mdp.gamma)
        if done or (max_steps is not None and t >= max_steps):
            break
