"""Shared helpers of the tabular experiments: exact TeamTR training checked against its bounds.

``check_certified_improvement`` is Thm 3.4/3.6 with exact inputs (every kept update gains at
least its certificate); ``Trainer`` runs exact stages on one MDP and applies that check to every
stage, whether it updates the whole team or, with ``order=(k,)``, agent k alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sim
from teamtr import StageConfig, StageReport, run_stages
from teamtr.config import OrderSpec

IMPROVEMENT_TOLERANCE = 1e-9
"""Relative slack (times max(1, |J|)) for the exact no-regression check (floating point only)."""


class CertifiedImprovementViolation(AssertionError):
    """An exact teamtr update gained less than its Thm 3.4 certificate (a bug, never tolerated)."""


def check_certified_improvement(report: StageReport, where: str) -> None:
    """Thm 3.4/3.6 with exact inputs: gain_i >= certificate_i per kept update; so a stage with a
    positive certificate has J_end >= J_start. Raises ``CertifiedImprovementViolation`` if not."""
    for record in report.records:
        gain = record.realised_gain
        if not record.kept or gain is None:
            continue
        slack = IMPROVEMENT_TOLERANCE * max(1.0, abs(record.j_before or 0.0))
        if gain < record.certificate - slack:
            raise CertifiedImprovementViolation(
                f"{where}: update of agent {record.agent} gained {gain:.6g} < certificate "
                f"{record.certificate:.6g}"
            )
    stage_gain = report.realised_gain
    if stage_gain is not None and report.certificate > 0:
        slack = IMPROVEMENT_TOLERANCE * max(1.0, abs(report.j_start or 0.0))
        if stage_gain < -slack:
            raise CertifiedImprovementViolation(
                f"{where}: certificate {report.certificate:.6g} > 0 but J fell by {-stage_gain:.6g}"
            )


@dataclass
class Trainer:
    """Exact TeamTR stages on one MDP; every stage is checked against its certificate."""

    mdp: sim.TurnTakingMDP
    radius: float
    seed: int

    def value(self, team: Any) -> float:
        return float(sim.evaluate(self.mdp, team.table).J)

    def train(
        self, team: sim.TabularTeam, stages: int, label: str, order: OrderSpec = "fixed"
    ) -> tuple[Any, list[float]]:
        """``stages`` TeamTR stages from ``team``; return the final team and J before/after each.

        ``order=(k,)`` makes every stage one trust-region update of agent k, the others frozen.
        """
        config = StageConfig(scheme="teamtr", radius=self.radius, order=order, seed=self.seed)
        curve = [self.value(team)]
        for index, (report, trained) in enumerate(
            run_stages(
                team,
                sim.ExactSampler(self.mdp),
                sim.ExactUpdater(self.mdp),
                config,
                self.mdp.penalty_model(),
                stages,
                self.value,
            )
        ):
            check_certified_improvement(report, f"seed {self.seed}, {label}, stage {index}")
            assert report.j_end is not None
            curve.append(report.j_end)
            team = trained
        return team, curve
