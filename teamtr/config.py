"""Frozen configuration of the stage loop; bad values are rejected with the field and the range."""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral
from typing import Literal, get_args

SchemeName = Literal["teamtr", "stale", "joint", "happo"]
SCHEMES: tuple[str, ...] = get_args(SchemeName)
OrderSpec = Literal["fixed", "random"] | tuple[int, ...]
PenaltyForm = Literal["kl", "tv"]


@dataclass(frozen=True)
class StageConfig:
    """How one stage updates the team (THEORY.md §1–2)."""

    scheme: SchemeName = "teamtr"
    """teamtr: resample under the intermediate team before every update (Thm 3.4/3.6);
    stale: every agent trained on the stage-start cache (Thm 3.7's naive baseline);
    joint: all agents against the stage-start team, swapped in at once;
    happo: stage-start cache reweighted by the earlier agents' probability ratios."""
    radius: float | tuple[float, ...] = 0.01
    """delta_i, the per-agent KL radius of Thm 3.4: one value for all agents or one per agent."""
    order: OrderSpec = "fixed"
    """sigma: 'fixed' (0..n-1), 'random' (a fresh permutation per stage), or a tuple of distinct
    agents (a permutation, or a subset: ``(k,)`` updates agent k alone)."""
    seed: int = 0
    """Seed of the random order (stage s uses the stream (seed, s))."""
    kl_tolerance: float = 1e-6
    """Relative slack when checking KL_i <= delta_i; an update above it is never kept."""
    penalty_form: PenaltyForm = "kl"
    """Which form of Thm 3.4 the certificate uses: 'kl' (C_i sqrt(KL_i)) or 'tv' (needs E[TV])."""

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {SCHEMES}, got {self.scheme!r}")
        radii = self.radius if isinstance(self.radius, tuple) else (self.radius,)
        if not radii:
            raise ValueError("radius must be a positive float or a non-empty tuple of them")
        for r in radii:
            if isinstance(r, bool) or not isinstance(r, int | float) or not math.isfinite(r):
                raise ValueError(f"radius must be finite positive numbers, got {self.radius!r}")
            if r <= 0:
                raise ValueError(f"radius must be > 0 (delta_i of Thm 3.4), got {self.radius!r}")
        if isinstance(self.order, tuple):
            valid = all(
                isinstance(k, Integral) and not isinstance(k, bool) and k >= 0 for k in self.order
            )
            if not self.order or not valid or len(set(self.order)) != len(self.order):
                raise ValueError(
                    "order must be 'fixed', 'random' or a non-empty tuple of distinct agent "
                    f"indices, got {self.order!r}"
                )
        elif self.order not in ("fixed", "random"):
            raise ValueError(f"order must be 'fixed', 'random' or a tuple, got {self.order!r}")
        if not (0.0 <= self.kl_tolerance < 1.0):
            raise ValueError(f"kl_tolerance must lie in [0, 1), got {self.kl_tolerance!r}")
        if self.penalty_form not in ("kl", "tv"):
            raise ValueError(f"penalty_form must be 'kl' or 'tv', got {self.penalty_form!r}")

    def radius_of(self, agent: int, n_agents: int) -> float:
        """delta_i for agent ``agent`` of a team of ``n_agents``."""
        if isinstance(self.radius, tuple):
            if len(self.radius) != n_agents:
                raise ValueError(
                    f"radius has {len(self.radius)} entries but the team has {n_agents} agents"
                )
            return float(self.radius[agent])
        return float(self.radius)
