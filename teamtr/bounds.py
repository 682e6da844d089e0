"""The bounds of THEORY.md §2, discounted and episodic, in TV form and KL form.

Each function states the inequality it evaluates. The penalty constants come from
``teamtr.penalty`` (``DiscountedPenalty``, ``EpisodicPenalty``) so that the stage loop, the
certificate proxy and these bounds charge exactly the same amounts.

Notation: gamma the discount, eps_i the advantage bound of update i, TV_i / KL_i the per-state
divergences between pi_hat^i and pi_hat^{i-1} (nonzero only on agent sigma(i)'s states,
Lemma 3.1), d the occupancy of pi_hat^{i-1}, delta_i the KL radius.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from teamtr.penalty import EpisodicPenalty, PenaltyModel

FloatArray = NDArray[np.float64]


def _check_gamma(gamma: float) -> None:
    if not 0.0 <= gamma < 1.0:
        raise ValueError(f"gamma must lie in [0, 1), got {gamma!r}")


def _check_nonneg(name: str, value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")


def _nonneg_vector(name: str, values: ArrayLike) -> FloatArray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if np.any(arr < 0) or not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite and >= 0, got {arr.tolist()}")
    return arr


def _kl_vector(name: str, values: ArrayLike) -> FloatArray:
    """Measured KLs: finite; a slightly negative value (rounding, or a k1 estimate) counts as
    0, exactly as ``teamtr.penalty`` treats it, since KL itself is never negative."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got {arr.tolist()}")
    out: FloatArray = np.maximum(arr, 0.0)
    return out


def _per_update(name: str, values: float | ArrayLike, n: int) -> FloatArray:
    """A scalar broadcast to n updates, or a length-n vector."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim == 0:
        arr = np.full(n, float(arr))
    if arr.shape != (n,):
        raise ValueError(f"{name} must be a scalar or have length {n}, got shape {arr.shape}")
    return arr


# --- Performance difference and occupancy shift ------------------------------------------


def performance_difference_rhs(
    new_policy: ArrayLike, advantage: ArrayLike, new_occupancy: ArrayLike, gamma: float
) -> float:
    """Right-hand side of the performance-difference identity (THEORY.md §2):

        J(pi') - J(pi) = 1/(1-gamma) * E_{s ~ d_pi', a ~ pi'}[A_pi(s, a)].

    ``new_policy`` is pi' (S x A), ``advantage`` is A_pi (S x A), ``new_occupancy`` is d_pi'
    (normalised, length S). The identity is exact; evaluated with d_pi instead of d_pi' it is
    the surrogate L of Theorem 3.4.
    """
    _check_gamma(gamma)
    pi = np.asarray(new_policy, dtype=np.float64)
    adv = np.asarray(advantage, dtype=np.float64)
    d = np.asarray(new_occupancy, dtype=np.float64)
    if pi.shape != adv.shape or d.shape != pi.shape[:1]:
        raise ValueError(
            f"shapes must be pi (S, A), A (S, A), d (S,); got {pi.shape}, {adv.shape}, {d.shape}"
        )
    return float(np.dot(d, np.sum(pi * adv, axis=1)) / (1.0 - gamma))


def episodic_performance_difference_rhs(
    new_policy: ArrayLike, advantages: ArrayLike, new_marginals: ArrayLike
) -> float:
    """Episodic performance difference (gamma = 1, horizon H; THEORY.md §2):

        J(pi') - J(pi) = sum_{t<H} E_{s_t ~ rho_t^{pi'}, a ~ pi'}[A_t^pi(s_t, a)].

    ``advantages`` is A_t^pi with shape (H, S, A); ``new_marginals`` is rho_t^{pi'} with shape
    (H, S); ``new_policy`` is stationary (S, A) or time-dependent (H, S, A).
    """
    adv = np.asarray(advantages, dtype=np.float64)
    rho = np.asarray(new_marginals, dtype=np.float64)
    pi = np.broadcast_to(np.asarray(new_policy, dtype=np.float64), adv.shape)
    if adv.ndim != 3 or rho.shape != adv.shape[:2]:
        raise ValueError(
            f"advantages must be (H, S, A) and new_marginals (H, S); got {adv.shape}, {rho.shape}"
        )
    return float(np.sum(rho * np.sum(pi * adv, axis=2)))


def occupancy_shift_bound(gamma: float, mean_tv: float) -> float:
    """Occupancy shift, expectation form (THEORY.md §2):

        ||d_pi' - d_pi||_1 <= 2 gamma / (1-gamma) * E_{s ~ d_pi}[TV(pi', pi)(s)].

    ``mean_tv`` is the expectation under the OLD policy's occupancy d_pi.
    """
    _check_gamma(gamma)
    _check_nonneg("mean_tv", mean_tv)
    return 2.0 * gamma / (1.0 - gamma) * mean_tv


def occupancy_shift_bound_sup(gamma: float, max_tv: float) -> float:
    """Occupancy shift, sup form: ||d_pi' - d_pi||_1 <= 2 gamma / (1-gamma) * max_s TV(s)."""
    _check_gamma(gamma)
    _check_nonneg("max_tv", max_tv)
    return 2.0 * gamma / (1.0 - gamma) * max_tv


def marginal_shift_bounds(expected_tv_per_step: ArrayLike) -> FloatArray:
    """Episodic marginal shift, per step t = 0 .. H-1 (THEORY.md §2, episodic version):

        ||rho_t^{pi'} - rho_t^pi||_1 <= 2 sum_{u<t} E_{rho_u^pi}[TV_u].

    ``expected_tv_per_step[u]`` = E_{rho_u^pi}[TV(pi'_u, pi_u)], under the OLD marginals. The
    bound for t = 0 is 0 (both start from rho_0).
    """
    e = _nonneg_vector("expected_tv_per_step", expected_tv_per_step)
    out: FloatArray = 2.0 * np.concatenate([[0.0], np.cumsum(e)[:-1]]) if e.size else e
    return out


def average_occupancy_shift_bound(horizon: int, mean_tv: float) -> float:
    """Episodic shift of the average occupancy d = (1/H) sum_t rho_t:

        ||d' - d||_1 <= (1/H) sum_t 2 sum_{u<t} E_{rho_u}[TV_u] <= 2 (H-1) E_d[TV].

    The analogue of the discounted 2 gamma/(1-gamma) factor, used for the episodic drift.
    """
    if horizon < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon!r}")
    _check_nonneg("mean_tv", mean_tv)
    return 2.0 * (horizon - 1) * mean_tv


def advantage_bound_sup(r_max: float, gamma: float) -> float:
    """The sup-form advantage bound of Thm 3.4: |A(s, a)| <= A_max = 2 R_max / (1-gamma)."""
    _check_gamma(gamma)
    _check_nonneg("r_max", r_max)
    return 2.0 * r_max / (1.0 - gamma)


# --- Theorem 3.4: one update ---------------------------------------------------------------


def theorem_3_4_lower_bound(
    surrogate: float,
    advantage_bound: float,
    penalty_model: PenaltyModel,
    mean_tv: float | None = None,
    mean_kl: float | None = None,
) -> float:
    """Theorem 3.4: a lower bound on J(pi_hat^i) - J(pi_hat^{i-1}).

    TV form:  J(pi_hat^i) - J(pi_hat^{i-1}) >= L_i - 2 gamma eps_i/(1-gamma)^2 E_d[TV_i].
    KL form:  ... >= L_i - sqrt(2) gamma eps_i/(1-gamma)^2 sqrt(delta_i) when E_d[KL_i] <= delta_i
    (Pinsker and Jensen: E_d[TV] <= sqrt(E_d[KL]/2)). With an ``EpisodicPenalty`` the factor is
    2 (H-1) H instead (see ``teamtr.penalty``). Give ``mean_tv``, ``mean_kl`` (the measured
    E_d[KL_i] or the radius delta_i), or both; with both the larger (tighter) bound is
    returned, since each is valid on its own.
    """
    if mean_tv is None and mean_kl is None:
        raise ValueError("give mean_tv, mean_kl, or both")
    _check_nonneg("advantage_bound", advantage_bound)
    bounds = []
    if mean_tv is not None:
        _check_nonneg("mean_tv", mean_tv)
        bounds.append(surrogate - penalty_model.tv_penalty(advantage_bound, mean_tv))
    if mean_kl is not None:
        if not math.isfinite(mean_kl):
            raise ValueError(f"mean_kl must be finite, got {mean_kl!r}")
        bounds.append(surrogate - penalty_model.kl_penalty(advantage_bound, mean_kl))
    return max(bounds)


def episodic_update_lower_bound(
    surrogate: float, advantage_bound: float, expected_tv_per_step: ArrayLike
) -> float:
    """Theorem 3.4, episodic per-step form (tighter than ``EpisodicPenalty``):

        J(pi') - J(pi) >= L - eps sum_{t<H} ||rho_t' - rho_t||_1
                       >= L - 2 eps sum_{u<H} (H-1-u) E_{rho_u}[TV_u],

    with L = sum_t E_{rho_t^pi, a ~ pi'}[A_t^pi] and eps >= max_{t,s} |E_{a~pi'} A_t^pi(s, a)|.
    """
    _check_nonneg("advantage_bound", advantage_bound)
    shifts = marginal_shift_bounds(expected_tv_per_step)
    return float(surrogate - advantage_bound * np.sum(shifts))


def kl_penalty_coefficient(advantage_bound: float, penalty_model: PenaltyModel) -> float:
    """C_i such that the KL-form penalty of Thm 3.4 is C_i sqrt(delta_i).

    Discounted: C_i = sqrt(2) gamma eps_i / (1-gamma)^2 (Thm 3.6); episodic: sqrt(2) (H-1) H eps_i.
    """
    _check_nonneg("advantage_bound", advantage_bound)
    return penalty_model.kl_penalty(advantage_bound, 1.0)


def estimation_bias_term(zeta: float, gamma: float) -> float:
    """Thm 3.4 with estimated advantages of bias zeta_i: the bound loses zeta_i / (1-gamma)."""
    _check_gamma(gamma)
    _check_nonneg("zeta", zeta)
    return zeta / (1.0 - gamma)


def hoeffding_term(range_bound: float, n: int, eta: float) -> float:
    """Hoeffding deviation of a mean of n i.i.d. samples in [-B, B], w.p. >= 1 - eta:

        |mean - E| <= 2 B sqrt(log(2/eta) / (2 n)).

    The range of [-B, B] is 2B, hence the factor 2 (THEORY.md §2 remark: not B sqrt(..)).
    """
    _check_nonneg("range_bound", range_bound)
    if isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    if not 0.0 < eta < 1.0:
        raise ValueError(f"eta must lie in (0, 1), got {eta!r}")
    return 2.0 * range_bound * math.sqrt(math.log(2.0 / eta) / (2.0 * n))


# --- Theorem 3.6: a stage ------------------------------------------------------------------


def theorem_3_6_stage_bound(
    surrogates: ArrayLike,
    advantage_bounds: float | ArrayLike,
    kls: float | ArrayLike,
    penalty_model: PenaltyModel,
    mean_tvs: ArrayLike | None = None,
) -> float:
    """Theorem 3.6: J(pi_bar) - J(pi_cur) >= sum_i [L_i - C_i sqrt(delta_i)].

    Telescoping Thm 3.4 over the stage's order (any sigma). ``kls`` are the radii delta_i or
    the measured E_{d_{pi_hat^{i-1}}}[KL_i] (either is valid; measured values are tighter).
    With ``mean_tvs`` each term uses the larger of its TV and KL bounds. Each L_i must be the
    surrogate under the intermediate team pi_hat^{i-1} (this is what makes the sum telescope).
    """
    l_values = np.asarray(surrogates, dtype=np.float64)
    if l_values.ndim != 1:
        raise ValueError(f"surrogates must be one-dimensional, got shape {l_values.shape}")
    n = l_values.size
    eps = _per_update("advantage_bounds", advantage_bounds, n)
    kl_values = _per_update("kls", kls, n)
    tvs = None if mean_tvs is None else _per_update("mean_tvs", mean_tvs, n)
    total = 0.0
    for i in range(n):
        total += theorem_3_4_lower_bound(
            float(l_values[i]),
            float(eps[i]),
            penalty_model,
            mean_tv=None if tvs is None else float(tvs[i]),
            mean_kl=float(kl_values[i]),
        )
    return total


# --- Theorem 3.7: stale versus intermediate occupancy ---------------------------------------


def theorem_3_7_drift_bound(
    gamma: float, radii_before: Sequence[float] | ArrayLike, horizon: int | None = None
) -> float:
    """Theorem 3.7 drift of the occupancy before update i from the stage-start one:

        ||d_{pi_hat^{i-1}} - d_{pi_cur}||_1 <= sum_{k<i} 2 gamma/(1-gamma) sqrt(delta_k / 2).

    ``radii_before`` are delta_k of the updates k < i. Triangle inequality over the
    intermediate teams plus the occupancy shift and Pinsker; it requires
    E_{d_{pi_hat^{k-1}}}[KL_k] <= delta_k, i.e. each radius enforced under the occupancy the
    update actually starts from (or in sup form). An update constrained only under the
    stage-start occupancy (the stale scheme) does not by itself satisfy this premise.
    With ``horizon`` (episodic, gamma ignored) the factor is 2 (H-1) for the average occupancy.
    """
    radii = _kl_vector("radii_before", radii_before)
    if horizon is None:
        _check_gamma(gamma)
        factor = 2.0 * gamma / (1.0 - gamma)
    else:
        if horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {horizon!r}")
        factor = 2.0 * (horizon - 1)
    return float(factor * np.sum(np.sqrt(radii / 2.0)))


def stale_penalty_sum(coefficients: float | ArrayLike, radii: ArrayLike) -> float:
    """Theorem 3.7, stale scheme: sum_i C_i sum_{k<=i} sqrt(delta_k) = Theta(n^2 sqrt(delta)).

    Update i is charged for its own divergence and for the drift of every earlier update.
    """
    r = _kl_vector("radii", radii)
    c = _per_update("coefficients", coefficients, r.size)
    return float(np.sum(c * np.cumsum(np.sqrt(r))))


def intermediate_penalty_sum(coefficients: float | ArrayLike, radii: ArrayLike) -> float:
    """Theorem 3.6, intermediate occupancy: sum_i C_i sqrt(delta_i) = Theta(n sqrt(delta))."""
    r = _kl_vector("radii", radii)
    c = _per_update("coefficients", coefficients, r.size)
    return float(np.sum(c * np.sqrt(r)))


# --- The language-model certificate proxy ---------------------------------------------------


def horizon_constant(advantage_bound: float, horizon: int) -> float:
    """The constant c of the certificate proxy for an episode of H decisions:

        c = 2 eps H (H-1),  so that c sqrt(KL/2) = EpisodicPenalty(H).kl_penalty(eps, KL).

    ``advantage_bound`` is the declared A_max the advantages are clipped to; the KL fed to the
    proxy must be per decision, averaged over the episode's H decision points.
    """
    _check_nonneg("advantage_bound", advantage_bound)
    return EpisodicPenalty(horizon).tv_coefficient * advantage_bound


def certificate_proxy(surrogates: ArrayLike, kls: ArrayLike, c: float | ArrayLike) -> float:
    """The stage certificate proxy sum_i [L_hat_i - c sqrt(KL_hat_i / 2)] (THEORY.md §2).

    With exact L_i and E[KL_i] and c from :func:`horizon_constant` this is the Thm 3.6 lower
    bound; with estimates from rollouts it is only a proxy (no concentration term is added).
    """
    l_values = np.asarray(surrogates, dtype=np.float64)
    if l_values.ndim != 1:
        raise ValueError(f"surrogates must be one-dimensional, got shape {l_values.shape}")
    kl_values = _kl_vector("kls", kls)
    if kl_values.shape != l_values.shape:
        raise ValueError(
            f"kls must have the length of surrogates ({l_values.size}), got {kl_values.size}"
        )
    constants = _per_update("c", c, l_values.size)
    if np.any(constants < 0):
        raise ValueError("c must be >= 0")
    return float(np.sum(l_values - constants * np.sqrt(kl_values / 2.0)))
