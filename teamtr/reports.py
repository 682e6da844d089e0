"""Typed results of one agent update and of one stage (no integer status codes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from teamtr.measured import MeasuredCertificate


@dataclass(frozen=True, kw_only=True)
class AgentUpdate:
    """What an ``AgentUpdater`` returns for one agent (keyword arguments only: five of its
    fields are floats, and a positional slip between them would go unnoticed).

    All expectations are under the occupancy of the rollouts the update was given.
    """

    policy: Any
    """The new policy of the agent (backend-specific)."""
    surrogate: float
    """L_i: the surrogate gain in units of J (Thm 3.4; includes 1/(1-gamma) when discounted)."""
    kl: float
    """E_{s~d}[KL_i(s)], the trust-region statistic, in the direction the updater constrains."""
    advantage_bound: float
    """epsilon_i: bound on |E_{a~new} A(s,a)| over the agent's states (or the declared A_max)."""
    accepted: bool = True
    """False when the update could not be brought inside the radius (the old policy is kept)."""
    backtracks: int = 0
    """How many times the step was shrunk before acceptance or rejection."""
    tv: float | None = None
    """E_{s~d}[TV_i(s)] where the backend can compute it (tighter TV form of Thm 3.4)."""
    kl_quantile: float | None = None
    """A high quantile of the per-state (per-token) KL, where the backend monitors it."""
    extras: dict[str, float] = field(default_factory=dict)
    """Backend-specific diagnostics (losses, token counts, ...)."""


@dataclass(frozen=True)
class UpdateRecord:
    """One update inside a stage, as the stage loop records it."""

    position: int
    """i: the position in the stage's order sigma (0-based)."""
    agent: int
    """sigma(i): the agent that was updated."""
    radius: float
    """delta_i: its KL radius."""
    update: AgentUpdate
    """The updater's result."""
    kept: bool
    """Whether the new policy entered the team (accepted and inside the radius)."""
    penalty: float
    """The Thm 3.4 penalty charged to this update (0 when not kept)."""
    certificate: float
    """L_i - penalty when kept, else 0: the update's certified lower bound on its gain."""
    j_before: float | None = None
    """J of the team before this update, where the backend can evaluate J exactly."""
    j_after: float | None = None
    """J of the team after this update, likewise."""
    base: Any = field(default=None, compare=False, repr=False)
    """pi_hat^{i-1}: the team the update started from (the stage-start team for joint)."""
    rollouts: Any = field(default=None, compare=False, repr=False)
    """The rollouts the updater was given: their occupancy is the one the update was trained
    under (``rollouts.behaviour``'s, or, for happo, the reweighted-for team's)."""
    fresh_rollouts: bool = False
    """Whether the sampler produced ``rollouts`` for this update (the stage-start cache counts
    for the first update); False when they were reused or reweighted. Summing the sampling cost
    of the records with ``fresh_rollouts`` counts every sampler call of the stage once."""
    measured: MeasuredCertificate | None = None
    """The measured certificate (``teamtr.measured``): a lower bound on J(pi_hat^i) -
    J(pi_hat^{i-1}) from held-out pairs at ``measured.level``; None where not measured (an
    update not kept, a sampler that does not pair, a scheme without a resample)."""
    undone: bool = False
    """The update was inside its radius but its measured bound was below 0 under
    ``accept = "measured"``: it did not enter the team (``kept`` is False)."""
    resample: Any = field(default=None, compare=False, repr=False)
    """The draw that continued this update's held-out pairs (None where not measured, and for
    the stage's last update, measured by ``PairingSampler.continue_held_out`` alone)."""

    @property
    def realised_gain(self) -> float | None:
        """J(pi_hat^i) - J(pi_hat^{i-1}) where J is available."""
        if self.j_before is None or self.j_after is None:
            return None
        return self.j_after - self.j_before


@dataclass(frozen=True)
class StageReport:
    """One stage: one record per update plus the stage-level bound (Thm 3.6)."""

    scheme: str
    order: tuple[int, ...]
    records: tuple[UpdateRecord, ...]
    certificate: float
    """Sum of the kept updates' certificates: the Thm 3.6 lower bound on J(pi_bar) - J(pi_cur)."""
    j_start: float | None = None
    j_end: float | None = None
    teams: tuple[Any, ...] = ()
    """pi_hat^0 .. pi_hat^n when the caller asked to keep them (for drift measurements)."""
    measured: MeasuredCertificate | None = None
    """The measured bound on J(pi_bar) - J(pi_cur): each update's at level alpha/m, summed
    over the kept ones (``teamtr.measured.stage_measured``); None where a kept update was not
    measured."""

    @property
    def sampled_rollouts(self) -> tuple[Any, ...]:
        """Every batch of rollouts the sampler produced this stage, in order (one per sampler
        call: the stage-start cache of stale/joint/happo, each fresh batch of teamtr, and the
        resample an undone update discarded; the held-out continuation that measures the
        stage's last update draws no rollouts)."""
        batches: list[Any] = []
        for record in self.records:
            if record.fresh_rollouts:
                batches.append(record.rollouts)
            if record.undone and record.resample is not None:
                batches.append(record.resample)
        return tuple(batches)

    @property
    def realised_gain(self) -> float | None:
        if self.j_start is None or self.j_end is None:
            return None
        return self.j_end - self.j_start
