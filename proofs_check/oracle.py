"""An independent exact oracle for tabular instances: dense linear solves, nothing shared.

The property tests evaluate J, V, Q, A and occupancies here, so a theorem check does not rely
on the code it is checking; ``sim.evaluate`` is compared against this oracle separately.

Discounted (THEORY.md §1): V = (I - gamma P_pi)^{-1} r_pi, Q = R + gamma P V, A = Q - V,
d = (1 - gamma) rho0^T (I - gamma P_pi)^{-1} (sums to 1), J = rho0 . V.
Episodic (gamma = 1, horizon H): V_H = 0, Q_t = R + P V_{t+1}, V_t = sum_a pi Q_t,
rho_0 = rho0, rho_{t+1} = rho_t P_pi, d = (1/H) sum_t rho_t, J = rho0 . V_0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from proofs_check.instances import TabularMDP

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class Discounted:
    """Exact quantities of one team in a discounted MDP."""

    J: float
    V: FloatArray
    Q: FloatArray
    A: FloatArray
    d: FloatArray


@dataclass(frozen=True)
class Episodic:
    """Exact per-step quantities of one (stationary) team in an episodic MDP."""

    J: float
    V: FloatArray
    """(H + 1, S), with V[H] = 0."""
    Q: FloatArray
    """(H, S, A)."""
    A: FloatArray
    """(H, S, A): A_t = Q_t - V_t."""
    rho: FloatArray
    """(H, S): the state marginals rho_t."""
    d: FloatArray
    """(S,): the average occupancy (1/H) sum_t rho_t."""


def transition_under(mdp: TabularMDP, pi: FloatArray) -> FloatArray:
    """P_pi(s, s') = sum_a pi(a|s) P(s'|s, a)."""
    out: FloatArray = np.einsum("sa,sat->st", pi, mdp.P)
    return out


def discounted(mdp: TabularMDP, pi: FloatArray) -> Discounted:
    """Exact J, V, Q, A, d of team table ``pi`` (S x A) in a discounted MDP."""
    if mdp.horizon is not None:
        raise ValueError("discounted() needs a discounted MDP; use episodic()")
    s = mdp.n_states
    system = np.eye(s) - mdp.gamma * transition_under(mdp, pi)
    V = np.linalg.solve(system, np.sum(pi * mdp.R, axis=1))
    Q = mdp.R + mdp.gamma * mdp.P @ V
    d = np.asarray((1.0 - mdp.gamma) * np.linalg.solve(system.T, mdp.rho0), dtype=np.float64)
    return Discounted(J=float(mdp.rho0 @ V), V=V, Q=Q, A=Q - V[:, None], d=d)


def episodic(mdp: TabularMDP, pi: FloatArray) -> Episodic:
    """Exact per-step quantities of team table ``pi`` in an episodic MDP of horizon H."""
    if mdp.horizon is None:
        raise ValueError("episodic() needs an episodic MDP (horizon H); use discounted()")
    h, s, a = mdp.horizon, mdp.n_states, mdp.n_actions
    V = np.zeros((h + 1, s))
    Q = np.zeros((h, s, a))
    for t in range(h - 1, -1, -1):
        Q[t] = mdp.R + mdp.P @ V[t + 1]
        V[t] = np.sum(pi * Q[t], axis=1)
    p_pi = transition_under(mdp, pi)
    rho = np.zeros((h, s))
    rho[0] = mdp.rho0
    for t in range(1, h):
        rho[t] = rho[t - 1] @ p_pi
    return Episodic(
        J=float(mdp.rho0 @ V[0]),
        V=V,
        Q=Q,
        A=Q - V[:h, :, None],
        rho=rho,
        d=rho.mean(axis=0),
    )
