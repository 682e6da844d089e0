"""Frozen configuration of the stage loop; bad values are rejected with the field and the range."""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral
from typing import Literal, get_args

from teamtr.trust_region import ADMIT_TOLERANCE, checked_radius, per_agent_radii

SchemeName = Literal["teamtr", "stale", "joint", "happo"]
SCHEMES: tuple[str, ...] = get_args(SchemeName)
OrderSpec = Literal["fixed", "random"] | tuple[int, ...]
PenaltyForm = Literal["kl", "tv"]


class SettingError(ValueError):
    """A setting's value breaks its rule. It carries the key it names (``key``; ``section``
    where the raiser knows it), so that a config loader can point at the key and its line
    without reading the message; ``str`` is "<key> <message>"."""

    def __init__(self, key: str, message: str, section: str = "") -> None:
        super().__init__(f"{key} {message}")
        self.key = key
        self.message = message
        self.section = section


DEFAULT_RADIUS = 0.01
"""The core's default delta_i (``StageConfig.radius``, ``teamtr.check_backend``); the
language-model config states its own (``llm.common.config.StageSettings``)."""


@dataclass(frozen=True)
class StageConfig:
    """How one stage updates the team (THEORY.md §1–2)."""

    scheme: SchemeName = "teamtr"
    """teamtr: resample under the intermediate team before every update (Thm 3.4/3.6);
    stale: every agent trained on the stage-start cache (Thm 3.7's naive baseline);
    joint: all agents against the stage-start team, swapped in at once;
    happo: stage-start cache reweighted by the earlier agents' probability ratios."""
    radius: float | tuple[float, ...] = DEFAULT_RADIUS
    """delta_i, the per-agent KL radius of Thm 3.4: one value for all agents, or a sequence of
    one per agent (held as a tuple of floats). Every value must be finite and > 0; this is
    where a radius is checked (``teamtr.trust_region.check_radius``), once, when the config is
    built. That a tuple has one entry per agent is checked against the team (``radii``)."""
    order: OrderSpec = "fixed"
    """sigma: 'fixed' (0..n-1), 'random' (a fresh permutation per stage), or a tuple of distinct
    agents (a permutation, or a subset: ``(k,)`` updates agent k alone)."""
    seed: int = 0
    """Seed of the random order (stage s uses the stream (seed, s))."""
    kl_tolerance: float = ADMIT_TOLERANCE
    """Relative slack when checking KL_i <= delta_i (``teamtr.trust_region.admitted``); an
    update above it is never kept."""
    penalty_form: PenaltyForm = "kl"
    """Which form of Thm 3.4 the certificate uses: 'kl' (C_i sqrt(KL_i)) or 'tv' (needs E[TV])."""

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise SettingError("scheme", f"must be one of {SCHEMES}, got {self.scheme!r}")
        # A float, or a tuple of floats, each finite and > 0: the one check of a radius.
        try:
            object.__setattr__(self, "radius", checked_radius(self.radius))
        except ValueError as error:
            raise SettingError("radius", str(error).removeprefix("radius ")) from None
        if isinstance(self.order, tuple):
            valid = all(
                isinstance(k, Integral) and not isinstance(k, bool) and k >= 0 for k in self.order
            )
            if not self.order or not valid or len(set(self.order)) != len(self.order):
                raise SettingError(
                    "order",
                    "must be 'fixed', 'random' or a non-empty tuple of distinct agent "
                    f"indices, got {self.order!r}",
                )
        elif self.order not in ("fixed", "random"):
            raise SettingError("order", f"must be 'fixed', 'random' or a tuple, got {self.order!r}")
        if not (0.0 <= self.kl_tolerance < 1.0):
            raise SettingError("kl_tolerance", f"must lie in [0, 1), got {self.kl_tolerance!r}")
        if self.penalty_form not in ("kl", "tv"):
            raise SettingError("penalty_form", f"must be 'kl' or 'tv', got {self.penalty_form!r}")

    def radii(self, n_agents: int) -> tuple[float, ...]:
        """delta_i of every agent of a team of ``n_agents`` (a per-agent tuple must have one
        entry per agent: the one part of the radius a config cannot check before the team)."""
        return per_agent_radii(self.radius, n_agents)

    def radius_of(self, agent: int, n_agents: int) -> float:
        """delta_i for agent ``agent`` of a team of ``n_agents``."""
        return self.radii(n_agents)[agent]
