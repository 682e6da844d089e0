"""Where each scheme's rollouts come from (THEORY.md §2, Thm 3.4 versus Thm 3.7).

The four schemes differ only in the rollouts an update is trained on and in whether updates
enter the team one by one or all at once; everything else is the shared stage loop.
"""

from __future__ import annotations

from dataclasses import dataclass

from teamtr.protocols import Rollouts, Sampler, TeamPolicy


@dataclass
class RolloutSource:
    """Supplies the rollouts for each update of one stage."""

    scheme: str
    sampler: Sampler
    stage_start: Rollouts | None = None
    """The cache sampled under pi_cur (stale, joint, happo)."""
    latest: Rollouts | None = None
    """The most recent rollouts handed out (fresh ones for teamtr, reweighted ones for happo)."""

    @property
    def simultaneous(self) -> bool:
        """joint: every agent is updated against the stage-start team and swapped in at once."""
        return self.scheme == "joint"

    def start(self, team: TeamPolicy) -> None:
        if self.scheme != "teamtr":
            self.stage_start = self.sampler.sample(team)

    def for_update(self, team: TeamPolicy, last_updated: int | None) -> Rollouts:
        """Rollouts for the next update, given the current intermediate team pi_hat^{i-1}."""
        if self.scheme == "teamtr":
            # Intermediate occupancy (Thm 3.4): fresh samples of pi_hat^{i-1}. If the previous
            # update was not kept the team is unchanged and its rollouts are still on-policy.
            if self.latest is None or last_updated is not None:
                self.latest = self.sampler.sample(
                    team, previous=self.latest, updated_agent=last_updated
                )
            return self.latest
        assert self.stage_start is not None, "start() must be called before for_update()"
        if self.scheme == "happo":
            # The cache of pi_cur reweighted by the earlier agents' ratios stands for pi_hat^{i-1};
            # the advantages stay those of pi_cur. Reweight only when the team has changed.
            if last_updated is not None:
                self.latest = self.sampler.importance_weighted(self.stage_start, team)
            return self.latest if self.latest is not None else self.stage_start
        # stale and joint: the stage-start cache, whatever has changed since (Thm 3.7).
        return self.stage_start
