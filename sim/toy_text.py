"""Gymnasium toy-text environments (FrozenLake, CliffWalking, Taxi, ...) as TurnTakingMDPs.

A toy-text environment publishes its dynamics as ``env.unwrapped.P``, a dict
``{s: {a: [(probability, next_state, reward, terminated), ...]}}``, and ``step()`` samples
from it. Reading that table into an MDP needs one care: when ``terminated`` is set, the
episode ends after that transition, whatever the table says about the state it lands in
(CliffWalking's goal and Taxi's drop-off state keep charging -1 per step if one steps on from
them; FrozenLake's holes happen to loop with reward 0). ``from_gymnasium`` therefore sends
every terminating transition to one absorbing state with reward 0, so that

    J(pi) = E[sum_t gamma^t r_t over one Gymnasium episode]      (THEORY.md §1)

with no time limit (discounted), or with Gymnasium's time limit H when ``horizon=H``
(episodic, gamma = 1: ``TimeLimit`` truncates after H steps, and so does the MDP).

Turn-taking (``n_agents = n``): the turn passes to the next agent after every step, so agent
``t mod n`` acts at step t. The state records whose turn it is:

    state index  turn * S_env + s      for turn in 0..n-1 and environment state s,
    state index  n * S_env             the absorbing state (agent 0's, reward 0),

episodes start at turn 0 (agent 0) in the environment's initial-state distribution, and
agent(turn * S_env + s) = turn. With n = 1 this is the environment itself plus the absorbing
state. ``alternating_team`` builds the team in which agent k plays a given S_env x A table.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp
from gymnasium import spaces
from numpy.typing import ArrayLike, NDArray

from sim.mdp import STOCHASTIC_ATOL, MDPValidationError, TurnTakingMDP
from sim.team import PolicyValidationError, TabularTeam, validate_policy


class GymnasiumConversionError(ValueError):
    """An environment that cannot be read as a TurnTakingMDP; the message says why."""


def _discrete_size(space: Any, what: str) -> int:
    if not isinstance(space, spaces.Discrete) or int(space.start) != 0:
        raise GymnasiumConversionError(
            f"the {what} space must be Discrete(n) starting at 0, got {space!r}"
        )
    return int(space.n)


def _outcomes(
    table: Any, n_states: int, n_actions: int
) -> tuple[NDArray[np.int64], NDArray[np.float64], NDArray[np.int64], Any, NDArray[np.bool_]]:
    """The table as flat arrays over every listed outcome: (row s*A + a, p, s', r, terminated)."""
    rows: list[int] = []
    probabilities: list[float] = []
    targets: list[int] = []
    rewards: list[float] = []
    ends: list[bool] = []
    for s in range(n_states):
        by_action = table.get(s) if isinstance(table, dict) else None
        if by_action is None:
            raise GymnasiumConversionError(f"env.unwrapped.P has no entry for state {s}")
        for a in range(n_actions):
            outcomes = by_action.get(a)
            if not outcomes:
                raise GymnasiumConversionError(
                    f"env.unwrapped.P[{s}] has no outcomes for action {a}"
                )
            for outcome in outcomes:
                if len(outcome) != 4:
                    raise GymnasiumConversionError(
                        f"env.unwrapped.P[{s}][{a}] holds {outcome!r}; expected "
                        "(probability, next_state, reward, terminated)"
                    )
                probability, target, reward, terminated = outcome
                if not 0 <= int(target) < n_states or int(target) != target:
                    raise GymnasiumConversionError(
                        f"env.unwrapped.P[{s}][{a}] leads to state {target!r}, outside "
                        f"Discrete({n_states})"
                    )
                rows.append(s * n_actions + a)
                probabilities.append(float(probability))
                targets.append(int(target))
                rewards.append(float(reward))
                ends.append(bool(terminated))
    return (
        np.asarray(rows, dtype=np.int64),
        np.asarray(probabilities, dtype=np.float64),
        np.asarray(targets, dtype=np.int64),
        np.asarray(rewards, dtype=np.float64),
        np.asarray(ends, dtype=np.bool_),
    )


def _initial_distribution(env: Any, n_states: int, given: ArrayLike | None) -> NDArray[Any]:
    if given is not None:
        start = np.asarray(given, dtype=np.float64)
        source = "initial_distribution"
    else:
        for name in ("initial_state_distrib", "isd"):
            if getattr(env, name, None) is not None:
                start = np.asarray(getattr(env, name), dtype=np.float64)
                source = f"env.unwrapped.{name}"
                break
        else:
            raise GymnasiumConversionError(
                "the environment publishes no initial-state distribution "
                "(initial_state_distrib or isd): pass initial_distribution=..."
            )
    if start.shape != (n_states,):
        raise GymnasiumConversionError(f"{source} must have shape ({n_states},), got {start.shape}")
    return start


def _check_step_follows_table(env: Any) -> None:
    """Refuse the known environments whose ``step()`` departs from their own table P."""
    if getattr(env, "fickle_passenger", False):
        raise GymnasiumConversionError(
            "Taxi with fickle_passenger=True changes the destination inside step(), which its "
            "table P does not describe; make the environment with fickle_passenger=False"
        )


def from_gymnasium(
    env: Any,
    gamma: float,
    n_agents: int = 1,
    *,
    horizon: int | None = None,
    initial_distribution: ArrayLike | None = None,
) -> TurnTakingMDP:
    """The TurnTakingMDP of a toy-text environment's table ``env.unwrapped.P`` (module docstring).

    ``gamma`` in [0, 1) (discounted; no time limit), or ``gamma=1`` with ``horizon=H`` (the
    episode is cut after H steps, as Gymnasium's ``TimeLimit`` does). ``n_agents`` agents take
    turns, one step each, agent 0 first. The initial distribution is the environment's
    ``initial_state_distrib`` (or ``isd``) unless ``initial_distribution`` is given.
    Terminating transitions lead to one absorbing zero-reward state, index
    ``n_agents * S_env``. Raises GymnasiumConversionError (or MDPValidationError for bad
    gamma, horizon or probabilities).

    >>> import gymnasium, sim
    >>> env = gymnasium.make("FrozenLake-v1", is_slippery=True)
    >>> mdp = sim.from_gymnasium(env, gamma=0.9)
    >>> mdp.n_states, mdp.n_actions, mdp.n_agents
    (17, 4, 1)
    >>> round(sim.evaluate(mdp, sim.uniform_team(mdp)).J, 6)
    0.004477
    """
    if isinstance(n_agents, bool) or not isinstance(n_agents, numbers.Integral) or n_agents < 1:
        raise GymnasiumConversionError(f"n_agents must be an int >= 1, got {n_agents!r}")
    base = getattr(env, "unwrapped", env)
    table = getattr(base, "P", None)
    if not isinstance(table, dict):
        raise GymnasiumConversionError(
            f"{type(base).__name__} has no toy-text transition table env.unwrapped.P "
            "({s: {a: [(p, s', r, terminated)]}})"
        )
    _check_step_follows_table(base)
    n_env = _discrete_size(base.observation_space, "observation")
    n_actions = _discrete_size(base.action_space, "action")
    start = _initial_distribution(base, n_env, initial_distribution)
    rows, probabilities, targets, rewards, ends = _outcomes(table, n_env, n_actions)
    _check_outcomes(rows, probabilities, rewards, n_env, n_actions)
    n = int(n_agents)
    absorbing = n * n_env
    n_states = absorbing + 1
    P, R = _turn_taking_tables(n, n_env, n_actions, rows, probabilities, targets, rewards, ends)
    rho0 = np.zeros(n_states)
    rho0[:n_env] = start
    agent_of_state = np.append(np.repeat(np.arange(n), n_env), 0)
    try:
        return TurnTakingMDP(P, R, rho0, gamma, agent_of_state, horizon, n_agents=n)
    except MDPValidationError as error:
        raise MDPValidationError(f"from_gymnasium: {error}") from error


def _check_outcomes(
    rows: NDArray[np.int64],
    probabilities: NDArray[np.float64],
    rewards: NDArray[np.float64],
    n_env: int,
    n_actions: int,
) -> None:
    """GymnasiumConversionError naming the first (s, a) of the table with a reward that is not
    finite, a probability that is not one, or probabilities that do not sum to 1."""
    if not np.isfinite(rewards).all():
        first = int(np.flatnonzero(~np.isfinite(rewards))[0])
        s, a = divmod(int(rows[first]), n_actions)
        raise GymnasiumConversionError(f"env.unwrapped.P[{s}][{a}] has reward {rewards[first]}")
    bad = ~np.isfinite(probabilities) | (probabilities < 0)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        s, a = divmod(int(rows[first]), n_actions)
        raise GymnasiumConversionError(
            f"env.unwrapped.P[{s}][{a}] has probability {probabilities[first]!r}"
        )
    totals = np.bincount(rows, weights=probabilities, minlength=n_env * n_actions)
    off = np.abs(totals - 1.0)
    if off.max() > STOCHASTIC_ATOL:
        s, a = divmod(int(np.argmax(off)), n_actions)
        raise GymnasiumConversionError(
            f"env.unwrapped.P[{s}][{a}]: probabilities must sum to 1 (to {STOCHASTIC_ATOL:g}), "
            f"sum = {totals[s * n_actions + a]!r}"
        )


def _turn_taking_tables(
    n: int,
    n_env: int,
    n_actions: int,
    rows: NDArray[np.int64],
    probabilities: NDArray[np.float64],
    targets: NDArray[np.int64],
    rewards: NDArray[np.float64],
    ends: NDArray[np.bool_],
) -> tuple[sp.csr_matrix, NDArray[np.float64]]:
    """P and R of the turn-taking MDP: the environment's table once per turn (state index
    turn * n_env + s), each step handing the turn on, and one absorbing state last."""
    absorbing = n * n_env
    n_states = absorbing + 1
    # The expected reward of (s, a) includes the reward of a terminating transition; the
    # episode ends after it, which the absorbing state (reward 0, self-loop) represents.
    expected_reward = np.bincount(
        rows, weights=probabilities * rewards, minlength=n_env * n_actions
    ).reshape(n_env, n_actions)
    R = np.zeros((n_states, n_actions))
    transition_rows: list[NDArray[np.int64]] = []
    transition_cols: list[NDArray[np.int64]] = []
    for turn in range(n):
        R[turn * n_env : (turn + 1) * n_env] = expected_reward
        transition_rows.append(turn * n_env * n_actions + rows)
        next_turn = (turn + 1) % n
        transition_cols.append(np.where(ends, absorbing, next_turn * n_env + targets))
    transition_rows.append(absorbing * n_actions + np.arange(n_actions))
    transition_cols.append(np.full(n_actions, absorbing))
    data = np.concatenate([np.tile(probabilities, n), np.ones(n_actions)])
    P = sp.csr_matrix(
        (data, (np.concatenate(transition_rows), np.concatenate(transition_cols))),
        shape=(n_states * n_actions, n_states),
    )
    return P, R


def env_state_count(mdp: TurnTakingMDP) -> int:
    """S_env of an MDP made by ``from_gymnasium``: its states are n_agents * S_env + 1."""
    count, remainder = divmod(mdp.n_states - 1, mdp.n_agents)
    if remainder or count < 1:
        raise ValueError(
            f"{mdp!r} is not laid out as from_gymnasium lays out n_agents * S_env + 1 states"
        )
    return count


def alternating_team(mdp: TurnTakingMDP, policies: Sequence[ArrayLike]) -> TabularTeam:
    """The team of an MDP from ``from_gymnasium`` in which agent k plays ``policies[k]``.

    Each policy is an S_env x A table over the environment's states; agent k uses it on its
    turns (state ``k * S_env + s``). The absorbing state, where nothing can be won, plays
    uniformly.
    """
    n_env = env_state_count(mdp)
    if len(policies) != mdp.n_agents:
        raise PolicyValidationError(
            f"need one policy per agent ({mdp.n_agents}), got {len(policies)}"
        )
    table = np.full((mdp.n_states, mdp.n_actions), 1.0 / mdp.n_actions)
    for turn, policy in enumerate(policies):
        table[turn * n_env : (turn + 1) * n_env] = validate_policy(policy, n_env, mdp.n_actions)
    return TabularTeam(table, mdp.agent_of_state, n_agents=mdp.n_agents)
