"""The agent map agent(s) of THEORY.md §1, validated once.

An MDP and a team each carry a map from states to the agent acting there. Both are read by
``agent_ids``: integers 0..n-1, every one of them acting somewhere, unless the number of agents
n is given explicitly (then the ids only have to lie in [0, n)). Where a team meets an MDP the
two maps are compared by ``sim.team.check_team_fits``.
"""

from __future__ import annotations

import numbers

import numpy as np
from numpy.typing import ArrayLike, NDArray

_LARGEST_ID = np.iinfo(np.int64).max // 2
"""Ids are clipped here before the cast to int64; any id this large is refused anyway."""


def _describe_ids(ids: NDArray[np.int64]) -> str:
    shown = ", ".join(str(int(i)) for i in ids[:5])
    return shown + (f", ... ({ids.size} in all)" if ids.size > 5 else "")


def agent_ids(
    agent_of_state: ArrayLike,
    n_states: int,
    n_agents: int | None,
    error: type[ValueError],
) -> tuple[NDArray[np.int64], int]:
    """The agent map as read-only int64 ids, and the number of agents; raise ``error`` if bad.

    Without ``n_agents`` the ids must be exactly 0..max (none missing): a gap would make
    ``max + 1`` agents of which some act nowhere (ids [0, 5, 0] would mean six agents, an id of
    2**40 a trillion). With ``n_agents`` the ids must lie in [0, n_agents), and n_agents may not
    exceed the number of states.
    """
    if n_agents is not None and (
        isinstance(n_agents, bool) or not isinstance(n_agents, numbers.Integral) or n_agents < 1
    ):
        raise error(f"n_agents must be an int >= 1, got {n_agents!r}")
    original = np.asarray(agent_of_state)
    raw = original
    if raw.shape != (n_states,):
        raise error(f"agent_of_state must have shape (S,) = ({n_states},), got {raw.shape}")
    if raw.dtype == np.bool_ or not np.issubdtype(raw.dtype, np.number) or np.iscomplexobj(raw):
        raise error(f"agent_of_state must hold integers, got dtype {raw.dtype}")
    if not np.issubdtype(raw.dtype, np.integer):
        finite = np.isfinite(raw)
        integral = finite & (raw == np.round(np.where(finite, raw, 0)))
        if not integral.all():
            state = int(np.flatnonzero(~integral)[0])
            raise error(
                f"agent_of_state must hold integers; state {state} has {raw[state].item()!r}"
            )
    if not np.issubdtype(raw.dtype, np.signedinteger):
        # Beyond 2**63 the cast to int64 would wrap; such an id is refused below either way.
        raw = np.minimum(raw, _LARGEST_ID)
    # A read-only int64 map (an MDP's or another team's) is shared, not copied: nobody can
    # change it, and ``check_team_fits`` then recognises a team built from an MDP by identity.
    shared = raw is original and raw.dtype == np.int64 and not raw.flags.writeable
    ids = raw if shared else raw.astype(np.int64)
    if ids.size and ids.min() < 0:
        state = int(np.argmin(ids))
        raise error(f"agent ids must be >= 0; state {state} has agent {ids[state]}")
    count = _agent_count(ids, original, n_states, n_agents, error)
    if not shared:
        ids.setflags(write=False)
    return ids, count


def _agent_count(
    ids: NDArray[np.int64],
    original: np.ndarray,
    n_states: int,
    n_agents: int | None,
    error: type[ValueError],
) -> int:
    """How many agents the ids name: ``n_agents`` where given (the ids inside it), else
    max + 1 with none missing; ``error`` naming the first state that breaks it."""
    if n_agents is not None:
        if n_agents > n_states:
            raise error(
                f"n_agents = {n_agents} exceeds the number of states S = {n_states}: "
                "at least one agent would act in no state"
            )
        if ids.size and ids.max() >= n_agents:
            state = int(np.argmax(ids))
            raise error(
                f"agent ids must be < n_agents = {n_agents}; state {state} has agent {ids[state]}"
            )
        count = int(n_agents)
    else:
        count = int(ids.max()) + 1 if ids.size else 0
        if count > n_states:
            state = int(np.argmax(ids))
            raise error(
                f"agent ids must be 0..n-1 with none missing; state {state} has agent "
                f"{original[state].item()!r} but there are only {n_states} states (pass n_agents if ids "
                "are meant to be sparse)"
            )
        present = np.zeros(count, dtype=bool)
        present[ids] = True
        if not present.all():
            missing = np.flatnonzero(~present)
            raise error(
                f"agent ids must be 0..n-1 with none missing; agent(s) {_describe_ids(missing)} "
                f"act in no state while agent {count - 1} does (pass n_agents={count} if that "
                "is intended)"
            )
    return count
