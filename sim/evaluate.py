"""Exact policy evaluation: J, V, Q, A and the occupancy d of a team (THEORY.md §1).

Discounted (gamma < 1):
    V = (I - gamma P_pi)^{-1} r_pi,   d = (1 - gamma) (I - gamma P_pi^T)^{-1} rho0,
    Q = r + gamma P V,   A = Q - V,   J = rho0 . V.
Episodic (gamma = 1, horizon H), by backward induction and forward marginals:
    V_H = 0,  Q_t = r + P V_{t+1},  V_t = sum_a pi Q_t;   rho_0 = rho0,  rho_{t+1} = P_pi^T rho_t;
    d = (1/H) sum_t rho_t (the average occupancy of ``teamtr.penalty.EpisodicPenalty``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

from sim.linear import solve_resolvent_pair, validate_solver_options
from sim.mdp import TurnTakingMDP
from sim.team import TabularTeam, check_team_fits, validate_policy

Array = NDArray[np.float64]

FLOAT64_MAX = float(np.finfo(np.float64).max)


class NonFiniteResultError(ArithmeticError):
    """An exact evaluation whose values overflow float64 (the message says which and where)."""


@dataclass(frozen=True)
class Evaluation:
    """Exact values of one team on one MDP.

    Discounted: V (S), Q and A (S x A), ``A_bar`` is the same array as A, ``rho`` is None.
    Episodic: V (H x S), Q and A (H x S x A) indexed by the time step t < H, ``rho`` (H x S)
    the per-step state marginals, ``A_bar`` (S x A) = sum_t rho_t(s) A_t(s,a) / sum_t rho_t(s)
    (0 where s is never reached), so that H sum_s d(s) sum_a pi'(a|s) A_bar(s,a) equals the
    episodic surrogate sum_t E_{rho_t, pi'}[A_t].
    """

    J: float
    """J(pi) = E[sum_t gamma^t r_t]."""
    V: Array
    Q: Array
    A: Array
    d: Array
    """Normalised occupancy (sums to 1): discounted d_pi, or the episodic average occupancy."""
    rho: Array | None = None
    A_bar: Array | None = None
    method: str = ""
    """How the linear systems were solved ('backward-induction' when episodic)."""
    residual: float = 0.0
    """Largest relative residual ||rhs - M x|| / ||rhs|| of the equations solved."""
    matvecs: int = 0
    """Sparse matrix-vector products the iterative solver used (0 for direct solves)."""

    @property
    def surrogate_advantage(self) -> Array:
        """The S x A advantage the surrogate uses: A (discounted) or A_bar (episodic)."""
        return self.A if self.A_bar is None else self.A_bar  # A_bar is A when discounted

    def advantage_bound(self, policy: Array, states: NDArray[np.bool_]) -> float:
        """eps of Thm 3.4 for moving this team to ``policy`` (S x A) on ``states``.

        Discounted: max over ``states`` of |E_{a~policy} A(s, a)|. Episodic: max over t and
        the states of ``states`` reached at step t (rho_t(s) > 0) of |E_{a~policy} A_t(s, a)|,
        as the episodic penalty needs; the time-averaged A_bar can be smaller.
        """
        return advantage_bound(policy, self.A, states, self.rho)


def advantage_bound(
    policy: Array, advantage: Array, states: NDArray[np.bool_], rho: Array | None = None
) -> float:
    """max |E_{a~policy} A(s, a)| over ``states`` (0 when there are none).

    ``advantage`` is S x A, or H x S x A (episodic A_t) with ``rho`` (H x S) the per-step state
    marginals: then the max runs over t and the states with rho_t(s) > 0.
    """
    expected = np.einsum("sa,...sa->...s", policy, advantage)
    if expected.ndim == 1:
        return float(np.max(np.abs(expected[states]), initial=0.0))
    if rho is None:
        raise ValueError("per-step advantages (H x S x A) need the per-step marginals rho")
    reached = (rho > 0) & states[None, :]
    return float(np.max(np.abs(expected[reached]), initial=0.0))


def policy_kernel(mdp: TurnTakingMDP, pi: Array) -> sp.csr_matrix:
    """P_pi(s'|s) = sum_a pi(a|s) P(s'|s,a) as an S x S CSR matrix (duplicates not summed).

    The S*A rows of P for state s are contiguous in CSR, so P_pi reuses P's column indices and
    only re-weights the stored probabilities: O(nnz(P)), no sparse product.
    """
    P = mdp.P
    row_lengths = np.diff(P.indptr)
    width = int(row_lengths[0])
    if P.nnz == width * P.shape[0] and np.all(row_lengths == width):
        # Every (s, a) has the same number of successors: one broadcast multiply.
        data = (P.data.reshape(-1, width) * pi.reshape(-1, 1)).ravel()
    else:
        data = P.data * np.repeat(pi.ravel(), row_lengths)
    return sp.csr_matrix(
        (data, P.indices, P.indptr[:: mdp.n_actions]),
        shape=(mdp.n_states, mdp.n_states),
    )


def _as_table(mdp: TurnTakingMDP, pi: Any) -> Array:
    if isinstance(pi, TabularTeam):
        check_team_fits(mdp, pi, "sim.evaluate")
        return pi.table
    return validate_policy(pi, mdp.n_states, mdp.n_actions)


def _check_finite(mdp: TurnTakingMDP, evaluation: Evaluation) -> Evaluation:
    """Raise NonFiniteResultError if any part of ``evaluation`` overflowed (inf, or NaN from it).

    The MDP and the policy are finite (validated), so a non-finite value can only come from
    overflow: |V| can reach max |r| / (1 - gamma) (discounted) or H max |r| (episodic), and A
    twice that.
    """
    # V first: Q, A and J are computed from it and inherit its overflow.
    parts = {"V": evaluation.V, "Q": evaluation.Q, "A": evaluation.A, "d": evaluation.d}
    if evaluation.A_bar is not None:
        parts["A_bar"] = evaluation.A_bar
    parts["J"] = np.asarray(evaluation.J)
    for name, values in parts.items():
        finite = np.isfinite(values)
        if finite.all():
            continue
        index = tuple(int(i) for i in np.argwhere(~finite)[0]) if values.ndim else ()
        entry = f"{name}[{', '.join(map(str, index))}]" if index else name
        factor = float(mdp.horizon) if mdp.horizon is not None else 1.0 / (1.0 - mdp.gamma)
        # In log10: the bound itself may not be a float64.
        bound = np.log10(mdp.r_max) + np.log10(factor) if mdp.r_max > 0 else -np.inf
        raise NonFiniteResultError(
            f"sim.evaluate: {name} is not finite ({entry} = {values[index]}): the "
            f"values overflow float64, whose largest number is {FLOAT64_MAX:.3g}; max |r| = "
            f"{mdp.r_max:.3g} times the horizon factor {factor:.3g} bounds |V| by "
            f"10^{bound:.1f} and |A| by twice that. Rescale the rewards."
        )
    return evaluation


def evaluate(
    mdp: TurnTakingMDP, pi: Any, *, rtol: float = 1e-11, method: str = "auto"
) -> Evaluation:
    """Exact evaluation of the team table ``pi`` (S x A row-stochastic, or a TabularTeam).

    ``method`` picks the linear solver for the discounted case ('auto', 'direct-lu',
    'krylov-gmres'; see ``sim.linear``); ``rtol`` is the Krylov solver's relative residual,
    in (0, 1). A TabularTeam must fit ``mdp`` (its shape, agents and agent map; else
    ``TeamMismatchError``). Values that overflow float64 raise ``NonFiniteResultError``.
    """
    validate_solver_options(rtol, method)
    table = _as_table(mdp, pi)
    # Overflow is reported by _check_finite with its cause, not by numpy's warnings.
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if mdp.horizon is not None:
            evaluation = _evaluate_episodic(mdp, table, mdp.horizon)
        else:
            evaluation = _evaluate_discounted(mdp, table, rtol, method)
    return _check_finite(mdp, evaluation)


def _evaluate_discounted(mdp: TurnTakingMDP, pi: Array, rtol: float, method: str) -> Evaluation:
    gamma = mdp.gamma
    kernel = policy_kernel(mdp, pi)
    reward = np.einsum("sa,sa->s", pi, mdp.R)
    solution = solve_resolvent_pair(
        kernel, gamma, reward, (1.0 - gamma) * mdp.rho0, rtol=rtol, method=method
    )
    values = solution.values
    # d sums to 1 in exact arithmetic (1^T (I - gamma P_pi^T)^{-1} (1-gamma) rho0 = 1); rounding
    # can leave -1e-17 entries at unreachable states, which are clipped before normalising.
    occupancy = np.maximum(solution.adjoint, 0.0)
    occupancy /= occupancy.sum()
    q = mdp.R + gamma * (mdp.P @ values).reshape(mdp.n_states, mdp.n_actions)
    advantage = q - values[:, None]
    return Evaluation(
        J=float(mdp.rho0 @ values),
        V=values,
        Q=q,
        A=advantage,
        d=occupancy,
        rho=None,
        A_bar=advantage,
        method=solution.method,
        residual=solution.residual,
        matvecs=solution.matvecs,
    )


def _evaluate_episodic(mdp: TurnTakingMDP, pi: Array, horizon: int) -> Evaluation:
    n_states, n_actions = mdp.n_states, mdp.n_actions
    kernel = policy_kernel(mdp, pi)
    values = np.zeros((horizon + 1, n_states))
    q = np.empty((horizon, n_states, n_actions))
    for t in range(horizon - 1, -1, -1):
        q[t] = mdp.R + (mdp.P @ values[t + 1]).reshape(n_states, n_actions)
        values[t] = np.einsum("sa,sa->s", pi, q[t])
    marginals = np.empty((horizon, n_states))
    marginals[0] = mdp.rho0
    transpose = kernel.T
    for t in range(horizon - 1):
        marginals[t + 1] = transpose @ marginals[t]
    advantage = q - values[:horizon, :, None]
    visits = marginals.sum(axis=0)
    weighted = np.einsum("ts,tsa->sa", marginals, advantage)
    reached = visits > 0
    advantage_bar = np.zeros((n_states, n_actions))
    advantage_bar[reached] = weighted[reached] / visits[reached, None]

    reward = np.einsum("sa,sa->s", pi, mdp.R)
    bellman = values[:horizon] - reward[None, :] - (kernel @ values[1:].T).T
    scale = np.linalg.norm(reward) * np.sqrt(horizon)
    residual = float(np.linalg.norm(bellman) / scale) if scale > 0 else 0.0
    return Evaluation(
        J=float(mdp.rho0 @ values[0]),
        V=values[:horizon],
        Q=q,
        A=advantage,
        d=visits / horizon,
        rho=marginals,
        A_bar=advantage_bar,
        method="backward-induction",
        residual=residual,
    )
