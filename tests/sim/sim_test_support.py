"""Independent reference computations for the sim tests (dense, loop-based, no sim solvers)."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

import sim

Array = NDArray[np.float64]


def dense_kernel(mdp: sim.TurnTakingMDP, pi: Array) -> Array:
    return np.einsum("sa,sat->st", pi, mdp.transitions_dense())


def value_iteration(mdp: sim.TurnTakingMDP, pi: Array, tol: float = 1e-14) -> tuple[Array, Array]:
    """Iterative policy evaluation of V and of the occupancy d until the change is below tol."""
    kernel = dense_kernel(mdp, pi)
    reward = (pi * mdp.R).sum(axis=1)
    values = np.zeros(mdp.n_states)
    occupancy = np.zeros(mdp.n_states)
    for _ in range(100_000):
        new_values = reward + mdp.gamma * kernel @ values
        new_occupancy = (1 - mdp.gamma) * mdp.rho0 + mdp.gamma * kernel.T @ occupancy
        change = max(np.abs(new_values - values).max(), np.abs(new_occupancy - occupancy).max())
        values, occupancy = new_values, new_occupancy
        if change < tol:
            return values, occupancy
    raise AssertionError("value iteration did not converge")


def episodic_by_recursion(mdp: sim.TurnTakingMDP, pi: Array) -> tuple[Array, Array]:
    """V_t for t = 0..H-1 and rho_t by explicit loops over the dense arrays."""
    assert mdp.horizon is not None
    P = mdp.transitions_dense()
    H, S = mdp.horizon, mdp.n_states
    values = np.zeros((H + 1, S))
    for t in range(H - 1, -1, -1):
        for s in range(S):
            values[t, s] = sum(
                pi[s, a] * (mdp.R[s, a] + P[s, a] @ values[t + 1]) for a in range(mdp.n_actions)
            )
    marginals = np.zeros((H, S))
    marginals[0] = mdp.rho0
    for t in range(H - 1):
        for s in range(S):
            for a in range(mdp.n_actions):
                marginals[t + 1] += marginals[t, s] * pi[s, a] * P[s, a]
    return values[:H], marginals


def random_policy(rng: np.random.Generator, n_states: int, n_actions: int) -> Array:
    table = rng.gamma(1.0, size=(n_states, n_actions)) + 1e-3
    return table / table.sum(axis=1, keepdims=True)


def permuted_mdp(mdp: sim.TurnTakingMDP, order: NDArray[np.int64]) -> sim.TurnTakingMDP:
    """The same MDP with state ``order[i]`` renamed i."""
    A = mdp.n_actions
    rows = (order[:, None] * A + np.arange(A)[None, :]).ravel()
    inverse = np.empty_like(order)
    inverse[order] = np.arange(order.size)
    P = mdp.P[rows].tocoo()
    import scipy.sparse as sp

    renamed = sp.csr_matrix((P.data, (P.row, inverse[P.col])), shape=P.shape)
    return sim.TurnTakingMDP(
        renamed,
        mdp.R[order],
        mdp.rho0[order],
        mdp.gamma,
        mdp.agent_of_state[order],
        mdp.horizon,
        n_agents=mdp.n_agents,
    )
