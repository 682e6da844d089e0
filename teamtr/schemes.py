"""Where each scheme's rollouts come from (THEORY.md §2, Thm 3.4 versus Thm 3.7).

The schemes differ only in the rollouts an update is trained on and in whether updates enter
the team one by one or all at once; everything else is the shared stage loop. Each is one row
of ``SCHEMES``: a new scheme is one more row (and its name in ``teamtr.config.SchemeName``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

from teamtr.protocols import Rollouts, Sampler, TeamPolicy

RolloutKind = Literal["intermediate", "stage_start", "reweighted"]


@dataclass(frozen=True)
class Scheme:
    """What makes a scheme: where its updates' rollouts come from, and when updates enter."""

    name: str
    rollouts: RolloutKind
    """"intermediate": fresh samples of pi_hat^{i-1} before every update (Thm 3.4);
    "stage_start": the cache sampled under pi_cur, whatever has changed since (Thm 3.7);
    "reweighted": that cache, weighted by the earlier agents' message ratios (HAPPO)."""
    simultaneous: bool = False
    """Every agent is updated against the stage-start team and swapped in at once."""


SCHEMES: dict[str, Scheme] = {
    scheme.name: scheme
    for scheme in (
        Scheme("teamtr", "intermediate"),
        Scheme("stale", "stage_start"),
        Scheme("joint", "stage_start", simultaneous=True),
        Scheme("happo", "reweighted"),
    )
}


class Supplied(NamedTuple):
    """The rollouts for one update, and whether the sampler produced them for it."""

    rollouts: Rollouts
    fresh: bool
    """True when sampled for this update (or, for the first update, the stage-start cache);
    False when reused from an earlier update or reweighted (happo)."""


@dataclass
class RolloutSource:
    """Supplies the rollouts for each update of one stage."""

    scheme: str
    sampler: Sampler
    stage_start: Rollouts | None = None
    """The cache sampled under pi_cur (stale, joint, happo)."""
    latest: Rollouts | None = None
    """The most recent rollouts handed out (fresh ones for teamtr, reweighted ones for happo)."""
    handed_out: bool = False
    """Whether any rollouts were handed out yet this stage (the stage-start cache counts once)."""
    pending: Supplied | None = None
    """Rollouts already drawn for the next update (by ``resample`` or ``redraw``)."""

    @property
    def kind(self) -> RolloutKind:
        return SCHEMES[self.scheme].rollouts

    @property
    def simultaneous(self) -> bool:
        return SCHEMES[self.scheme].simultaneous

    def start(self, team: TeamPolicy) -> None:
        if self.kind != "intermediate":
            self.stage_start = self.sampler.sample(team)

    def resample(self, team: TeamPolicy, updated_agent: int) -> Rollouts:
        """Draw pi_hat^i now, continuing the latest rollouts from ``updated_agent``'s first
        turn (teamtr): the draw that measures the update and serves the next one."""
        self.latest = self.sampler.sample(team, previous=self.latest, updated_agent=updated_agent)
        self.pending = Supplied(self.latest, True)
        return self.latest

    def redraw(self, team: TeamPolicy) -> Rollouts:
        """Draw ``team`` afresh, continuing nothing (after an undone update)."""
        self.latest = self.sampler.sample(team)
        self.pending = Supplied(self.latest, True)
        return self.latest

    def for_update(self, team: TeamPolicy, last_updated: int | None) -> Supplied:
        """Rollouts for the next update, given the current intermediate team pi_hat^{i-1}."""
        first = not self.handed_out
        self.handed_out = True
        if self.pending is not None:
            supplied, self.pending = self.pending, None
            return supplied
        if self.kind == "intermediate":
            return self._intermediate(team, last_updated)
        assert self.stage_start is not None, "start() must be called before for_update()"
        if self.kind == "reweighted":
            return self._reweighted(team, last_updated, first)
        return Supplied(self.stage_start, first)

    def _intermediate(self, team: TeamPolicy, last_updated: int | None) -> Supplied:
        """Intermediate occupancy (Thm 3.4): fresh samples of pi_hat^{i-1}. If the previous
        update was not kept the team is unchanged and its rollouts are still on-policy."""
        if self.latest is None or last_updated is not None:
            self.latest = self.sampler.sample(
                team, previous=self.latest, updated_agent=last_updated
            )
            return Supplied(self.latest, True)
        return Supplied(self.latest, False)

    def _reweighted(self, team: TeamPolicy, last_updated: int | None, first: bool) -> Supplied:
        """The cache of pi_cur reweighted by the earlier agents' ratios stands for
        pi_hat^{i-1}; the advantages stay those of pi_cur. Reweighted only when the team has
        changed."""
        assert self.stage_start is not None
        if last_updated is not None:
            self.latest = self.sampler.importance_weighted(self.stage_start, team)
        if self.latest is not None:
            return Supplied(self.latest, False)
        return Supplied(self.stage_start, first)
