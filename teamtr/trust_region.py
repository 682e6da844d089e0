"""Per-agent KL trust regions: statistic, accept/reject, quantile monitor, backtracking.

Theorem 3.4 certifies an update whose expected KL under the occupancy it was trained on is at
most delta_i. Each rule is written once, here:

- ``check_radius``: what a radius delta_i may be (finite and > 0). ``StageConfig`` applies it
  when it is built, so the stage loop and every backend receive radii already checked;
  ``per_agent_radii`` turns a shared value or a per-agent sequence into one radius per agent.
- ``statistic_of``: per-sample (per-state or per-token) KLs -> the statistic compared with the
  radius (their weighted mean, E_d[KL_i], or a high quantile).
- ``admitted``: whether a statistic lies inside the radius, with the relative slack
  ``ADMIT_TOLERANCE`` unless told otherwise; the stage loop and ``TrustRegion`` both decide
  with it.

``TrustRegion`` bundles a radius with its statistic and slack for ``backtrack``, which shrinks a
proposed step until it is admitted and never returns a candidate that was not. Backends wrap
their own snapshot/restore around it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable
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


ADMIT_TOLERANCE = 1e-6
"""The relative slack of ``admitted`` unless a caller passes its own: a statistic up to
radius * (1 + ADMIT_TOLERANCE) is inside, so that an update which meets its radius exactly (the
exact updater solves E_d[KL_i] = delta_i to ~1e-9 relative) is not rejected for a rounding.
``StageConfig.kl_tolerance`` and ``TrustRegion.tolerance`` default to it."""

RADIUS_RULE = "radius must be > 0 (δ_i, the per-agent KL radius of Thm 3.4) and finite"
"""What ``check_radius`` requires, as its error says it."""


def check_radius(value: object, agent: int | None = None) -> float:
    """``value`` as a float if it is a valid KL radius delta_i: a real number (not a bool),
    finite and > 0. Otherwise a ValueError names the value, and ``agent`` where given.

    The one rule for a radius: ``StageConfig`` applies it to its ``radius`` when it is built
    (so a config's radii reach the stage loop checked), and the few entry points that take a
    radius without a config (``TrustRegion``, ``teamtr.check_backend``, the exact updater of
    ``sim``, the study command lines) apply this same function, never a rule of their own.
    """
    number = float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else 0
    if not (math.isfinite(number) and number > 0):
        where = "" if agent is None else f" for agent {agent}"
        raise ValueError(f"{RADIUS_RULE}, got {value!r}{where}")
    return number


def radius_error(value: object) -> str | None:
    """What ``check_radius`` says against ``value``, or None if it is a valid radius: for
    command lines that report bad options as a line of text."""
    try:
        check_radius(value)
    except ValueError as error:
        return str(error)
    return None


def _as_sequence(radius: object) -> tuple[object, ...] | None:
    """The entries of a per-agent radius (a list, tuple or array); None for a single value."""
    if isinstance(radius, numbers.Real | str | bytes) or not isinstance(radius, Iterable):
        return None
    try:
        return tuple(radius)
    except TypeError:  # a 0-d array
        return None


def checked_radius(radius: object) -> float | tuple[float, ...]:
    """A radius setting, checked: one float shared by every agent, or a non-empty sequence of
    one per agent (returned as a tuple); every value passes ``check_radius``."""
    entries = _as_sequence(radius)
    if entries is None:
        return check_radius(radius)
    if not entries:
        raise ValueError(
            f"radius must be one number or a non-empty list of one per agent, got {radius!r}"
        )
    return tuple(check_radius(r, agent) for agent, r in enumerate(entries))


def per_agent_radii(radius: object, n_agents: int) -> tuple[float, ...]:
    """One KL radius delta_i per agent from a shared value or a per-agent sequence, checked
    (``check_radius``; an error names the agent) and of length ``n_agents``."""
    if isinstance(n_agents, bool) or not isinstance(n_agents, int) or n_agents < 1:
        raise ValueError(f"n_agents must be an integer >= 1, got {n_agents!r}")
    entries = _as_sequence(radius)
    if entries is None:
        entries = (radius,) * n_agents
    elif len(entries) != n_agents:
        raise ValueError(
            f"radius must have one value per agent: {len(entries)} given for a team of "
            f"{n_agents} agents"
        )
    return tuple(check_radius(r, agent) for agent, r in enumerate(entries))


def admitted(statistic: float, radius: float, tolerance: float = ADMIT_TOLERANCE) -> bool:
    """Whether a measured KL statistic lies inside radius delta_i: statistic <= radius *
    (1 + tolerance). ``nan`` is never admitted (every comparison with it is false).

    The one admit rule: the stage loop keeps an update only if its E_d[KL_i] is admitted
    (``teamtr.stage.inside_radius``), and ``TrustRegion.admits`` is this with its own slack.
    """
    return bool(statistic <= radius * (1.0 + tolerance))


def statistic_of(
    per_sample_kl: ArrayLike,
    weights: ArrayLike | None = None,
    statistic: Statistic = "mean",
    quantile: float = 0.9,
) -> float:
    """The trust-region statistic of per-sample KLs (weights: occupancy or sample weights).

    ``"mean"`` is the (weighted) mean, the E_d[KL_i] of Thm 3.4; ``"quantile"`` the weighted
    inverse-CDF quantile at level ``quantile`` (``weighted_quantile``).
    """
    _check_statistic(statistic, quantile)
    kls = np.asarray(per_sample_kl, dtype=np.float64).ravel()
    if kls.size == 0:
        raise ValueError("per_sample_kl is empty: no KL to measure")
    if statistic == "quantile":
        return weighted_quantile(kls, quantile, weights)
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


def _check_statistic(statistic: str, quantile: float) -> None:
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {STATISTICS}, got {statistic!r}")
    if not 0.0 < quantile <= 1.0:
        raise ValueError(f"quantile must lie in (0, 1], got {quantile!r}")


@dataclass(frozen=True)
class TrustRegion:
    """An agent's KL trust region {update : statistic(KL) <= radius}, as ``backtrack`` needs it.

    ``statistic="mean"`` is the (weighted) mean per-sample KL, the E_d[KL_i] <= delta_i of
    Thm 3.4; ``"quantile"`` bounds a high quantile of the per-token KL instead (a stricter,
    outlier-aware monitor that the theorem does not need but LLM training benefits from).
    """

    radius: float
    """delta_i > 0: the largest admitted statistic (``check_radius``)."""
    statistic: Statistic = "mean"
    """Which statistic of the per-sample KL is compared with the radius."""
    quantile: float = 0.9
    """The quantile level in (0, 1], used when ``statistic == "quantile"``."""
    tolerance: float = ADMIT_TOLERANCE
    """Relative slack: admitted when statistic <= radius * (1 + tolerance) (``admitted``)."""

    def __post_init__(self) -> None:
        check_radius(self.radius)
        _check_statistic(self.statistic, self.quantile)
        if not (math.isfinite(self.tolerance) and self.tolerance >= 0):
            raise ValueError(f"tolerance must be finite and >= 0, got {self.tolerance!r}")

    def statistic_of(self, per_sample_kl: ArrayLike, weights: ArrayLike | None = None) -> float:
        """This region's statistic of per-sample KLs (the function ``statistic_of``)."""
        return statistic_of(per_sample_kl, weights, self.statistic, self.quantile)

    def admits(self, stat: float) -> bool:
        """Whether a measured statistic lies inside the region (``nan`` is never admitted)."""
        return admitted(stat, self.radius, self.tolerance)


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
