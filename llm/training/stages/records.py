"""What a run records per stage, typed: the line of ``metrics.jsonl``, where a run stands, and
the TensorBoard scalars and "finished" event made from them.

``StageMetrics.as_json`` writes the keys of ``metrics.jsonl`` in their order (readers, and the
tests that compare runs line by line, rely on both); everything else reads attributes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llm.sampling.rollouts import DialogueRollouts
from llm.update.outcome import lora_update
from teamtr.reports import StageReport, UpdateRecord


@dataclass(frozen=True)
class UpdateMetrics:
    """One agent update of a stage, as logged."""

    agent: int
    kept: bool
    accepted: bool
    surrogate: float
    kl: float
    kl_quantile: float | None
    backtracks: int
    non_finite: str | None
    """The first non-finite quantity the update met (``LoraUpdate.non_finite``), if any."""
    penalty: float
    certificate: float
    effective_sample_size: float
    """Of the batch's episode weights (``LoraUpdate.effective_sample_size``): 1 on-policy,
    below 1 for HAPPO's reweighted batches."""
    mismatch: dict[str, float] | None
    """The sampler's recorded log-probs against the trainer's pre-update pass, per message
    token (``llm.update.mismatch.PolicyMismatch``: tokens, max_gap, mean_gap, over_tolerance,
    kl, truncated); None where the sampler recorded none."""
    measured: dict[str, float | int | str] | None = None
    """The measured certificate (``teamtr.measured.MeasuredCertificate.as_dict``: n pairs,
    their mean, the bound, its level); None where not measured."""
    undone: bool = False
    """Inside its radius but undone by ``[stage] accept = "measured"``."""
    drawn_by: str | None = None
    """What drew the batch the update trained on and whose log-probs the mismatch record
    compares (``Engine.drawn_by``: engine, precision, LoRA sum); None for rollouts of another
    backend."""

    @classmethod
    def of(cls, record: UpdateRecord) -> UpdateMetrics:
        update = lora_update(record.update)
        return cls(
            agent=record.agent,
            kept=record.kept,
            accepted=update.accepted,
            surrogate=update.surrogate,
            kl=update.kl,
            kl_quantile=update.kl_quantile,
            backtracks=update.backtracks,
            non_finite=update.non_finite,
            penalty=record.penalty,
            certificate=record.certificate,
            effective_sample_size=update.effective_sample_size,
            mismatch=None if update.mismatch is None else update.mismatch.as_dict(),
            measured=None if record.measured is None else record.measured.as_dict(),
            undone=record.undone,
            drawn_by=getattr(record.rollouts, "drawn_by", None) or None,
        )


@dataclass(frozen=True)
class StageMetrics:
    """One line of ``metrics.jsonl``."""

    stage: int
    scheme: str
    order: list[int]
    certificate: float
    train_reward: float | None
    train_parse_failure_rate: float | None
    rollout_rewards: list[float]
    """TeamTR samples again after every update: the intermediate teams' rewards, in order."""
    generated_tokens: int
    reused_turns: int
    groups_drawn: int
    """Groups played (dynamic sampling's discarded ones included)."""
    groups_with_signal: int
    """Of those, the groups with differing rewards."""
    batch_signal_groups: list[int]
    """Per batch handed to the updater: its groups with differing rewards."""
    sampling_seconds: float
    wall_seconds: float
    cpu_seconds: float
    """This process's CPU time for the stage (sampling and updates; the held-out evaluation
    after it is not counted): the x axis of a learning curve against training compute."""
    updates: list[UpdateMetrics]
    measured: dict[str, float | int | str] | None = None
    """The stage's measured bound on its improvement (its updates' at alpha/m, summed); None
    where a kept update was not measured."""
    held_out_tokens: int = 0
    """Tokens generated for the held-out groups, their continuations and any pairs drawn on
    (``[stage] certificate_batch``): the measured certificate's cost."""
    eval: dict[str, float] | None = None
    """The held-out evaluation after the stage, where one ran."""
    environment_texts: int = 0
    """Texts an environment added to the stage's drawn dialogues (0 without one), apart from
    the agents' messages."""
    ended_by_environment: int = 0
    """Drawn dialogues the environment ended before the turn cap."""

    @classmethod
    def of(
        cls, stage: int, report: StageReport, seconds: float, cpu_seconds: float
    ) -> StageMetrics:
        calls: tuple[DialogueRollouts, ...] = report.sampled_rollouts
        first = calls[0] if calls else None
        return cls(
            stage=stage,
            scheme=report.scheme,
            order=list(report.order),
            certificate=report.certificate,
            train_reward=first.mean_reward if first else None,
            train_parse_failure_rate=first.parse_failure_rate if first else None,
            rollout_rewards=[c.mean_reward for c in calls],
            generated_tokens=sum(c.generated_tokens for c in calls),
            reused_turns=sum(c.reused_turns for c in calls),
            groups_drawn=sum(c.groups_drawn for c in calls),
            groups_with_signal=sum(c.groups_with_signal for c in calls),
            batch_signal_groups=[c.held_signal_groups for c in calls],
            sampling_seconds=sum(c.wall_seconds for c in calls),
            wall_seconds=seconds,
            cpu_seconds=cpu_seconds,
            updates=[UpdateMetrics.of(r) for r in report.records],
            measured=None if report.measured is None else report.measured.as_dict(),
            held_out_tokens=sum(c.held_out.generated_tokens for c in calls if c.held_out),
            environment_texts=sum(
                len(turn.replies) for c in calls for e in c.episodes for turn in e.turns
            ),
            ended_by_environment=sum(e.ended for c in calls for e in c.episodes),
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StageMetrics:
        """A ``metrics.jsonl`` record read back (``as_json``'s inverse)."""
        updates = [UpdateMetrics(**update) for update in data["updates"]]
        return cls(**{**data, "updates": updates})

    def as_json(self) -> dict[str, Any]:
        """The ``metrics.jsonl`` record: every field in order, ``eval`` only where one ran."""
        data = dataclasses.asdict(self)
        if self.eval is None:
            del data["eval"]
        return data


@dataclass
class RunPosition:
    """Where a run stands: the (0-based) stage in progress and the updates done in it."""

    stage: int
    updates_done: int = 0

    def fields(self) -> dict[str, int]:
        """As the fields of an "interrupted" or "failed" event."""
        return {"stage": self.stage, "updates_done": self.updates_done}


SCALARS = (
    "certificate",
    "train_reward",
    "train_parse_failure_rate",
    "generated_tokens",
    "groups_drawn",
    "groups_with_signal",
    "wall_seconds",
)
"""The stage metrics drawn in TensorBoard (``stage/<name>``)."""


def log_scalars(writer: Any, metrics: StageMetrics) -> None:
    """A stage's metrics as TensorBoard scalars: the stage's, each update's, the evaluation's,
    at step k for the k-th stage (``metrics.stage`` + 1): the number the console prints and
    its checkpoint ``stage_k`` carries (docs/runs.md, "Stage numbers")."""
    step = metrics.stage + 1
    for name in SCALARS:
        value = getattr(metrics, name)
        if value is not None:
            writer.add_scalar(f"stage/{name}", value, step)
    for update in metrics.updates:
        for name in ("surrogate", "kl", "backtracks"):
            writer.add_scalar(f"agent{update.agent}/{name}", getattr(update, name), step)
        for name, value in (update.mismatch or {}).items():
            if name != "tokens":
                writer.add_scalar(f"agent{update.agent}/mismatch_{name}", value, step)
    for name, value in (metrics.eval or {}).items():
        writer.add_scalar(f"eval/{name}", value, step)


def final_summary(
    stages: int, metrics: StageMetrics | None, checkpoint: Path | None
) -> dict[str, Any]:
    """The fields of a "finished" event: stages done, the last stage's metrics (and its
    evaluation), the checkpoint to evaluate or resume from."""
    last: dict[str, Any] = {}
    if metrics is not None:
        last = {
            "certificate": metrics.certificate,
            "train_reward": metrics.train_reward,
            "train_parse_failure_rate": metrics.train_parse_failure_rate,
        }
        if metrics.eval is not None:
            last["eval"] = metrics.eval
    return {
        "stages": stages,
        "metrics": last,
        "checkpoint": str(checkpoint) if checkpoint is not None else None,
    }
