"""The measured certificate: a confidence bound on each update's improvement from held-out pairs.

After agent k's update (pi_hat^{i-1} -> pi_hat^i), a held-out episode of pi_hat^{i-1} keeps its
turns before agent k's first turn (drawn by agents the update did not change, so distributed
alike under both teams, Lemma 3.1's setting) and is continued by pi_hat^i. The new return minus
the old has expectation J(pi_hat^i) - J(pi_hat^{i-1}); held out of the update (not in its
gradient, nor in its KL), the n differences of one update are i.i.d. given the update, so a
one-sided lower confidence bound on their mean bounds the update's true improvement with
probability at least 1 - alpha (high-confidence policy improvement, Thomas et al. 2015).

The bounds themselves: ``teamtr.measured.confidence``.


A stage's bound (Thm 3.6's telescoping, J(pi_bar) - J(pi_cur) = sum_i gains): each of the m
updates of its order is bounded at level alpha/m and the bounds are summed; by the union bound
all m hold together with probability >= 1 - alpha. An update not kept gains exactly 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from numpy.typing import ArrayLike, NDArray

from teamtr.measured.confidence import (
    ANYTIME,
    DEFAULT_BOUND,
    anytime_lower_bound,
    anytime_upper_bound,
    lower_bound,
)

DEFAULT_LEVEL = 0.95
"""1 - alpha of the measured certificate (``StageConfig.certificate_level``)."""


@dataclass(frozen=True)
class PairedDifferences:
    """What a sampler hands the core for one update: new return minus old, one per held-out
    pair (i.i.d. given the update), and the width of one return's range."""

    differences: NDArray[np.float64]
    reward_width: float
    """w: every return lies in an interval of width w, so a difference lies in [-w, w]."""
    updated_agent: int | None = None
    """The agent whose update the continuation measures (the draw's ``updated_agent``)."""

    def __post_init__(self) -> None:
        values = np.asarray(self.differences, dtype=np.float64).ravel()
        object.__setattr__(self, "differences", values)
        if not (math.isfinite(self.reward_width) and self.reward_width > 0):
            raise ValueError(f"reward_width must be finite and > 0, got {self.reward_width!r}")
        if not np.all(np.isfinite(values)):
            raise ValueError("paired differences must be finite")
        # A small float slack: returns summed over a horizon carry rounding.
        if values.size and np.abs(values).max() > self.reward_width * (1 + 1e-9):
            raise ValueError(
                f"a paired difference {np.abs(values).max():g} lies outside "
                f"[-{self.reward_width:g}, {self.reward_width:g}]"
            )


@dataclass(frozen=True)
class MeasuredCertificate:
    """A lower confidence bound on an improvement, from paired differences."""

    n: int
    """Number of pairs (for a stage: over all its updates)."""
    mean: float
    """Their mean difference (for a stage: the sum of the updates' means)."""
    bound: float
    """With probability >= ``level``, the true improvement is >= ``bound``."""
    level: float
    """1 - alpha."""
    method: str
    reward_width: float
    differences: NDArray[np.float64] | None = field(default=None, compare=False, repr=False)
    """The pairs themselves (None for a stage)."""
    sd: float | None = None
    """Their sample standard deviation (ddof 1; None for a stage and below 2 pairs): with
    ``mean``, what ``pairs_to_certify`` needs to say how many pairs an update like it takes."""
    stop: str | None = None
    """Why sequential draws stopped (``sequential_measure``: ``STOPS``); None for a fixed n."""

    @property
    def certified(self) -> bool:
        """Whether the bound certifies a strict improvement."""
        return self.bound > 0

    def as_dict(self) -> dict[str, float | int | str]:
        """The certificate without its pairs, for records and logs."""
        record: dict[str, float | int | str] = {
            "n": self.n,
            "mean": self.mean,
            "bound": self.bound,
            "level": self.level,
            "method": self.method,
            "reward_width": self.reward_width,
        }
        if self.sd is not None:
            record["sd"] = self.sd
        if self.stop is not None:
            record["stop"] = self.stop
        return record

    def line(self) -> str:
        """'improvement >= +0.12 with 95% confidence (n = 64 pairs)'."""
        return (
            f"improvement >= {self.bound:+.3g} with {100 * self.level:g}% confidence "
            f"(n = {self.n} pairs)"
        )


def pairs_to_certify(
    mean: float, sd: float, reward_width: float, level: float = DEFAULT_LEVEL, limit: int = 10**7
) -> int | None:
    """The fewest pairs whose Maurer & Pontil bound (``bernstein_lower_bound``) is > 0 when
    their mean and standard deviation are ``mean`` and ``sd``: what sample size certifies an
    update of that size, a conservative answer: the betting bounds (hedged, the default, and
    betting) adapt to the pairs and usually need fewer. None when the mean is not positive or
    more than ``limit`` pairs would be needed."""
    if mean <= 0:
        return None
    alpha = 1.0 - level
    log_term = math.log(2.0 / alpha)

    def certifies(n: int) -> bool:
        spread = math.sqrt(2.0 * sd**2 * log_term / n)
        return mean - spread - 7.0 * (2 * reward_width) * log_term / (3.0 * (n - 1)) > 0

    if not certifies(limit):
        return None
    low, high = 1, limit  # certifies(high); the bound grows with n, so bisect
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if certifies(middle) else (middle, high)
    return high


def measure(
    pairs: PairedDifferences, level: float = DEFAULT_LEVEL, method: str = DEFAULT_BOUND
) -> MeasuredCertificate:
    """The measured certificate of one update at ``level`` = 1 - alpha."""
    values = pairs.differences
    return MeasuredCertificate(
        n=int(values.size),
        mean=float(values.mean()) if values.size else math.nan,
        bound=lower_bound(values, pairs.reward_width, 1.0 - level, method),
        level=level,
        method=method,
        reward_width=pairs.reward_width,
        differences=values,
        sd=float(values.std(ddof=1)) if values.size >= 2 else None,
    )


STOPS = ("certified", "futile", "cap")
"""Why sequential draws stop: the anytime bound cleared 0; the futility rule says it will not
within the cap; the cap was reached."""

FUTILITY_RULES = ("trend", "upper_bound")
"""When sequential draws give up before the cap (``sequential_stop``): 'trend' (the default)
once the pairs, continued at their mean plus one standard error, would not be certified at
the cap; 'upper_bound' only once even the anytime upper bound's mean would not be."""

TREND_FROM = 32
"""The pairs 'trend' waits for before it judges (below that their spread is too rough an
estimate: 16 coupled pairs are often 15 zeros)."""

TREND_STANDARD_ERRORS = 1.0
"""How far above the pairs' mean 'trend' continues them: one standard error (with TREND_FROM,
the setting of docs/measured_certificate.md's simulation, "Giving up on the trend")."""


def sequential_stop(
    differences: ArrayLike,
    reward_width: float,
    alpha: float,
    cap: int,
    futility: str = "trend",
) -> str | None:
    """Whether pairs drawn in batches stop here (``STOPS``), or None: draw more.

    * "certified": the anytime lower bound is > 0;
    * "cap": ``cap`` pairs are drawn;
    * "futile": the anytime upper bound U is <= 0 (no improvement to certify), or the pairs so
      far, repeated up to ``cap`` and shifted to a mean m, would not clear 0 at the cap, where
      m = U (``futility = "upper_bound"``: even the largest mean the pairs allow, with their
      spread, would not be certified) or, from ``TREND_FROM`` pairs on, m = their mean plus
      ``TREND_STANDARD_ERRORS`` standard errors (``"trend"``, the stochastic curtailment of
      sequential trials: an update on its current trend would not be certified).

    Stopping for futility loses power, never validity: the lower bound holds at every n at
    once, so at whatever n a rule stops. What 'trend' costs in power and saves in pairs is
    measured on known distributions by ``studies.certified_share --sequential``."""
    if futility not in FUTILITY_RULES:
        raise ValueError(f"futility must be one of {FUTILITY_RULES}, got {futility!r}")
    values = np.asarray(differences, dtype=np.float64).ravel()
    if anytime_lower_bound(values, reward_width, alpha) > 0:
        return "certified"
    if values.size >= cap:
        return "cap"
    upper = anytime_upper_bound(values, reward_width, alpha)
    if upper <= 0 or not _certifiable_at(values, upper, reward_width, alpha, cap):
        return "futile"
    if futility == "trend" and values.size >= TREND_FROM:
        spread = values.std(ddof=1) / math.sqrt(values.size)
        trend = values.mean() + TREND_STANDARD_ERRORS * spread
        if not _certifiable_at(values, trend, reward_width, alpha, cap):
            return "futile"
    return None


def _certifiable_at(
    values: np.ndarray, mean: float, reward_width: float, alpha: float, cap: int
) -> bool:
    """Whether ``values`` repeated up to ``cap`` pairs and shifted to ``mean`` (kept inside
    [-w, w]) would clear 0 by the anytime bound."""
    projected = np.clip(
        np.resize(values, cap) + (mean - values.mean()), -reward_width, reward_width
    )
    return anytime_lower_bound(projected, reward_width, alpha) > 0


def sequential_measure(
    first: PairedDifferences,
    draw: Callable[[int], PairedDifferences | None],
    level: float,
    batch: int,
    cap: int,
    futility: str = "trend",
) -> MeasuredCertificate:
    """The measured certificate of one update from pairs drawn in batches: ``first``, then
    ``draw(count)`` fresh pairs (count <= ``batch``, never past ``cap`` in all) until
    ``sequential_stop``. The bound is the anytime one (``ANYTIME``) of every pair drawn, valid
    at the data-dependent n; each batch must be independent of the update and of the batches
    before (pairs i.i.d. given the update)."""
    if batch < 1 or cap < 1:
        raise ValueError(f"batch and cap must be >= 1, got {batch} and {cap}")
    alpha = 1.0 - level
    width = first.reward_width
    values = first.differences
    while (stop := sequential_stop(values, width, alpha, cap, futility)) is None:
        more = draw(min(batch, cap - values.size))
        if more is None or more.differences.size == 0:
            raise ValueError("sequential draws: the sampler drew no pairs")
        if more.reward_width != width:
            raise ValueError(f"a batch's reward_width {more.reward_width} is not {width}")
        values = np.concatenate((values, more.differences))
    certificate = measure(PairedDifferences(values, width, first.updated_agent), level, ANYTIME)
    return replace(certificate, stop=stop)


def stage_measured(
    updates: Sequence[MeasuredCertificate | None],
    kept: Sequence[bool],
    level: float = DEFAULT_LEVEL,
    method: str = DEFAULT_BOUND,
) -> MeasuredCertificate | None:
    """The stage's bound on J(pi_bar) - J(pi_cur): every update of the order bounded at level
    alpha/m (m = len(updates), fixed before the data), the kept ones summed (Thm 3.6's
    telescoping; an update not kept gains exactly 0). None when a kept update was not
    measured."""
    if len(updates) != len(kept):
        raise ValueError("one measured certificate (or None) and one kept flag per update")
    if any(keep and update is None for update, keep in zip(updates, kept, strict=True)):
        return None
    alpha = (1.0 - level) / max(len(updates), 1)
    counted = [u for u, keep in zip(updates, kept, strict=True) if keep and u is not None]
    widths = {u.reward_width for u in updates if u is not None}
    bound = 0.0
    for update in counted:
        assert update.differences is not None, "an update's certificate keeps its pairs"
        bound += lower_bound(update.differences, update.reward_width, alpha, method)
    return MeasuredCertificate(
        n=sum(u.n for u in counted),
        mean=float(sum(u.mean for u in counted)),
        bound=bound,
        level=level,
        method=method,
        reward_width=max(widths) if widths else 0.0,
    )
