"""Per-agent KL trust regions: statistic, accept/reject, quantile monitor, backtracking.

Theorem 3.4 certifies an update whose expected KL under the occupancy it was trained on is at
most delta_i. ``TrustRegion`` turns per-sample (per-state or per-token) KLs into that statistic
and decides admission; ``backtrack`` shrinks a proposed step until it is admitted, and never
returns a candidate that was not. Backends wrap their own snapshot/restore around it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar, get_args

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]
Statistic = Literal["mean", "quantile"]
STATISTICS: tuple[str, ...] = get_args(Statistic)

CandidateT = TypeVar("CandidateT")


def weighted_quantile(
    values: ArrayLike, quantile: float, weights: ArrayLike | None = None
) -> float:
    """Inverse-CDF quantile: the smallest value v with (weighted) CDF(v) >= ``quantile``.

    Without weights this equals ``np.quantile(values, quantile, method="inverted_cdf")``. It
    never interpolates, so the result is always one of the observed values.
    """
    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size == 0:
        raise ValueError("quantile of an empty sample is undefined")
    if weights is None:
        w = np.ones_like(v)
    else:
        w = np.asarray(weights, dtype=np.float64).ravel()
        if w.shape != v.shape:
            raise ValueError(f"weights must have shape {v.shape}, got {w.shape}")
        if np.any(w < 0) or not np.all(np.isfinite(w)) or w.sum() <= 0:
            raise ValueError("weights must be finite, non-negative and not all zero")
    order = np.argsort(v, kind="stable")
    cdf = np.cumsum(w[order])
    cdf /= cdf[-1]
    # Guard the comparison against the last cumulative sum rounding to just below 1.
    index = int(np.searchsorted(cdf, quantile * (1.0 - 1e-12), side="left"))
    return float(v[order][min(index, v.size - 1)])


@dataclass(frozen=True)
class TrustRegion:
    """An agent's KL trust region {update : statistic(KL) <= radius}.

    ``statistic="mean"`` is the (weighted) mean per-sample KL, the E_d[KL_i] <= delta_i of
    Thm 3.4; ``"quantile"`` bounds a high quantile of the per-token KL instead (a stricter,
    outlier-aware monitor that the theorem does not need but LLM training benefits from).
    """

    radius: float
    """delta_i > 0: the largest admitted statistic."""
    statistic: Statistic = "mean"
    """Which statistic of the per-sample KL is compared with the radius."""
    quantile: float = 0.9
    """The quantile level in (0, 1], used when ``statistic == "quantile"``."""
    tolerance: float = 1e-9
    """Relative slack: admitted when statistic <= radius * (1 + tolerance)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.radius) and self.radius > 0):
            raise ValueError(f"radius must be finite and > 0, got {self.radius!r}")
        if self.statistic not in STATISTICS:
            raise ValueError(f"statistic must be one of {STATISTICS}, got {self.statistic!r}")
        if not 0.0 < self.quantile <= 1.0:
            raise ValueError(f"quantile must lie in (0, 1], got {self.quantile!r}")
        if not (math.isfinite(self.tolerance) and self.tolerance >= 0):
            raise ValueError(f"tolerance must be finite and >= 0, got {self.tolerance!r}")

    def statistic_of(self, per_sample_kl: ArrayLike, weights: ArrayLike | None = None) -> float:
        """The trust-region statistic of per-sample KLs (weights: occupancy or sample weights)."""
        kls = np.asarray(per_sample_kl, dtype=np.float64).ravel()
        if kls.size == 0:
            raise ValueError("per_sample_kl is empty: no KL to measure")
        if self.statistic == "quantile":
            return weighted_quantile(kls, self.quantile, weights)
        if weights is None:
            return float(np.mean(kls))
        w = np.asarray(weights, dtype=np.float64).ravel()
        if w.shape != kls.shape:
            raise ValueError(f"weights must have shape {kls.shape}, got {w.shape}")
        if np.any(w < 0) or not np.all(np.isfinite(w)) or w.sum() <= 0:
            raise ValueError("weights must be finite, non-negative and not all zero")
        visited = w > 0
        # Zero-weight samples do not count, even with an infinite KL.
        with np.errstate(invalid="ignore"):
            weighted = np.where(visited, w * kls, 0.0)
        return float(np.sum(weighted) / w.sum())

    def admits(self, stat: float) -> bool:
        """Whether a measured statistic lies inside the region (``nan`` is never admitted)."""
        return bool(stat <= self.radius * (1.0 + self.tolerance))


class QuantileMonitor:
    """Running quantile of per-token KLs across batches.

    Exact while fewer than ``capacity`` values have been seen; beyond that it keeps a uniform
    random subsample of size ``capacity`` (each value gets a uniform key, the smallest keys are
    kept), so memory stays bounded on long runs. ``capacity=None`` keeps everything.
    """

    def __init__(self, quantile: float = 0.9, capacity: int | None = None, seed: int = 0):
        if not 0.0 < quantile <= 1.0:
            raise ValueError(f"quantile must lie in (0, 1], got {quantile!r}")
        if capacity is not None and capacity < 1:
            raise ValueError(f"capacity must be >= 1 or None, got {capacity!r}")
        self.quantile = quantile
        self.capacity = capacity
        self._rng = np.random.default_rng(seed)
        self._values = np.empty(0)
        self._keys = np.empty(0)
        self._count = 0

    @property
    def count(self) -> int:
        """How many values have been observed (not how many are kept)."""
        return self._count

    def update(self, values: ArrayLike, mask: ArrayLike | None = None) -> None:
        """Observe a batch of per-token KLs (``mask`` selects the real tokens)."""
        v = np.asarray(values, dtype=np.float64)
        if mask is not None:
            keep = np.asarray(mask).astype(bool)
            if keep.shape != v.shape:
                raise ValueError(f"mask must have shape {v.shape}, got {keep.shape}")
            v = v[keep]
        v = v.ravel()
        if v.size == 0:
            return
        self._count += v.size
        self._values = np.concatenate([self._values, v])
        if self.capacity is None:
            return
        self._keys = np.concatenate([self._keys, self._rng.random(v.size)])
        if self._values.size > self.capacity:
            kept = np.argpartition(self._keys, self.capacity - 1)[: self.capacity]
            self._values = self._values[kept]
            self._keys = self._keys[kept]

    @property
    def value(self) -> float:
        """The current quantile (inverse CDF of the kept values)."""
        if self._values.size == 0:
            raise ValueError("QuantileMonitor has observed no values yet")
        return weighted_quantile(self._values, self.quantile)

    def reset(self) -> None:
        """Forget every observed value (e.g. at the start of the next update)."""
        self._values = np.empty(0)
        self._keys = np.empty(0)
        self._count = 0


@dataclass(frozen=True)
class BacktrackResult(Generic[CandidateT]):
    """The outcome of :func:`backtrack`."""

    accepted: bool
    """Whether some step was admitted by the trust region."""
    step_scale: float
    """The admitted step's scale; 0.0 when rejected (no step is taken)."""
    statistic: float
    """The admitted candidate's statistic; when rejected, the last (smallest) one measured."""
    backtracks: int
    """How many times the step was shrunk."""
    candidate: CandidateT | None = None
    """The admitted candidate, or None when rejected: a rejected update is never kept."""


def backtrack(
    propose: Callable[[float], CandidateT],
    measure: Callable[[CandidateT], float],
    trust_region: TrustRegion,
    shrink: float = 0.5,
    max_backtracks: int = 10,
    initial_scale: float = 1.0,
) -> BacktrackResult[CandidateT]:
    """Shrink a step until its KL statistic is inside ``trust_region``.

    Tries scales ``initial_scale * shrink**b`` for ``b = 0 .. max_backtracks``: ``propose(scale)``
    builds the candidate, ``measure(candidate)`` returns its statistic. The first admitted
    candidate is returned; if none is, the result is rejected and carries no candidate, so the
    caller keeps the old policy (the certificate then charges nothing for this update).
    """
    if not 0.0 < shrink < 1.0:
        raise ValueError(f"shrink must lie in (0, 1), got {shrink!r}")
    if isinstance(max_backtracks, bool) or max_backtracks < 0:
        raise ValueError(f"max_backtracks must be an integer >= 0, got {max_backtracks!r}")
    if not (math.isfinite(initial_scale) and initial_scale > 0):
        raise ValueError(f"initial_scale must be finite and > 0, got {initial_scale!r}")
    scale = initial_scale
    stat = math.nan
    for attempt in range(max_backtracks + 1):
        candidate = propose(scale)
        stat = float(measure(candidate))
        if trust_region.admits(stat):
            return BacktrackResult(True, scale, stat, attempt, candidate)
        scale *= shrink
    return BacktrackResult(False, 0.0, stat, max_backtracks, None)


def per_agent_radii(radius: float | Sequence[float], n_agents: int) -> tuple[float, ...]:
    """One KL radius delta_i per agent from a shared float or a per-agent sequence."""
    if isinstance(n_agents, bool) or n_agents < 1:
        raise ValueError(f"n_agents must be an integer >= 1, got {n_agents!r}")
    if isinstance(radius, int | float | np.floating | np.integer):
        radii = (float(radius),) * n_agents
    else:
        radii = tuple(float(r) for r in radius)
        if len(radii) != n_agents:
            raise ValueError(f"radius needs one value per agent ({n_agents}), got {len(radii)}")
    for i, r in enumerate(radii):
        if not (math.isfinite(r) and r > 0):
            raise ValueError(f"radius of agent {i} must be finite and > 0, got {r!r}")
    return radii
