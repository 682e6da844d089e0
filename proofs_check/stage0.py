"""THEORY.md §2, Stage-0 alignment: the closed form pi ∝ pi_pre^{1/(1+λ)} pi_cur^{λ/(1+λ)} is
the constrained optimum (against scipy.optimize) and lies inside the radius.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray
from scipy import optimize

from proofs_check.tolerances import STAGE0_RTOL, float_allowance
from teamtr.alignment import stage0_projection
from teamtr.divergence import kl, log_softmax

FloatArray = NDArray[np.float64]


SCIPY_FEASIBILITY = 1e-8
"""A scipy.optimize result counts only if it exceeds the radius by at most this much."""


def _scipy_projection(pre: FloatArray, cur: FloatArray, radius: float) -> FloatArray:
    """min KL(pi || pre) s.t. KL(pi || cur) <= radius, by SLSQP over softmax logits.

    Several SLSQP starts (pi_cur, a geometric mixture, pi_pre), then trust-constr if none of
    them ends feasible; every run that ends feasible to
    SCIPY_FEASIBILITY counts (SLSQP often stops with "positive directional derivative" at the
    limit of its precision; an unconverged point can only make the comparison more lenient
    towards scipy, never flag a correct closed form), and the best of them is returned.
    """

    def as_policy(z: FloatArray) -> FloatArray:
        e = np.exp(z - z.max())
        return e / e.sum()

    def kl_and_gradient(z: FloatArray, reference: FloatArray) -> tuple[float, FloatArray]:
        # d/dz_j KL(softmax(z) || ref) = pi_j (log(pi_j / ref_j) - KL).
        log_pi = log_softmax(z)
        pi = np.exp(log_pi)
        log_ratio = log_pi - np.log(reference)
        value = float(np.dot(pi, log_ratio))
        return value, pi * (log_ratio - value)

    best: FloatArray | None = None
    for start in (np.log(cur), 0.5 * (np.log(cur) + np.log(pre)), np.log(pre)):
        result = optimize.minimize(
            lambda z: kl_and_gradient(z, pre),
            start,
            jac=True,
            method="SLSQP",
            constraints=[
                {
                    "type": "ineq",
                    "fun": lambda z: radius - kl_and_gradient(z, cur)[0],
                    "jac": lambda z: -kl_and_gradient(z, cur)[1],
                }
            ],
            options={"ftol": 1e-14, "maxiter": 1000},
        )
        candidate = as_policy(result.x)
        feasible = float(kl(candidate, cur)) <= radius + SCIPY_FEASIBILITY
        if feasible and (best is None or kl(candidate, pre) < kl(best, pre)):
            best = candidate
    if best is None:
        # SLSQP's least-squares subproblem can go singular next to a near-deterministic pi_pre;
        # the interior-point method is slower but stays feasible there.
        result = optimize.minimize(
            lambda z: kl_and_gradient(z, pre),
            np.log(cur),
            jac=True,
            method="trust-constr",
            constraints=[
                optimize.NonlinearConstraint(
                    lambda z: kl_and_gradient(z, cur)[0],
                    -np.inf,
                    radius,
                    jac=lambda z: kl_and_gradient(z, cur)[1][None, :],
                )
            ],
            options={"xtol": 1e-14, "gtol": 1e-14, "maxiter": 3000},
        )
        candidate = as_policy(result.x)
        if float(kl(candidate, cur)) <= radius + SCIPY_FEASIBILITY:
            best = candidate
    if best is None:
        raise RuntimeError("scipy.optimize found no feasible solution from any start")
    return best


def stage0_optimality_slack(pre: FloatArray, cur: FloatArray, radius: float) -> float:
    """Stage-0 closed form (THEORY §2) against scipy.optimize on the same states.

    Per state: KL(pi_new || pi_pre) <= KL(pi_scipy || pi_pre), both objectives taken to the
    boundary KL(. || pi_cur) = delta0 to first order (the multiplier lambda of the closed form
    is the derivative of the optimum in delta0). Slack = min over states.
    """
    projection = stage0_projection(pre, cur, radius, rtol=STAGE0_RTOL)
    slacks = []
    for s in range(pre.shape[0]):
        numeric = _scipy_projection(pre[s], cur[s], radius)
        lam = float(projection.lam[s])
        if not math.isfinite(lam):
            raise ValueError(f"state {s}: no finite multiplier, the instance has no solution")
        # Both solvers stop near the boundary KL(. || pi_cur) = delta0: the bisection up to
        # rtol inside it, SLSQP possibly a hair outside. To first order the optimum moves by
        # -lambda per unit of radius, so each objective is moved to the exact boundary.
        closed = float(kl(projection.policy[s], pre[s]))
        closed -= lam * (radius - float(kl(projection.policy[s], cur[s])))
        numerical = float(kl(numeric, pre[s]))
        numerical += lam * max(0.0, float(kl(numeric, cur[s])) - radius)
        slacks.append(numerical - closed + float_allowance(closed))
    return min(slacks)


def stage0_feasibility_slack(pre: FloatArray, cur: FloatArray, radius: float) -> float:
    """Stage-0: the projected policy lies in the trust region, KL(pi_new || pi_cur) <= delta0."""
    projection = stage0_projection(pre, cur, radius)
    return radius - float(np.max(kl(projection.policy, cur))) + float_allowance(radius)
