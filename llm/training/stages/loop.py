"""The loop over a run's stages from a resume point (``run_stages``): one stage of the core
loop (``teamtr.stage.run_stage``) with its metrics and periodic evaluation, what a finished
stage keeps (its line of ``metrics.jsonl``, its scalars, the resume point after it, on disk every
``checkpoint_every`` stages), what each part of a stage says while it runs, and what is saved
when the run stops: a checkpoint and an event in the run directory (``llm.training.rundir``).
"""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from llm.common import profiling
from llm.common.progress import StageProgress
from llm.common.trackers import open_trackers
from llm.evaluation.held_out_problems import evaluate_team
from llm.models.agents import LoraTeam
from llm.training.builder import Components
from llm.training.checkpoint import (
    CHECKPOINTS,
    STAGE_PREFIX,
    ResumePoint,
    RunDirectoryError,
    stage_directories,
    write_atomically,
    write_checkpoint,
)
from llm.training.distributed import replicas_agree
from llm.training.rundir import (
    TrainingInterrupted,
    directory_identity,
    error_line,
    log_event,
    log_failure,
    record_failure,
    signals_deferred,
    sigterm_interrupts,
    writer_thread_errors_folded,
)
from llm.training.stages.console import (
    certificate_parts,
    environment_part,
    held_out_line,
    messages_cut,
    no_signal_warning,
)
from llm.training.stages.records import (
    RunPosition,
    StageMetrics,
    UpdateMetrics,
    final_summary,
    log_scalars,
)
from teamtr.penalty import EpisodicPenalty
from teamtr.reports import UpdateRecord
from teamtr.stage import run_stage, stage_order


def run_stages(parts: Components, run_dir: Path, start: ResumePoint, progress: bool) -> Path:
    """Stages ``start.stage`` onwards; ``start`` is the state to continue from."""
    return _Run(parts, run_dir, start).run(progress)


def prune_checkpoints(run_dir: Path, keep: int) -> list[str]:
    """Delete every checkpoint but the ``keep`` newest (0: keep all); returns their names.
    Called once a new checkpoint is complete on disk, so a crash mid-way leaves it intact."""
    if keep <= 0:
        return []
    old = stage_directories(run_dir)[:-keep]
    for directory in old:
        shutil.rmtree(directory, ignore_errors=True)
    return [directory.name for directory in old]


class _Run:
    """A run of stages from a resume point: the loop (``run``), one stage (``stage``), and
    what is saved when it stops. Only the process that writes the run (rank 0 of a
    data-parallel run) writes files; every rank runs the same stages."""

    def __init__(self, parts: Components, run_dir: Path, start: ResumePoint) -> None:
        self.parts = parts
        self.config = parts.config
        self.run_dir = run_dir
        self.writes = parts.writes_files
        self.identity = directory_identity(run_dir)
        self.start = start
        self.position = RunPosition(start.stage)
        self.resume_point = start
        """The state at the start of the stage in progress: what an interrupt saves."""
        self.metrics_lines = list(start.metrics_lines)
        self.last: StageMetrics | None = None
        self.checkpoint: Path | None = None
        run = self.config.run
        self.budget_seconds = 60.0 * run.time_budget_minutes
        self.clock = time.process_time if run.budget_clock == "cpu" else time.perf_counter
        self.run_started = self.clock() - start.elapsed_seconds
        self.penalty = EpisodicPenalty(self.config.sampler.turns)

    def run(self, progress: bool) -> Path:
        config, start = self.config, self.start
        try:
            team = start.restore(self.parts.team, self.parts.updater, self.parts.sampler.rng)
            if self.writes:  # lines after the checkpoint belong to stages run again
                lines = "".join(line + "\n" for line in self.metrics_lines)
                write_atomically(self.run_dir / "metrics.jsonl", lines.encode())
            metrics_path = self.run_dir / "metrics.jsonl" if self.writes else Path(os.devnull)
            with ExitStack() as opened:
                bar = StageProgress(
                    scheme=config.stage.scheme,
                    stages=config.stage.stages,
                    start_stage=start.stage,
                    budget_seconds=self.budget_seconds,
                    elapsed_seconds=start.elapsed_seconds,
                    enabled=progress and self.writes,
                )
                opened.callback(bar.close)
                opened.enter_context(sigterm_interrupts())
                opened.enter_context(writer_thread_errors_folded())
                writer = opened.enter_context(
                    open_trackers(self.run_dir, config.run.report_to, start.stage, self.writes)
                )
                metrics = opened.enter_context(metrics_path.open("a"))
                for line in self.metrics_lines:  # the checkpoint's stages a tracker lost
                    record = StageMetrics.from_json(json.loads(line))
                    log_scalars(writer.behind(record.stage + 1), record)
                writer.flush()
                for stage in range(start.stage, config.stage.stages):
                    team, last = self.stage(stage, team, metrics, writer, bar)
                    if last:
                        break
            if self.writes:
                summary = final_summary(self.resume_point.stage, self.last, self.checkpoint)
                log_event(self.run_dir, "finished", **summary)
        except KeyboardInterrupt:
            checkpoint = self.save(self.resume_point)
            if self.writes:
                log_event(
                    self.run_dir,
                    "interrupted",
                    **self.position.fields(),
                    checkpoint=checkpoint.name,
                    resumes_at={"stage": self.resume_point.stage, "update": 0},
                )
            raise TrainingInterrupted(self.run_dir, checkpoint) from None
        except RunDirectoryError as error:  # the checkpoint does not fit the run: nothing to save
            if self.writes:
                log_failure(
                    self.run_dir, error_line(error), **self.position.fields(), checkpoint=None
                )
            raise
        except Exception as error:
            fields = self.position.fields()
            record_failure(self.run_dir, error, fields, self.resume_point, self.save, self.writes)
            raise
        return self.run_dir

    def stage(
        self, stage: int, team: LoraTeam, metrics: TextIO, writer: Any, bar: StageProgress
    ) -> tuple[LoraTeam, bool]:
        """Stage ``stage``: the core loop's stage, its metrics and evaluation, then what it
        leaves (``keep``); returns the new team and whether the run ends here."""
        config, parts = self.config, self.parts
        with profiling.section("checkpoint"):  # the run directory is still there
            self.require_run_directory()
        self.position = RunPosition(stage)
        started, cpu_started = time.perf_counter(), time.process_time()
        # Exclusive of the sampler's and updater's own sections: the certificate (Thm
        # 3.4/3.6 arithmetic on the updates' measurements) and the loop's bookkeeping.
        report_part = StagePartReports(self, bar, stage, team)
        settings = parts.sampler.settings
        # Said before the first sampling, which can take minutes on a CPU: the run is alive.
        report_part.step(
            f"sampling {settings.prompts_per_batch} groups of {settings.group_size} dialogues"
        )
        with profiling.section("certificate and stage loop"):
            report, team = run_stage(
                team,
                report_part.sampler(parts.sampler),
                parts.updater,
                config.stage,
                self.penalty,
                stage_index=stage,
                on_update=report_part.updated,
            )
        with profiling.section("logging"):
            record = StageMetrics.of(
                stage, report, time.perf_counter() - started, time.process_time() - cpu_started
            )
            # Pairs drawn outside the stage's draws (the last update's, sequential batches).
            pair_tokens = getattr(parts.sampler, "take_pair_draw_tokens", lambda: 0)()
            record = replace(record, held_out_tokens=record.held_out_tokens + pair_tokens)
        elapsed = self.clock() - self.run_started
        out_of_time = self.budget_seconds > 0 and elapsed >= self.budget_seconds
        together = parts.collective
        if together is not None:  # rank 0's clock decides for every rank
            out_of_time = together.broadcast(out_of_time)
            replicas_agree(together, team.policies)
        last = stage == config.stage.stages - 1 or out_of_time
        every = config.run.eval_every
        if self.writes and record.groups_drawn and not record.groups_with_signal:
            bar.note(no_signal_warning(bar.label(stage), record, report_part.cut_messages))
        if every and ((stage + 1) % every == 0 or last) and parts.test_problems:
            report_part.step(f"evaluating on {len(parts.test_problems)} held-out problems")
            evaluation = evaluate_team(
                team, parts.sampler, parts.test_problems, collective=together
            )
            record = replace(record, eval=evaluation)
            if self.writes and bar.enabled:
                bar.note(f"{bar.label(stage)}: {held_out_line(evaluation)}")
        self.keep(record, team, last, metrics, writer)
        with profiling.section("logging"):
            reward = record.train_reward if record.train_reward is not None else math.nan
            bar.stage_done(
                stage,
                self.clock() - self.run_started,
                record.wall_seconds,
                reward,
                report.certificate,
                certificate_parts(report) + environment_part(record),
            )
        return team, last

    def keep(
        self, record: StageMetrics, team: LoraTeam, last: bool, metrics: TextIO, writer: Any
    ) -> None:
        """What a finished stage leaves: its line of metrics.jsonl, the resume point after it
        (on disk every ``checkpoint_every`` stages and after the last), its scalars."""
        parts, saves = self.parts, self.config.run.checkpoint_every
        with profiling.section("logging"):
            self.require_run_directory()
            line = json.dumps(record.as_json())
            metrics.write(line + "\n")
            metrics.flush()
            self.metrics_lines.append(line)
        with profiling.section("checkpoint"):
            self.resume_point = ResumePoint.capture(
                record.stage + 1,
                team,
                parts.updater,
                parts.sampler.rng,
                tuple(self.metrics_lines),
                self.clock() - self.run_started,
                finished=last,
            )
        with profiling.section("logging"):
            log_scalars(writer, record)
            writer.flush()  # before the checkpoint: a resumed run starts after this stage
        if self.writes and (last or (saves and (record.stage + 1) % saves == 0)):
            self.require_run_directory()
            with profiling.section("checkpoint"), signals_deferred():
                self.checkpoint = write_checkpoint(self.run_dir, self.resume_point)
                prune_checkpoints(self.run_dir, self.config.run.keep_checkpoints)
        self.last = record

    def require_run_directory(self) -> None:
        """A deleted (or replaced) run directory is never recreated half-empty."""
        if self.writes and directory_identity(self.run_dir) != self.identity:
            raise FileNotFoundError(errno.ENOENT, "run directory deleted", str(self.run_dir))

    def save(self, point: ResumePoint) -> Path:
        if not self.writes:  # rank 0 saves; the others only say where
            return self.run_dir / CHECKPOINTS / f"{STAGE_PREFIX}{point.stage}"
        self.require_run_directory()
        with signals_deferred(reraise=False):
            return write_checkpoint(self.run_dir, point)


class StagePartReports:
    """What a stage says while it runs: each sampling and each agent's update as it ends
    (``StageProgress.step``), and the count of messages cut at their length limit."""

    def __init__(self, run: _Run, bar: StageProgress, stage: int, team: LoraTeam) -> None:
        self.run = run
        self.bar = bar
        self.stage = stage
        self.updates = len(stage_order(run.config.stage, team.n_agents, stage))
        self.done = 0
        self.cut_messages: tuple[int, int] = (0, 0)
        """Of the stage's first sampling: messages at their length limit, and messages."""

    def sampler(self, inner: Any) -> Any:
        """``inner``, reporting each fresh sampling as it ends."""
        return _ReportingSampler(inner, self.sampled)

    def step(self, text: str) -> None:
        # Each update is a part of the stage, and the end (evaluation, bookkeeping) one more.
        self.bar.step(
            self.stage,
            self.done / (self.updates + 1),
            text,
            self.run.clock() - self.run.run_started,
        )

    def sampled(self, rollouts: Any) -> None:
        if not self.done:
            self.cut_messages = messages_cut(rollouts.episodes, self.run.parts.sampler)
        self.step(
            f"sampled {rollouts.groups_drawn} groups ({rollouts.groups_with_signal} with "
            f"differing rewards), reward {rollouts.mean_reward:.2f}, "
            f"{rollouts.wall_seconds:.1f} s"
        )

    def updated(self, record: UpdateRecord) -> None:
        self.run.position.updates_done = record.position + 1
        self.done = record.position + 1
        update = UpdateMetrics.of(record)
        verdict = "undone" if record.undone else "kept" if record.kept else "rejected"
        backtracks = f"{update.backtracks} backtrack{'s' * (update.backtracks != 1)}"
        measured = record.measured
        self.step(
            f"agent {record.agent} update {self.done}/{self.updates} {verdict}: KL "
            f"{update.kl:.3g} of radius {record.radius:g}, {backtracks}, surrogate gain "
            f"{update.surrogate:+.3g}, penalty {update.penalty:.3g}"
            + (f", measured >= {measured.bound:+.3g} (n = {measured.n})" if measured else "")
        )


class _ReportingSampler:
    """A sampler that calls ``on_sample`` with every fresh draw (everything else passes
    through: the stage loop sees the same sampler)."""

    def __init__(self, inner: Any, on_sample: Any) -> None:
        self._inner = inner
        self._on_sample = on_sample

    def sample(self, team: Any, **kwargs: Any) -> Any:
        rollouts = self._inner.sample(team, **kwargs)
        self._on_sample(rollouts)
        return rollouts

    def with_held_out(self, groups: int, chained: bool = True) -> _ReportingSampler:
        """The inner sampler holding out ``groups`` groups per draw, still reporting
        (``teamtr.protocols.PairingSampler``)."""
        return _ReportingSampler(self._inner.with_held_out(groups, chained), self._on_sample)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
