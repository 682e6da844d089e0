"""Turn-taking (masked activation with one active agent) and Lemma 3.1 on team tables.

A turn-taking team acts through ``agent_of_state``: in state s only agent ``agent(s)`` acts,
so the team table is pi(a|s) = pi^{agent(s)}(a|s). Agent policies are represented here as
full S x A tables of which only the agent's own rows matter.

Lemma 3.1: if two teams differ only in agent k, their divergence at s is agent k's divergence
where k is active and 0 elsewhere. This is what lets one agent's KL radius bound the team's
divergence, and what makes the intermediate teams pi_hat^0 .. pi_hat^n (THEORY.md §1) cheap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]


def _agent_ids(agent_of_state: ArrayLike) -> NDArray[np.int64]:
    ids = np.asarray(agent_of_state)
    if ids.ndim != 1:
        raise ValueError(f"agent_of_state must be one-dimensional, got shape {ids.shape}")
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"agent_of_state must hold integer agent ids, got dtype {ids.dtype}")
    if ids.size and ids.min() < 0:
        raise ValueError("agent_of_state must hold agent ids >= 0")
    return ids.astype(np.int64)


def agent_mask(agent_of_state: ArrayLike, agent: int) -> BoolArray:
    """Boolean mask over states: True where ``agent`` is the active agent."""
    out: BoolArray = _agent_ids(agent_of_state) == agent
    return out


def team_divergence_from_agent(
    agent_of_state: ArrayLike, agent: int, per_state_div: ArrayLike
) -> FloatArray:
    """Lemma 3.1: the team divergence when only ``agent`` changed.

    ``per_state_div`` is the agent's divergence (KL or TV) between its new and old policy at
    every state; the team divergence equals it where ``agent`` acts and is 0 elsewhere (the
    other agents' rows are identical in both teams).
    """
    div = np.asarray(per_state_div, dtype=np.float64)
    mask = agent_mask(agent_of_state, agent)
    if div.shape != mask.shape:
        raise ValueError(
            f"per_state_div must have shape {mask.shape} (one value per state), got {div.shape}"
        )
    out: FloatArray = np.where(mask, div, 0.0)
    return out


def replace_agent_rows(
    team_table: ArrayLike, new_table: ArrayLike, agent_of_state: ArrayLike, agent: int
) -> FloatArray:
    """A copy of ``team_table`` whose rows at ``agent``'s states come from ``new_table``.

    This is pi_hat^i from pi_hat^{i-1}: replace agent sigma(i) by its target. Neither input
    is modified.
    """
    team = np.asarray(team_table, dtype=np.float64)
    new = np.asarray(new_table, dtype=np.float64)
    if team.ndim != 2 or new.shape != team.shape:
        raise ValueError(
            f"team_table and new_table must be S x A tables of one shape, got {team.shape} "
            f"and {new.shape}"
        )
    mask = agent_mask(agent_of_state, agent)
    if mask.shape != team.shape[:1]:
        raise ValueError(
            f"agent_of_state must have one entry per state ({team.shape[0]}), got {mask.size}"
        )
    out: FloatArray = np.where(mask[:, None], new, team)
    return out


def intermediate_tables(
    start_table: ArrayLike,
    targets: Mapping[int, ArrayLike] | Sequence[ArrayLike],
    order: Sequence[int],
    agent_of_state: ArrayLike,
) -> list[FloatArray]:
    """The intermediate teams pi_hat^0 .. pi_hat^n of a stage (THEORY.md §1).

    pi_hat^0 = ``start_table``; pi_hat^i = pi_hat^{i-1} with agent ``order[i-1]`` replaced by
    ``targets[order[i-1]]`` (an S x A table). Returns ``len(order) + 1`` tables; the last is
    pi_bar. Each agent may appear in ``order`` at most once.
    """
    order_list = [int(k) for k in order]
    if len(set(order_list)) != len(order_list):
        raise ValueError(f"order must not repeat an agent, got {order_list}")
    for k in order_list:
        if isinstance(targets, Mapping):
            if k not in targets:
                raise ValueError(f"targets has no table for agent {k} named in order")
        elif not 0 <= k < len(targets):
            raise ValueError(f"order names agent {k} but targets has {len(targets)} tables")
    tables = [np.array(start_table, dtype=np.float64)]
    for k in order_list:
        tables.append(replace_agent_rows(tables[-1], targets[k], agent_of_state, k))
    return tables
