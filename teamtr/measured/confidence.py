"""The confidence bounds of the measured certificate: lower bounds on a bounded mean.

Rewards lie in [lo, lo + w] (``reward_width`` w), so a difference lies in [-w, w], a range of
R = 2w. Three bounds valid at finite n, each computed on X = (D + w) / (2w) in [0, 1] and mapped
back (D's mean is 2w E[X] - w); Waudby-Smith & Ramdas (2024, JRSS-B 86(1), "Estimating means
of bounded random variables by betting") is "WSR" below:

* ``"hedged"`` (default): one side of WSR's hedged capital process. For a candidate mean m,
  K+(m) = prod_i (1 + lambda_i(m) (X_i - m)), lambda_i(m) = min(lambda_i, c/m) with a
  predictable lambda_i >= 0 and c = ``HEDGE_TRUNCATION`` in (0, 1): every factor is >= 1 - c
  > 0, and at m = E[X] (i.i.d. X) K+ is a nonnegative martingale of mean 1, so
  P(K+_n(E[X]) >= 1/alpha) <= alpha (Markov; Ville's inequality for every n at once). Each
  factor is continuous and nonincreasing in m (with lambda = c/m it is 1 - c + c X/m), so
  {m : K+_n(m) < 1/alpha} is an interval up to 1 and its infimum L is a lower confidence
  bound: P(E[X] < L) <= alpha. L is found by bisection and rounded down. The bets are WSR's
  predictable plug-in for a fixed n, one-sided: lambda_i = sqrt(2 log(1/alpha) /
  (n sigma2_{i-1})), with mu_t and sigma2_t below.
* ``"betting"``: WSR's predictable plug-in empirical-Bernstein bound (their Theorem 2), one side
  of it: for any predictable lambda_i in (0, 1),
  M_t(m) = prod_i exp(lambda_i (X_i - m) - v_i psi_E(lambda_i)) is a nonnegative
  supermartingale at m = E[X], with v_i = 4 (X_i - mu_{i-1})^2 and
  psi_E(l) = (-log(1 - l) - l) / 4, so by Ville's inequality, with probability >= 1 - alpha,
  E[X] >= (sum lambda_i X_i - log(1/alpha) - sum v_i psi_E(lambda_i)) / sum lambda_i.
  lambda_i = min(sqrt(2 log(1/alpha) / (n sigma2_{i-1})), 1/2), the paper's fixed-n tuning.
  Its bets are capped at 1/2 whatever m, so below a few hundred pairs its gap is dominated by
  the range; the hedged bound's cap c/m grows as m falls.
* ``"bernstein"``: Maurer & Pontil (2009), Theorem 4, applied to 1 - X:
  E[D] >= mean - sqrt(2 V ln(2/alpha) / n) - 7 R ln(2/alpha) / (3 (n - 1)),
  V the unbiased sample variance of D (n >= 2).

mu_t = (1/2 + sum_{j<=t} X_j)/(t + 1), sigma2_t = (1/4 + sum_{j<=t} (X_j - mu_j)^2)/(t + 1).
The two betting bounds depend on the order of the pairs, which is the sampler's
(exchangeable) order.

Anytime (``anytime_lower_bound``, ``anytime_upper_bound``, ``sequential_measure``): the same
hedged process with WSR's bets for a confidence sequence, lambda_t = sqrt(2 log(1/alpha) /
(sigma2_{t-1} t log(1 + t))), which do not depend on a planned n. By Ville's inequality
P(exists t: K+_t(E[X]) >= 1/alpha) <= alpha, so the bound L_t holds at every t at once, and
so at a data-dependent stopping time: pairs can be drawn in batches until L_t clears 0.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import numpy as np
from numpy.typing import ArrayLike, NDArray

BoundName = Literal["hedged", "betting", "bernstein"]
BOUNDS: tuple[str, ...] = get_args(BoundName)
DEFAULT_BOUND: BoundName = "hedged"
"""The bound of ``measure``, ``lower_bound`` and ``StageConfig.certificate_bound``."""
ANYTIME = "anytime"
"""The method a certificate from sequential draws records (``sequential_measure``)."""
HEDGE_TRUNCATION = 0.5
"""c of the hedged capital process: a bet against a candidate mean m is at most c/m on the
[0, 1] scale, so every factor 1 + lambda (X - m) is at least 1 - c > 0 (Waudby-Smith &
Ramdas 2024 suggest c = 1/2 or 3/4)."""
BISECTION_TOLERANCE = 1e-10
"""Where the bisection for a hedged bound stops, on the [0, 1] scale (it returns the lower
end, so the bound errs low by at most this)."""


def _unit(differences: ArrayLike, reward_width: float) -> NDArray[np.float64]:
    """D in [-w, w] mapped to X = (D + w) / (2w) in [0, 1] (clipped for rounding only)."""
    values = np.asarray(differences, dtype=np.float64).ravel()
    return np.clip((values + reward_width) / (2 * reward_width), 0.0, 1.0)


def _check_alpha(alpha: float) -> None:
    if not (0.0 < alpha < 1.0):
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")


def bernstein_lower_bound(differences: ArrayLike, reward_width: float, alpha: float) -> float:
    """Maurer & Pontil (2009) Thm 4 lower bound on E[D] at level 1 - alpha (n >= 2):
    mean - sqrt(2 V ln(2/alpha) / n) - 7 R ln(2/alpha) / (3 (n - 1)), R = 2w."""
    _check_alpha(alpha)
    values = np.asarray(differences, dtype=np.float64).ravel()
    n = values.size
    if n < 2:
        return -reward_width
    log_term = math.log(2.0 / alpha)
    variance = float(values.var(ddof=1))
    spread = math.sqrt(2.0 * variance * log_term / n)
    bound = float(values.mean()) - spread - 7.0 * (2 * reward_width) * log_term / (3.0 * (n - 1))
    return max(bound, -reward_width)


def _psi_e(lam: NDArray[np.float64]) -> NDArray[np.float64]:
    """psi_E(lambda) = (-log(1 - lambda) - lambda) / 4 (Waudby-Smith & Ramdas 2023, eq. 13)."""
    return (-np.log1p(-lam) - lam) / 4.0


def _plug_in_estimates(x: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """mu_t and sigma2_t (module docstring) after t = 0 .. n observations; step i bets with
    index i - 1, so its bet is predictable."""
    counts = np.arange(1, x.size + 1, dtype=np.float64)
    mu = np.concatenate(([0.5], (0.5 + np.cumsum(x)) / (counts + 1)))
    squared = np.cumsum((x - mu[1:]) ** 2)
    sigma2 = np.concatenate(([0.25], (0.25 + squared) / (counts + 1)))
    return mu, sigma2


def betting_lower_bound(
    differences: ArrayLike, reward_width: float, alpha: float, max_bet: float = 0.5
) -> float:
    """One side of Waudby-Smith & Ramdas (2024) Thm 2 (PrPl-EB) on E[D] at level 1 - alpha,
    with the fixed-n tuning of lambda (module docstring)."""
    _check_alpha(alpha)
    x = _unit(differences, reward_width)
    n = x.size
    if n == 0:
        return -reward_width
    mu, sigma2 = _plug_in_estimates(x)
    log_alpha = math.log(1.0 / alpha)
    lam = np.minimum(np.sqrt(2.0 * log_alpha / (n * sigma2[:-1])), max_bet)
    v = 4.0 * (x - mu[:-1]) ** 2
    lower_x = (float(lam @ x) - log_alpha - float(v @ _psi_e(lam))) / float(lam.sum())
    return max(2 * reward_width * lower_x - reward_width, -reward_width)


def fixed_n_bets(x: NDArray[np.float64], alpha: float) -> NDArray[np.float64]:
    """Predictable plug-in bets for n = len(x) pairs, one-sided (Waudby-Smith & Ramdas 2024):
    lambda_i = sqrt(2 log(1/alpha) / (n sigma2_{i-1})), before the truncation at c/m."""
    _, sigma2 = _plug_in_estimates(x)
    return np.sqrt(2.0 * math.log(1.0 / alpha) / (x.size * sigma2[:-1]))


def anytime_bets(x: NDArray[np.float64], alpha: float) -> NDArray[np.float64]:
    """Predictable plug-in bets of a confidence sequence (Waudby-Smith & Ramdas 2024):
    lambda_t = sqrt(2 log(1/alpha) / (sigma2_{t-1} t log(1 + t))), no planned n."""
    _, sigma2 = _plug_in_estimates(x)
    t = np.arange(1, x.size + 1, dtype=np.float64)
    return np.sqrt(2.0 * math.log(1.0 / alpha) / (sigma2[:-1] * t * np.log1p(t)))


def log_hedged_capital(
    x: NDArray[np.float64], bets: NDArray[np.float64], m: float, truncation: float
) -> float:
    """log K+(m) = sum_i log(1 + min(bets_i, c/m) (X_i - m)), X on [0, 1], m in [0, 1]."""
    lam = bets if m <= 0.0 else np.minimum(bets, truncation / m)
    return float(np.log1p(lam * (x - m)).sum())


def _hedged_lower_unit(
    x: NDArray[np.float64], bets: NDArray[np.float64], alpha: float, truncation: float
) -> float:
    """inf {m in [0, 1] : K+(m) < 1/alpha}, rounded down: K+ is nonincreasing in m (module
    docstring), so bisection keeps low with K+(low) >= 1/alpha and high with K+(high) < 1/alpha."""
    threshold = math.log(1.0 / alpha)
    if x.size == 0 or log_hedged_capital(x, bets, 0.0, truncation) < threshold:
        return 0.0
    # At m = 1 every factor is 1 + lambda (X - 1) <= 1, so K+(1) <= 1 < 1/alpha.
    low, high = 0.0, 1.0
    while high - low > BISECTION_TOLERANCE:
        middle = 0.5 * (low + high)
        if log_hedged_capital(x, bets, middle, truncation) >= threshold:
            low = middle
        else:
            high = middle
    return low


def _check_truncation(truncation: float) -> None:
    if not (0.0 < truncation < 1.0):
        raise ValueError(f"truncation c must lie in (0, 1), got {truncation!r}")


def hedged_lower_bound(
    differences: ArrayLike,
    reward_width: float,
    alpha: float,
    truncation: float = HEDGE_TRUNCATION,
) -> float:
    """One side of Waudby-Smith & Ramdas (2024)'s hedged capital bound on E[D] at level
    1 - alpha, with the fixed-n plug-in bets (module docstring)."""
    _check_alpha(alpha)
    _check_truncation(truncation)
    x = _unit(differences, reward_width)
    lower_x = _hedged_lower_unit(x, fixed_n_bets(x, alpha), alpha, truncation)
    return 2 * reward_width * lower_x - reward_width


def anytime_lower_bound(
    differences: ArrayLike,
    reward_width: float,
    alpha: float,
    truncation: float = HEDGE_TRUNCATION,
) -> float:
    """The hedged capital confidence sequence's lower bound on E[D] after these pairs, in
    their order: with probability >= 1 - alpha it holds after every number of pairs at once
    (Ville's inequality), so at any stopping time."""
    _check_alpha(alpha)
    _check_truncation(truncation)
    x = _unit(differences, reward_width)
    lower_x = _hedged_lower_unit(x, anytime_bets(x, alpha), alpha, truncation)
    return 2 * reward_width * lower_x - reward_width


def anytime_upper_bound(
    differences: ArrayLike,
    reward_width: float,
    alpha: float,
    truncation: float = HEDGE_TRUNCATION,
) -> float:
    """The confidence sequence's upper bound on E[D]: the lower bound of -D, negated (the
    process K-(m) = prod (1 - lambda_i(m) (X_i - m)), lambda_i(m) = min(lambda_i, c/(1 - m)),
    is K+ of 1 - X; the plug-in variance of 1 - X is that of X, so the bets are the same)."""
    values = np.asarray(differences, dtype=np.float64).ravel()
    return -anytime_lower_bound(-values, reward_width, alpha, truncation)


def lower_bound(
    differences: ArrayLike, reward_width: float, alpha: float, method: str = DEFAULT_BOUND
) -> float:
    """The ``method`` lower bound on E[D], never below -w (the trivial bound); ``"anytime"``
    is the confidence sequence's (``anytime_lower_bound``), the bound of sequential draws."""
    if method == "hedged":
        return hedged_lower_bound(differences, reward_width, alpha)
    if method == ANYTIME:
        return anytime_lower_bound(differences, reward_width, alpha)
    if method == "bernstein":
        return bernstein_lower_bound(differences, reward_width, alpha)
    if method == "betting":
        return betting_lower_bound(differences, reward_width, alpha)
    raise ValueError(f"method must be one of {(*BOUNDS, ANYTIME)}, got {method!r}")
