"""THEORY.md §2, Theorem 3.7: the stale scheme's occupancy drift and its penalty sums."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from proofs_check.tolerances import float_allowance, value_scale
from proofs_check.traces import Trace, UpdateTerms, all_update_terms, mdp_penalty
from teamtr import bounds

FloatArray = NDArray[np.float64]


def _tightest_kls(terms: Sequence[UpdateTerms]) -> FloatArray:
    # Pinsker holds in either direction, so either measured KL is a valid delta_k; the
    # smaller one gives the stronger statement.
    return np.array([min(t.mean_kl_reverse, t.mean_kl_forward) for t in terms])


def drift_slacks(trace: Trace) -> list[float]:
    """Thm 3.7: ||d_{pi_hat^{i-1}} - d_{pi_cur}||_1 <= sum_{k<i} 2 gamma/(1-gamma) sqrt(delta_k/2)
    for i = 2 .. n (i = 1 is 0 <= 0), delta_k = E_{d_{pi_hat^{k-1}}}[KL_k]; episodic traces
    use the average occupancy and the factor 2 (H-1)."""
    mdp = trace.mdp
    deltas = _tightest_kls(all_update_terms(trace))
    d0 = trace.evaluations[0].d
    slacks = []
    factor = 2.0 * (mdp.horizon - 1) if mdp.horizon is not None else 2.0 / (1.0 - mdp.gamma)
    for i in range(2, len(trace.tables)):
        drift = float(np.abs(trace.evaluations[i - 1].d - d0).sum())
        bound = bounds.theorem_3_7_drift_bound(
            0.0 if mdp.horizon is not None else mdp.gamma, deltas[: i - 1], horizon=mdp.horizon
        )
        slacks.append(bound - drift + float_allowance(factor * len(trace.order)))
    return slacks


def stale_penalty_slacks(trace: Trace) -> list[float]:
    """Thm 3.7 penalty sums: the stale certified penalty covers the occupancy drift.

    Per update: gain_i >= L_i^{d_cur} - C_i sum_{k<=i} sqrt(delta_k), where L_i^{d_cur} is the
    surrogate evaluated under the stage-start occupancy (Thm 3.4 plus
    |L_i - L_i^{d_cur}| <= eps_i/(1-gamma) ||d_{pi_hat^{i-1}} - d_{pi_cur}||_1 and the drift
    bound). The last entry is the stage sum, with ``bounds.stale_penalty_sum``:
    J(pi_bar) - J(pi_cur) >= sum_i L_i^{d_cur} - sum_i C_i sum_{k<=i} sqrt(delta_k).
    """
    mdp = trace.mdp
    penalty = mdp_penalty(mdp)
    terms = all_update_terms(trace)
    deltas = _tightest_kls(terms)
    coefficients = [bounds.kl_penalty_coefficient(t.advantage_bound, penalty) for t in terms]
    allowance = float_allowance(value_scale(mdp) * len(terms))
    slacks = []
    for i, t in enumerate(terms):
        charged = coefficients[i] * float(np.sum(np.sqrt(deltas[: i + 1])))
        slacks.append(t.gain - (t.surrogate_stage_start_occupancy - charged) + allowance)
    stage_gain = trace.evaluations[-1].J - trace.evaluations[0].J
    stage_bound = sum(t.surrogate_stage_start_occupancy for t in terms)
    stage_bound -= bounds.stale_penalty_sum(coefficients, deltas)
    slacks.append(stage_gain - stage_bound + allowance)
    return slacks
