"""What one stage did to the occupancy and to the surrogate, measured exactly (THEORY.md §2).

``run_recorded_stage`` runs ``teamtr.run_stage`` and reads, from every update's record, the team
the update started from (the true pi_hat^{i-1}) and the behaviour team of the rollouts it was
given (whose occupancy it was trained under). ``measure_stage`` turns that into the quantities
of Theorems 3.4, 3.6 and 3.7.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

import sim
from teamtr import StageConfig, StageReport, run_stage
from teamtr.bounds import (
    intermediate_penalty_sum,
    kl_penalty_coefficient,
    stale_penalty_sum,
    theorem_3_7_drift_bound,
)
from teamtr.evaluations import PerTeamCache
from teamtr.protocols import AgentUpdater, Sampler, TeamPolicy
from teamtr.reports import UpdateRecord

FloatArray = NDArray[np.float64]


class ExactEvaluations(PerTeamCache[Any]):
    """Exact ``sim.evaluate`` of teams, once per team object (teams are immutable values)."""

    def __init__(self, mdp: sim.TurnTakingMDP) -> None:
        self.mdp = mdp
        super().__init__(lambda team: sim.evaluate(mdp, team.table))

    def occupancy(self, team: Any) -> FloatArray:
        """d_pi, the normalised discounted occupancy (sums to 1)."""
        return np.asarray(self(team).d, dtype=np.float64)

    def value(self, team: Any) -> float:
        """J(pi)."""
        return float(self(team).J)


def trained_under(record: UpdateRecord) -> TeamPolicy:
    """The team whose occupancy an update was trained under: its rollouts' behaviour team, or,
    for HAPPO-weighted rollouts, the team they were importance-weighted for."""
    reweighted_for = getattr(record.rollouts, "reweighted_for", None)
    return reweighted_for if reweighted_for is not None else record.rollouts.behaviour


@dataclass(frozen=True)
class StageTrace:
    """A stage's report plus what every update was trained under and applied to."""

    report: StageReport
    end_team: TeamPolicy
    starts: tuple[TeamPolicy, ...]
    behaviours: tuple[TeamPolicy, ...]


def run_recorded_stage(
    mdp: sim.TurnTakingMDP,
    team: TeamPolicy,
    config: StageConfig,
    evaluations: ExactEvaluations,
    sampler: Sampler | None = None,
    updater: AgentUpdater | None = None,
    stage_index: int = 0,
) -> StageTrace:
    """One stage of ``config.scheme``; exact sampler and updater unless others are given."""
    report, end_team = run_stage(
        team,
        sampler if sampler is not None else sim.ExactSampler(mdp),
        updater if updater is not None else sim.ExactUpdater(mdp),
        config,
        mdp.penalty_model(),
        evaluator=evaluations.value,
        keep_teams=True,
        stage_index=stage_index,
    )
    return StageTrace(
        report,
        end_team,
        tuple(record.base for record in report.records),
        tuple(trained_under(record) for record in report.records),
    )


@dataclass(frozen=True)
class StageMeasurement:
    """Exact per-stage quantities; sums run over the updates i = 1..n of the stage's order."""

    train_true_mismatch: float
    """sum_i ||d_train(i) - d_{pi_hat^{i-1}}||_1: occupancy trained under vs true at that moment."""
    step_shift: float
    """sum_i ||d_{pi_hat^i} - d_{pi_hat^{i-1}}||_1: the shift each update causes."""
    net_shift: float
    """||d_{pi_bar} - d_{pi_cur}||_1: the stage's total occupancy change."""
    surrogate_error: float
    """sum_i |L_i - (J(pi_hat^i) - J(pi_hat^{i-1}))| over the kept updates."""
    surrogate_error_signed: float
    """sum_i (L_i - (J(pi_hat^i) - J(pi_hat^{i-1}))): the aggregate (signed) error."""
    certified_penalty: float
    """Thm 3.7 sum_i C_i sum_{k<=i} sqrt(delta_k) (stale) or Thm 3.6 sum_i C_i sqrt(delta_i)."""
    drift_bound: float
    """The bound on the drift: Thm 3.7 summed over i (stale), the one-update shift bound (teamtr)."""
    realised_gain: float
    """J(pi_bar) - J(pi_cur)."""
    certificate: float
    """sum_i L_i - certified_penalty."""
    kept_updates: int
    per_update_mismatch: tuple[float, ...]
    per_update_shift: tuple[float, ...]
    per_update_error: tuple[float, ...]

    @property
    def coherence(self) -> float:
        """net_shift / step_shift: 1 when every update moves d the same way, ~1/sqrt(n) if random."""
        return self.net_shift / self.step_shift if self.step_shift > 0 else float("nan")


def l1(p: FloatArray, q: FloatArray) -> float:
    return float(np.abs(p - q).sum())


def measure_stage(
    mdp: sim.TurnTakingMDP, trace: StageTrace, evaluations: ExactEvaluations
) -> StageMeasurement:
    """Measure a sequential stage (stale, teamtr or happo) exactly; see ``StageMeasurement``."""
    report = trace.report
    if report.scheme == "joint":
        raise ValueError("measure_stage covers sequential schemes; joint has no intermediate teams")
    occupancy = evaluations.occupancy
    stale_like = report.scheme != "teamtr"
    # pi_hat^0 .. pi_hat^n: the starting team of every update, then pi_bar.
    teams = [*trace.starts, trace.end_team]
    mismatch = [
        l1(occupancy(b), occupancy(s)) for b, s in zip(trace.behaviours, trace.starts, strict=True)
    ]
    shift = [l1(occupancy(teams[i + 1]), occupancy(teams[i])) for i in range(len(trace.starts))]
    kept = [r for r in report.records if r.kept]
    errors = []
    for record in kept:
        gain = record.realised_gain
        if gain is None:
            raise ValueError(
                "measure_stage needs J of every team (run the stage with an evaluator)"
            )
        errors.append(record.update.surrogate - gain)
    penalty_model = mdp.penalty_model()
    coefficients = [kl_penalty_coefficient(r.update.advantage_bound, penalty_model) for r in kept]
    radii = [r.radius for r in kept]
    gamma = float(mdp.gamma)
    if stale_like:
        # Thm 3.7: update i is charged for its own divergence and every earlier update's drift.
        penalty = stale_penalty_sum(coefficients, radii) if kept else 0.0
        bound = sum(theorem_3_7_drift_bound(gamma, radii[:i]) for i in range(len(radii)))
    else:
        # Thm 3.6: each update is charged only for its own divergence; the shift it causes to the
        # next update's occupancy is bounded by 2 gamma/(1-gamma) sqrt(delta_i/2).
        penalty = intermediate_penalty_sum(coefficients, radii) if kept else 0.0
        bound = sum(theorem_3_7_drift_bound(gamma, [r]) for r in radii)
    j_start = evaluations.value(teams[0])
    j_end = evaluations.value(teams[-1])
    return StageMeasurement(
        train_true_mismatch=float(sum(mismatch)),
        step_shift=float(sum(shift)),
        net_shift=l1(occupancy(teams[-1]), occupancy(teams[0])),
        surrogate_error=float(sum(abs(e) for e in errors)),
        surrogate_error_signed=float(sum(errors)),
        certified_penalty=float(penalty),
        drift_bound=float(bound),
        realised_gain=j_end - j_start,
        certificate=float(sum(r.update.surrogate for r in kept) - penalty),
        kept_updates=len(kept),
        per_update_mismatch=tuple(mismatch),
        per_update_shift=tuple(shift),
        per_update_error=tuple(errors),
    )
