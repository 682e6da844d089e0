"""The turn-taking MDP (S, A, P, r, rho0, gamma, agent) of THEORY.md §1, validated on construction.

Transitions are stored as one CSR matrix with S*A rows: row ``s*A + a`` is P(.|s, a). This is
the layout every solver in ``sim`` works on: the team's state-to-state kernel P_pi is a
re-weighting of these rows, so it never needs a dense S x A x S array.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import scipy.sparse as sp
from numpy.typing import ArrayLike, NDArray

from sim.agent_map import agent_ids
from teamtr.penalty import DiscountedPenalty, EpisodicPenalty

STOCHASTIC_ATOL = 1e-9
"""How far a probability row may sum from 1 before it is rejected (rows are then renormalised)."""


class MDPValidationError(ValueError):
    """A malformed MDP: the message says which array is wrong and where (state, action)."""


def _read_only(array: NDArray[Any]) -> NDArray[Any]:
    array.setflags(write=False)
    return array


def _state_action(row: int, n_actions: int) -> str:
    return f"state {row // n_actions}, action {row % n_actions}"


def _transitions_to_csr(P: Any, n_states: int, n_actions: int) -> sp.csr_matrix:
    """Accept P as dense S x A x S or sparse (S*A) x S, return canonical float64 CSR."""
    if sp.issparse(P):
        if P.shape != (n_states * n_actions, n_states):
            raise MDPValidationError(
                f"sparse P must have shape (S*A, S) = ({n_states * n_actions}, {n_states}) "
                f"to match R of shape ({n_states}, {n_actions}); got {P.shape}"
            )
        csr = sp.csr_matrix(P, dtype=np.float64, copy=True)
    else:
        dense = np.asarray(P)
        if dense.shape != (n_states, n_actions, n_states):
            raise MDPValidationError(
                f"dense P must have shape (S, A, S) = ({n_states}, {n_actions}, {n_states}) "
                f"to match R; got {dense.shape}"
            )
        if not np.issubdtype(dense.dtype, np.number) or np.iscomplexobj(dense):
            raise MDPValidationError(f"P must hold real numbers, got dtype {dense.dtype}")
        csr = sp.csr_matrix(dense.reshape(n_states * n_actions, n_states).astype(np.float64))
    csr.sum_duplicates()
    # int32 indices halve the memory traffic of every matrix-vector product when they fit.
    if csr.nnz < np.iinfo(np.int32).max and n_states * n_actions < np.iinfo(np.int32).max:
        csr.indices = csr.indices.astype(np.int32, copy=False)
        csr.indptr = csr.indptr.astype(np.int32, copy=False)
    return csr


def _validate_transition_rows(P: sp.csr_matrix, n_actions: int) -> None:
    entry_rows = None
    bad = ~np.isfinite(P.data)
    if bad.any():
        entry_rows = np.repeat(np.arange(P.shape[0]), np.diff(P.indptr))
        first = int(np.flatnonzero(bad)[0])
        raise MDPValidationError(
            f"P has a non-finite probability {P.data[first]} at "
            f"{_state_action(int(entry_rows[first]), n_actions)}, next state {P.indices[first]}"
        )
    negative = P.data < 0
    if negative.any():
        entry_rows = np.repeat(np.arange(P.shape[0]), np.diff(P.indptr))
        first = int(np.flatnonzero(negative)[0])
        raise MDPValidationError(
            f"P has a negative probability {P.data[first]:.3g} at "
            f"{_state_action(int(entry_rows[first]), n_actions)}, next state {P.indices[first]}"
        )
    row_sums = np.asarray(P.sum(axis=1)).ravel()
    off = np.abs(row_sums - 1.0)
    if off.max(initial=0.0) > STOCHASTIC_ATOL:
        worst = int(np.argmax(off))
        count = int((off > STOCHASTIC_ATOL).sum())
        raise MDPValidationError(
            f"P(.|s,a) must sum to 1 (to {STOCHASTIC_ATOL:g}); {count} row(s) do not, worst at "
            f"{_state_action(worst, n_actions)}: sum = {float(row_sums[worst])!r}"
        )


class TurnTakingMDP:
    """A turn-taking MDP: in state s only agent ``agent_of_state[s]`` acts (THEORY.md §1).

    Discounted when ``horizon`` is None (gamma in [0, 1)); episodic with horizon H when
    ``horizon`` is an int >= 1, which requires gamma == 1 (the language-model case).

    >>> import numpy as np
    >>> P = np.zeros((2, 1, 2)); P[0, 0, 1] = P[1, 0, 0] = 1.0
    >>> mdp = TurnTakingMDP(P, R=[[1.0], [0.0]], rho0=[1.0, 0.0], gamma=0.5,
    ...                     agent_of_state=[0, 1])
    >>> mdp.n_states, mdp.n_actions, mdp.n_agents
    (2, 1, 2)

    Agent ids must be integers 0..n-1 with none missing, or lie in [0, n_agents) when
    ``n_agents`` is given (n_agents <= S).
    Raises ``MDPValidationError`` (a ``ValueError``) naming the array, state and action at fault.
    Rows of P and rho0 that sum to 1 within 1e-9 are renormalised exactly.
    """

    def __init__(
        self,
        P: Any,
        R: ArrayLike,
        rho0: ArrayLike,
        gamma: float,
        agent_of_state: ArrayLike,
        horizon: int | None = None,
        *,
        n_agents: int | None = None,
    ) -> None:
        rewards = np.asarray(R)
        if rewards.ndim != 2:
            raise MDPValidationError(f"R must be an S x A array, got shape {rewards.shape}")
        if not np.issubdtype(rewards.dtype, np.number) or np.iscomplexobj(rewards):
            raise MDPValidationError(f"R must hold real numbers, got dtype {rewards.dtype}")
        n_states, n_actions = rewards.shape
        if n_states < 1 or n_actions < 1:
            raise MDPValidationError(
                f"R must have at least one state and action, got {rewards.shape}"
            )
        rewards = rewards.astype(np.float64)
        bad = ~np.isfinite(rewards)
        if bad.any():
            s, a = (int(i) for i in np.argwhere(bad)[0])
            raise MDPValidationError(f"R is not finite at state {s}, action {a}: {rewards[s, a]}")

        self._gamma, self._horizon = self._validate_discounting(gamma, horizon)

        transitions = _transitions_to_csr(P, n_states, n_actions)
        _validate_transition_rows(transitions, n_actions)
        row_sums = np.asarray(transitions.sum(axis=1)).ravel()
        transitions.data /= np.repeat(row_sums, np.diff(transitions.indptr))

        start = np.asarray(rho0)
        if start.shape != (n_states,):
            raise MDPValidationError(
                f"rho0 must have shape (S,) = ({n_states},), got {start.shape}"
            )
        start = start.astype(np.float64)
        if not np.isfinite(start).all():
            state = int(np.flatnonzero(~np.isfinite(start))[0])
            raise MDPValidationError(f"rho0 is not finite at state {state}: {start[state]}")
        if (start < 0).any():
            state = int(np.flatnonzero(start < 0)[0])
            raise MDPValidationError(f"rho0 is negative at state {state}: {start[state]:.3g}")
        if abs(start.sum() - 1.0) > STOCHASTIC_ATOL:
            raise MDPValidationError(
                f"rho0 must sum to 1 (to {STOCHASTIC_ATOL:g}), sums to {float(start.sum())!r}"
            )
        start /= start.sum()

        ids, self._n_agents = agent_ids(agent_of_state, n_states, n_agents, MDPValidationError)

        transitions.data.setflags(write=False)
        transitions.indices.setflags(write=False)
        transitions.indptr.setflags(write=False)
        self._P = transitions
        self._R = _read_only(rewards)
        self._rho0 = _read_only(start)
        self._agent_of_state = ids

    @staticmethod
    def _validate_discounting(gamma: float, horizon: int | None) -> tuple[float, int | None]:
        if isinstance(gamma, bool) or not isinstance(gamma, numbers.Real):
            raise MDPValidationError(f"gamma must be a real number, got {gamma!r}")
        g = float(gamma)
        if horizon is None:
            if not 0.0 <= g < 1.0:
                raise MDPValidationError(
                    f"gamma must lie in [0, 1) for a discounted MDP, got {gamma!r} "
                    "(pass horizon=H with gamma=1 for the episodic variant)"
                )
            return g, None
        if isinstance(horizon, bool) or not isinstance(horizon, numbers.Integral) or horizon < 1:
            raise MDPValidationError(f"horizon must be an int >= 1 or None, got {horizon!r}")
        if g != 1.0:
            raise MDPValidationError(
                f"an episodic MDP (horizon={horizon}) is undiscounted: gamma must be 1, got {gamma!r}"
            )
        return g, int(horizon)

    @property
    def n_states(self) -> int:
        return int(self._R.shape[0])

    @property
    def n_actions(self) -> int:
        return int(self._R.shape[1])

    @property
    def n_agents(self) -> int:
        return self._n_agents

    @property
    def P(self) -> sp.csr_matrix:
        """Transitions, CSR of shape (S*A, S); row s*A + a is P(.|s,a). Read-only."""
        return self._P

    @property
    def R(self) -> NDArray[np.float64]:
        """Rewards r(s, a), S x A. Read-only."""
        return self._R

    @property
    def rho0(self) -> NDArray[np.float64]:
        """Initial state distribution, length S. Read-only."""
        return self._rho0

    @property
    def gamma(self) -> float:
        return self._gamma

    @property
    def horizon(self) -> int | None:
        """H for the episodic variant, None when discounted."""
        return self._horizon

    @property
    def is_episodic(self) -> bool:
        return self._horizon is not None

    @property
    def agent_of_state(self) -> NDArray[np.int64]:
        """agent(s): the agent that acts in each state. Read-only."""
        return self._agent_of_state

    @property
    def r_max(self) -> float:
        """R_max = max |r(s,a)| (THEORY.md §1)."""
        return float(np.abs(self._R).max())

    def states_of(self, agent: int) -> NDArray[np.bool_]:
        """Mask of the states where ``agent`` acts."""
        return np.asarray(self._agent_of_state == agent)

    def penalty_model(self) -> DiscountedPenalty | EpisodicPenalty:
        """The Thm 3.4 penalty constants for this MDP's setting."""
        if self._horizon is None:
            return DiscountedPenalty(self._gamma)
        return EpisodicPenalty(self._horizon)

    def transitions_dense(self) -> NDArray[np.float64]:
        """P as a dense S x A x S array (for small MDPs and tests)."""
        return np.asarray(self._P.toarray()).reshape(self.n_states, self.n_actions, self.n_states)

    def __repr__(self) -> str:
        setting = f"horizon={self._horizon}" if self._horizon else f"gamma={self._gamma}"
        return (
            f"TurnTakingMDP(S={self.n_states}, A={self.n_actions}, n_agents={self.n_agents}, "
            f"{setting}, nnz(P)={self._P.nnz})"
        )
