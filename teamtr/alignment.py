"""Stage-0 alignment: project a new model into the trust region of the agent it replaces.

THEORY.md §2 (last part). Before pi_pre replaces agent k, solve per state s

    pi_new(.|s) = argmin_pi KL(pi || pi_pre)(s)  s.t.  KL(pi || pi_cur)(s) <= delta0.

The expectation over the probe set's occupancy in THEORY.md decouples into this per-state
problem because the constraint is per state. It is convex (both KLs are convex in pi) and
pi_cur is strictly feasible when delta0 > 0 (Slater), so its KKT conditions characterise the
unique solution. Stationarity of KL(pi||pi_pre) + lambda (KL(pi||pi_cur) - delta0) + mu (sum pi - 1):

    (1 + lambda) log pi = log pi_pre + lambda log pi_cur + const
    =>  pi_new  ∝  pi_pre^{1/(1+lambda)} pi_cur^{lambda/(1+lambda)},   lambda >= 0,

with complementary slackness: lambda = 0 if KL(pi_pre || pi_cur) <= delta0, otherwise the
constraint is active. Writing beta = 1/(1+lambda) in (0, 1], pi_beta ∝ pi_cur (pi_pre/pi_cur)^beta
is an exponential family in beta and d/dbeta KL(pi_beta || pi_cur) = beta Var_beta[log pi_pre/pi_cur]
>= 0, so the active constraint is met by bisection on beta.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from teamtr.divergence import kl, log_softmax

FloatArray = NDArray[np.float64]


class Stage0Projection(NamedTuple):
    """The projected policy table and the multiplier lambda >= 0 of each state."""

    policy: FloatArray
    """pi_new, the shape of the inputs (..., A)."""
    lam: FloatArray
    """lambda per state (shape ``policy.shape[:-1]``); 0 where pi_pre was already inside."""


def _check_table(name: str, table: FloatArray) -> None:
    if table.ndim < 1 or table.shape[-1] < 1:
        raise ValueError(f"{name} must have a trailing action axis, got shape {table.shape}")
    if not np.all(np.isfinite(table)) or np.any(table < 0):
        raise ValueError(f"{name} must hold finite non-negative probabilities")
    sums = table.sum(axis=-1)
    bad = np.flatnonzero(np.abs(sums - 1.0) > 1e-8)
    if bad.size:
        raise ValueError(
            f"{name} rows must sum to 1; row {int(bad[0])} sums to {float(sums.flat[bad[0]])!r}"
        )


def _tilt(log_pre: FloatArray, log_cur: FloatArray, both: NDArray[np.bool_], beta: FloatArray):
    """log pi_beta for beta in [0, 1): pi_cur (pi_pre/pi_cur)^beta on the common support.

    beta = 0 is the limit beta -> 0+, i.e. pi_cur restricted to supp(pi_pre) and renormalised.
    """
    with np.errstate(invalid="ignore"):
        logits = np.where(both, beta[:, None] * log_pre + (1.0 - beta[:, None]) * log_cur, -np.inf)
    return log_softmax(logits)


def _kl_to_cur(log_pi: FloatArray, log_cur: FloatArray) -> FloatArray:
    p = np.exp(log_pi)
    with np.errstate(invalid="ignore"):
        terms = np.where(p > 0, p * (log_pi - log_cur), 0.0)
    out: FloatArray = terms.sum(axis=-1)
    return out


def stage0_projection(
    pi_pre: ArrayLike,
    pi_cur: ArrayLike,
    delta0: float | ArrayLike,
    rtol: float = 1e-9,
    max_iter: int = 200,
) -> Stage0Projection:
    """Per-state projection of ``pi_pre`` into {pi : KL(pi || pi_cur) <= delta0} (closed form).

    Tables have shape (..., A), vectorised over all leading (state) axes; ``delta0`` is a
    radius > 0, shared or per state. Where KL(pi_pre || pi_cur) <= delta0, pi_new = pi_pre and
    lambda = 0. Elsewhere lambda > 0 is found by bisection on beta = 1/(1+lambda) so that
    delta0 (1 - rtol) <= KL(pi_new || pi_cur) <= delta0: the returned policy is always inside.
    Raises ValueError for a state where no policy absolutely continuous w.r.t. pi_pre fits in
    the radius (the supports barely overlap), since then the problem has no finite solution.
    """
    pre, cur, radius = _projection_inputs(pi_pre, pi_cur, delta0, rtol)
    state_shape = pre.shape[:-1]

    n_actions = pre.shape[-1]
    pre2 = pre.reshape(-1, n_actions)
    cur2 = cur.reshape(-1, n_actions)
    with np.errstate(divide="ignore"):
        log_pre = np.log(pre2)
        log_cur = np.log(cur2)
    both = (pre2 > 0) & (cur2 > 0)

    policy = pre2.copy()
    lam = np.zeros(pre2.shape[0])
    # Complementary slackness: lambda = 0 where pi_pre already satisfies the constraint.
    active = kl(pre2, cur2) > radius
    if not np.any(active):
        return Stage0Projection(policy.reshape(pre.shape), lam.reshape(state_shape))

    idx = np.flatnonzero(active)
    lp, lc, common, r = log_pre[idx], log_cur[idx], both[idx], radius[idx]
    disjoint = ~common.any(axis=1)
    if np.any(disjoint):
        raise ValueError(
            f"state {int(idx[np.argmax(disjoint)])}: pi_pre and pi_cur have disjoint supports"
        )
    lo = np.zeros(idx.size)
    hi = np.ones(idx.size)
    kl_lo = _kl_to_cur(_tilt(lp, lc, common, lo), lc)
    infeasible = kl_lo > r
    if np.any(infeasible):
        s = int(idx[np.argmax(infeasible)])
        raise ValueError(
            f"state {s}: every policy supported inside supp(pi_pre) has KL(. || pi_cur) >= "
            f"{float(kl_lo[np.argmax(infeasible)])!r} > delta0; increase delta0 there"
        )
    lo = _bisect_tilt(lp, lc, common, r, lo, hi, kl_lo, rtol, max_iter)
    policy[idx] = np.exp(_tilt(lp, lc, common, lo))
    with np.errstate(divide="ignore"):
        lam[idx] = np.where(lo > 0, 1.0 / np.where(lo > 0, lo, 1.0) - 1.0, np.inf)
    return Stage0Projection(policy.reshape(pre.shape), lam.reshape(state_shape))


def _projection_inputs(
    pi_pre: ArrayLike, pi_cur: ArrayLike, delta0: float | ArrayLike, rtol: float
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """The two tables as float64 arrays of one shape, and the radius, one per state (flat);
    ValueError naming the first input that is not a policy table or a positive radius."""
    pre = np.asarray(pi_pre, dtype=np.float64)
    cur = np.asarray(pi_cur, dtype=np.float64)
    if pre.shape != cur.shape:
        raise ValueError(f"pi_pre and pi_cur must have one shape, got {pre.shape}, {cur.shape}")
    _check_table("pi_pre", pre)
    _check_table("pi_cur", cur)
    if not (math.isfinite(rtol) and 0 < rtol < 1):
        raise ValueError(f"rtol must lie in (0, 1), got {rtol!r}")
    radius = np.broadcast_to(np.asarray(delta0, dtype=np.float64), pre.shape[:-1]).ravel()
    if not np.all(np.isfinite(radius)) or np.any(radius <= 0):
        raise ValueError(f"delta0 must be finite and > 0, got {delta0!r}")
    return pre, cur, radius


def _bisect_tilt(
    lp: FloatArray,
    lc: FloatArray,
    common: NDArray[np.bool_],
    r: FloatArray,
    lo: FloatArray,
    hi: FloatArray,
    kl_lo: FloatArray,
    rtol: float,
    max_iter: int,
) -> FloatArray:
    """The largest tilt beta in [lo, hi] (per state) whose policy stays inside the radius, to
    delta0 (1 - rtol) <= KL <= delta0. Invariant: KL(pi_lo || pi_cur) <= delta0 <
    KL(pi_hi || pi_cur) (hi = 1 is pi_pre), so the policy at the returned lo is always inside."""
    for _ in range(max_iter):
        todo = (kl_lo < r * (1.0 - rtol)) & (hi - lo > 4 * np.finfo(float).eps)
        if not np.any(todo):
            break
        mid = 0.5 * (lo + hi)
        kl_mid = _kl_to_cur(_tilt(lp, lc, common, mid), lc)
        inside = kl_mid <= r
        lo = np.where(todo & inside, mid, lo)
        kl_lo = np.where(todo & inside, kl_mid, kl_lo)
        hi = np.where(todo & ~inside, mid, hi)
    return lo
