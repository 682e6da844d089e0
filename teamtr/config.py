"""Frozen configuration of the stage loop; bad values are rejected with the field and the range."""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral
from typing import Literal, get_args

from teamtr.measured import BOUNDS, DEFAULT_BOUND, DEFAULT_LEVEL, FUTILITY_RULES, BoundName
from teamtr.trust_region import ADMIT_TOLERANCE, checked_radius, per_agent_radii

SchemeName = Literal["teamtr", "stale", "joint", "happo"]
SCHEMES: tuple[str, ...] = get_args(SchemeName)
OrderSpec = Literal["fixed", "random"] | tuple[int, ...]
PenaltyForm = Literal["kl", "tv"]
AcceptRule = Literal["theory", "measured"]
ACCEPT_RULES: tuple[str, ...] = get_args(AcceptRule)


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
    certificate_groups: int = 0
    """Groups (episodes, or dialogue groups) each draw holds out of the update, continued by
    the next draw to measure the update's improvement (``teamtr.measured``); 0 measures
    nothing. Only a sampler that pairs (``teamtr.protocols.PairingSampler``) and the teamtr
    scheme, whose resample continues them, measure; elsewhere records say "not measured"."""
    certificate_level: float = DEFAULT_LEVEL
    """1 - alpha of the measured certificate, in (0, 1); a stage splits alpha over its updates."""
    certificate_bound: BoundName = DEFAULT_BOUND
    """The finite-n lower bound (``teamtr.measured``): 'hedged' (Waudby-Smith & Ramdas 2024,
    the hedged capital process, one side), 'betting' (their Thm 2, one side) or 'bernstein'
    (Maurer & Pontil 2009, Thm 4)."""
    certificate_batch: int = 0
    """Sequential held-out draws: 0 measures each update on its draw's certificate_groups
    pairs alone (the fixed-n bound). > 0: those pairs first, then fresh held-out pairs this many
    at a time until the anytime bound clears 0, the anytime upper bound says it cannot within
    certificate_cap, or certificate_cap pairs are drawn (``teamtr.measured.sequential_measure``;
    the bound is then the anytime one, whatever certificate_bound). Needs a sampler that draws
    fresh pairs (``teamtr.protocols.SequentialPairingSampler``)."""
    certificate_cap: int = 512
    """The most pairs one update's sequential draws use, certificate_groups included (read only
    with certificate_batch > 0)."""
    certificate_futility: str = "trend"
    """When sequential draws give up before certificate_cap (``teamtr.measured.sequential_stop``):
    'trend', once the pairs on their current trend (their mean plus one standard error, from 32
    pairs on) would not be certified within the cap, or 'upper_bound', only once not even the
    anytime upper bound's mean would be. Either way the bound stays valid; 'trend' draws fewer
    pairs on updates that gain little, for a little power on those that gain."""
    accept: AcceptRule = "theory"
    """'theory': an update inside its radius enters the team (Thm 3.4's rule). 'measured': in
    addition, an update whose measured bound is below 0 is undone: the team goes back to
    pi_hat^{i-1}, the resample of pi_hat^i is discarded and pi_hat^{i-1} is drawn afresh.
    Needs the teamtr scheme and certificate_groups > 0."""

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
        self._check_certificate()

    def _check_certificate(self) -> None:
        groups = self.certificate_groups
        if not isinstance(groups, Integral) or isinstance(groups, bool) or groups < 0:
            raise SettingError("certificate_groups", f"must be an integer >= 0, got {groups!r}")
        level = self.certificate_level
        if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
            raise SettingError("certificate_level", f"must lie in (0, 1), got {level!r}")
        if self.certificate_bound not in BOUNDS:
            raise SettingError(
                "certificate_bound", f"must be one of {BOUNDS}, got {self.certificate_bound!r}"
            )
        for key in ("certificate_batch", "certificate_cap"):
            value = getattr(self, key)
            if not isinstance(value, Integral) or isinstance(value, bool) or value < 0:
                raise SettingError(key, f"must be an integer >= 0, got {value!r}")
        if self.certificate_futility not in FUTILITY_RULES:
            raise SettingError(
                "certificate_futility",
                f"must be one of {FUTILITY_RULES}, got {self.certificate_futility!r}",
            )
        if self.certificate_batch and not groups:
            raise SettingError(
                "certificate_batch",
                "draws on after the held-out groups: it needs certificate_groups > 0, "
                f"got {self.certificate_batch} with 0 groups",
            )
        if self.certificate_batch and self.certificate_cap < groups:
            raise SettingError(
                "certificate_cap",
                f"must be >= certificate_groups ({groups}) with certificate_batch > 0, "
                f"got {self.certificate_cap}",
            )
        if self.accept not in ACCEPT_RULES:
            raise SettingError("accept", f"must be one of {ACCEPT_RULES}, got {self.accept!r}")
        if self.accept == "measured" and (self.scheme != "teamtr" or groups == 0):
            raise SettingError(
                "accept",
                "'measured' needs scheme 'teamtr' (its resample continues the held-out groups) "
                f"and certificate_groups > 0, got scheme {self.scheme!r} and {groups} groups",
            )

    def radii(self, n_agents: int) -> tuple[float, ...]:
        """delta_i of every agent of a team of ``n_agents`` (a per-agent tuple must have one
        entry per agent: the one part of the radius a config cannot check before the team)."""
        return per_agent_radii(self.radius, n_agents)

    def radius_of(self, agent: int, n_agents: int) -> float:
        """delta_i for agent ``agent`` of a team of ``n_agents``."""
        return self.radii(n_agents)[agent]
