"""Tabular teams: one S x A table whose rows of state s belong to agent(s) (THEORY.md §1).

``check_team_fits`` is called by every function that receives a team together with an MDP
(``sim.evaluate``, the samplers, ``ExactUpdater``, ``sim.agent_alignment``), so a team built for
another MDP is refused before it updates the wrong states.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from sim.agent_map import agent_ids

if TYPE_CHECKING:
    from sim.mdp import TurnTakingMDP

POLICY_ATOL = 1e-9
"""How far a policy row may sum from 1 before it is rejected."""


class PolicyValidationError(ValueError):
    """A policy table that is not S x A row-stochastic; the message names the state."""


class TeamMismatchError(ValueError):
    """A team that does not fit the MDP it is used with (shape, agent map or number of agents)."""


def validate_policy(table: ArrayLike, n_states: int, n_actions: int) -> NDArray[np.float64]:
    """Return ``table`` as a float64 S x A row-stochastic array, or raise PolicyValidationError."""
    pi = np.asarray(table)
    if pi.shape != (n_states, n_actions):
        raise PolicyValidationError(
            f"policy table must have shape (S, A) = ({n_states}, {n_actions}), got {pi.shape}"
        )
    if not np.issubdtype(pi.dtype, np.number) or np.iscomplexobj(pi):
        raise PolicyValidationError(f"policy table must hold real numbers, got dtype {pi.dtype}")
    pi = pi.astype(np.float64)
    finite = np.isfinite(pi)
    if not finite.all():
        s, a = (int(i) for i in np.argwhere(~finite)[0])
        raise PolicyValidationError(f"policy is not finite at state {s}, action {a}: {pi[s, a]}")
    if (pi < 0).any():
        s, a = (int(i) for i in np.argwhere(pi < 0)[0])
        raise PolicyValidationError(f"policy is negative at state {s}, action {a}: {pi[s, a]:.3g}")
    off = np.abs(pi.sum(axis=1) - 1.0)
    if off.max(initial=0.0) > POLICY_ATOL:
        s = int(np.argmax(off))
        raise PolicyValidationError(
            f"policy rows must sum to 1 (to {POLICY_ATOL:g}); state {s} sums to {float(pi[s].sum())!r}"
        )
    return pi


class TabularTeam:
    """A turn-taking team pi(a|s) = pi^{agent(s)}(a|s) stored as one S x A table.

    Implements ``teamtr.protocols.TeamPolicy``. A team is a value: ``with_agent`` returns a new
    team. ``agent(k)`` returns a full S x A copy of which only agent k's rows matter.

    Agent ids must be integers 0..n-1 with none missing, or lie in [0, n_agents) when
    ``n_agents`` is given (``sim.agent_map.agent_ids``); otherwise PolicyValidationError.

    >>> import numpy as np
    >>> team = TabularTeam(np.full((3, 2), 0.5), agent_of_state=[0, 1, 0])
    >>> new = team.with_agent(1, np.array([[1.0, 0.0]] * 3))
    >>> new.table[:, 0].tolist()
    [0.5, 1.0, 0.5]
    """

    def __init__(
        self, table: ArrayLike, agent_of_state: ArrayLike, *, n_agents: int | None = None
    ) -> None:
        raw = np.asarray(table)
        if raw.ndim != 2:
            raise PolicyValidationError(f"policy table must be 2-D (S, A), got shape {raw.shape}")
        ids, count = agent_ids(agent_of_state, raw.shape[0], n_agents, PolicyValidationError)
        pi = validate_policy(raw, raw.shape[0], raw.shape[1])
        pi.setflags(write=False)
        self._table = pi
        self._agent_of_state = ids
        self._n_agents = count

    @property
    def n_agents(self) -> int:
        return self._n_agents

    @property
    def table(self) -> NDArray[np.float64]:
        """The team table pi(a|s), S x A, read-only."""
        return self._table

    @property
    def agent_of_state(self) -> NDArray[np.int64]:
        return self._agent_of_state

    def states_of(self, index: int) -> NDArray[np.bool_]:
        """Mask of the states where agent ``index`` acts."""
        return np.asarray(self._agent_of_state == index)

    def agent(self, index: int) -> NDArray[np.float64]:
        """Agent ``index``'s policy as a writable S x A copy (only its own rows are used)."""
        self._check_index(index)
        return self._table.copy()

    def with_agent(self, index: int, policy: Any) -> TabularTeam:
        """A new team whose rows at agent ``index``'s states are taken from ``policy``."""
        self._check_index(index)
        new_rows = np.asarray(policy, dtype=np.float64)
        if new_rows.shape != self._table.shape:
            raise PolicyValidationError(
                f"agent policy must have shape {self._table.shape}, got {new_rows.shape}"
            )
        mine = self.states_of(index)
        table = self._table.copy()
        table[mine] = new_rows[mine]
        return TabularTeam(table, self._agent_of_state, n_agents=self._n_agents)

    def changed_agents(self, other: TabularTeam) -> list[int]:
        """Agents whose rows differ between ``self`` and ``other``."""
        differs = np.any(self._table != other.table, axis=1)
        return sorted({int(k) for k in np.unique(self._agent_of_state[differs])})

    def _check_index(self, index: int) -> None:
        if not 0 <= index < self._n_agents:
            raise IndexError(f"agent index must be in [0, {self._n_agents}), got {index}")

    def __repr__(self) -> str:
        return f"TabularTeam(S={self._table.shape[0]}, A={self._table.shape[1]}, n_agents={self._n_agents})"


def uniform_team(mdp: TurnTakingMDP) -> TabularTeam:
    """Every agent plays uniformly at random."""
    table = np.full((mdp.n_states, mdp.n_actions), 1.0 / mdp.n_actions)
    return TabularTeam(table, mdp.agent_of_state, n_agents=mdp.n_agents)


def random_team(
    mdp: TurnTakingMDP, rng: np.random.Generator | int | None = None, concentration: float = 1.0
) -> TabularTeam:
    """Rows drawn from Dirichlet(concentration); small concentration gives peaked policies."""
    if concentration <= 0:
        raise ValueError(f"concentration must be > 0, got {concentration!r}")
    generator = np.random.default_rng(rng)
    # Gamma draws normalised per row are Dirichlet draws, vectorised over all states.
    draws = generator.gamma(concentration, size=(mdp.n_states, mdp.n_actions))
    draws = np.maximum(draws, np.finfo(np.float64).tiny)
    table = draws / draws.sum(axis=1, keepdims=True)
    return TabularTeam(table, mdp.agent_of_state, n_agents=mdp.n_agents)


def check_team_fits(mdp: TurnTakingMDP, team: TabularTeam, where: str) -> None:
    """Raise ``TeamMismatchError`` unless ``team`` has the MDP's shape, agents and agent map.

    ``where`` names the caller in the message (e.g. "sim.evaluate").
    """
    expected = (mdp.n_states, mdp.n_actions)
    if team.table.shape != expected:
        raise TeamMismatchError(
            f"{where}: the team's table has shape {team.table.shape} but the MDP has "
            f"(S, A) = {expected}"
        )
    if team.n_agents != mdp.n_agents:
        raise TeamMismatchError(
            f"{where}: the team has {team.n_agents} agents but the MDP has {mdp.n_agents}"
        )
    team_map, mdp_map = team.agent_of_state, mdp.agent_of_state
    if team_map is mdp_map:
        return
    differs = team_map != mdp_map
    if differs.any():
        state = int(np.flatnonzero(differs)[0])
        raise TeamMismatchError(
            f"{where}: the team's agent map differs from the MDP's at {int(differs.sum())} "
            f"state(s), first at state {state}: the team says agent {team_map[state]}, the MDP "
            f"agent {mdp_map[state]} (build the team from mdp.agent_of_state)"
        )


def as_fitting_team(mdp: TurnTakingMDP, team: Any, where: str) -> TabularTeam:
    """``team`` if it is a TabularTeam that fits ``mdp``; TypeError or TeamMismatchError if not."""
    if not isinstance(team, TabularTeam):
        raise TypeError(f"{where} needs a TabularTeam, got {type(team).__name__}")
    check_team_fits(mdp, team, where)
    return team
