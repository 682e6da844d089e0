"""Log-log exponent fits: alpha in metric ~ c n^alpha, with a bootstrap over seeds (the
tabular scaling study and the language-model drift study share them)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class ExponentFit:
    """An exponent fitted on per-n means and its spread over bootstrap resamples of the seeds."""

    alpha: float
    """Least-squares slope of log(mean over seeds) against log(n); nan if a mean is <= 0."""
    intercept: float
    """log c of the fitted line log(metric) = log c + alpha log(n)."""
    bootstrap_std: float
    """Standard deviation of alpha over the bootstrap resamples (nan if none was finite)."""
    ci95: tuple[float, float]
    """2.5% and 97.5% percentiles of the bootstrap alphas."""

    def as_json(self) -> dict[str, float | list[float] | None]:
        return {
            "alpha": finite_or_none(self.alpha),
            "intercept": finite_or_none(self.intercept),
            "bootstrap_std": finite_or_none(self.bootstrap_std),
            "ci95": [finite_or_none(x) for x in self.ci95],  # type: ignore[misc]
        }


def finite_or_none(x: float) -> float | None:
    """JSON has no nan or inf: a non-finite number is written as null."""
    return float(x) if math.isfinite(x) else None


def loglog_slope(n_values: ArrayLike, means: ArrayLike) -> tuple[float, float]:
    """(alpha, log c) of the least-squares line through (log n, log mean); nan if any mean <= 0."""
    n = np.asarray(n_values, dtype=np.float64)
    y = np.asarray(means, dtype=np.float64)
    if n.shape != y.shape or n.ndim != 1 or n.size < 2:
        raise ValueError(f"need matching 1-D arrays of >= 2 points, got {n.shape} and {y.shape}")
    if np.any(n <= 0):
        raise ValueError(f"n must be positive, got {n.tolist()}")
    if not np.all(np.isfinite(y)) or np.any(y <= 0):
        return math.nan, math.nan
    alpha, intercept = np.polyfit(np.log(n), np.log(y), 1)
    return float(alpha), float(intercept)


def fit_exponent(
    n_values: Sequence[int],
    samples_per_n: Sequence[ArrayLike],
    n_bootstrap: int = 1000,
    seed: int = 0,
) -> ExponentFit:
    """Fit alpha on the per-n means; resample the seeds of every n with replacement for the spread.

    ``samples_per_n[j]`` holds the metric of every seed (stage) at ``n_values[j]``.
    """
    if len(samples_per_n) != len(n_values):
        raise ValueError(f"{len(samples_per_n)} sample groups for {len(n_values)} values of n")
    groups = [np.asarray(s, dtype=np.float64).ravel() for s in samples_per_n]
    if any(g.size == 0 for g in groups):
        raise ValueError("every n needs at least one sample")
    alpha, intercept = loglog_slope(n_values, [g.mean() for g in groups])
    rng = np.random.default_rng(seed)
    alphas = np.full(n_bootstrap, math.nan)
    for b in range(n_bootstrap):
        means = [g[rng.integers(0, g.size, g.size)].mean() for g in groups]
        alphas[b] = loglog_slope(n_values, means)[0]
    finite = alphas[np.isfinite(alphas)]
    if finite.size == 0:
        return ExponentFit(alpha, intercept, math.nan, (math.nan, math.nan))
    low, high = np.percentile(finite, [2.5, 97.5])
    return ExponentFit(alpha, intercept, float(finite.std()), (float(low), float(high)))
