"""THEORY.md §2, performance difference (discounted and episodic) and the exact evaluation in
``sim`` against the independent oracle.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from proofs_check import oracle
from proofs_check.instances import TabularMDP
from proofs_check.tolerances import IDENTITY_TOL, identity_slack, value_scale
from proofs_check.traces import to_sim
from teamtr import bounds

FloatArray = NDArray[np.float64]


def performance_difference_slack(mdp: TabularMDP, pi: FloatArray, pi_new: FloatArray) -> float:
    """THEORY §2 performance difference: J(pi') - J(pi) = 1/(1-gamma) E_{d_pi', pi'}[A_pi]."""
    old, new = oracle.discounted(mdp, pi), oracle.discounted(mdp, pi_new)
    rhs = bounds.performance_difference_rhs(pi_new, old.A, new.d, mdp.gamma)
    return identity_slack(new.J - old.J, rhs, value_scale(mdp))


def episodic_performance_difference_slack(
    mdp: TabularMDP, pi: FloatArray, pi_new: FloatArray
) -> float:
    """THEORY §2 episodic version: J(pi') - J(pi) = sum_t E_{rho_t^pi', pi'}[A_t^pi]."""
    old, new = oracle.episodic(mdp, pi), oracle.episodic(mdp, pi_new)
    rhs = bounds.episodic_performance_difference_rhs(pi_new, old.A, new.rho)
    return identity_slack(new.J - old.J, rhs, value_scale(mdp))


def sim_evaluation_slack(mdp: TabularMDP, pi: FloatArray, sparse: bool) -> float:
    """THEORY §1 "all are exact in sim/": ``sim.evaluate`` agrees with the dense oracle on J,
    V, Q, A, d (and the episodic marginals rho) to IDENTITY_TOL relative to R_max/(1-gamma)."""
    from sim.evaluate import evaluate

    got = evaluate(to_sim(mdp, sparse), pi)
    if mdp.horizon is None:
        want: oracle.Discounted | oracle.Episodic = oracle.discounted(mdp, pi)
        pairs = [(got.V, want.V), (got.Q, want.Q), (got.A, want.A)]
    else:
        want = oracle.episodic(mdp, pi)
        assert got.rho is not None
        pairs = [(got.V, want.V[:-1]), (got.Q, want.Q), (got.A, want.A), (got.rho, want.rho)]
    scale = max(1.0, value_scale(mdp))
    worst = abs(got.J - want.J) / scale
    for a, b in pairs:
        worst = max(worst, float(np.max(np.abs(np.asarray(a) - b))) / scale)
    worst = max(worst, float(np.max(np.abs(got.d - want.d))))
    return IDENTITY_TOL - worst
