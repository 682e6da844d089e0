"""Training runs: run stages of the core loop on a built team, log and checkpoint.

The run's parts come from ``llm.training.builder.build`` (data, models, sampler, updater); this module
runs them. Every scheme goes through ``teamtr.stage.run_stage``; the single-agent GRPO
baseline is the same loop with ``n_agents = 1`` (one adapter speaks every turn).

Nothing is lost on a crash: at the start of every stage the run's whole state is held as a
``llm.training.checkpoint.ResumePoint`` (team snapshots are immutable values, so this is cheap), written
to disk every ``checkpoint_every`` stages, after the last one, and when the run is interrupted
(SIGINT/SIGTERM) or fails. ``resume`` rebuilds the run from its directory and replays from the
newest valid checkpoint; the result is bit-identical to an uninterrupted run (timings aside).
The run directory appears only after the config, the data and the model have loaded, so bad
input leaves nothing behind; its creation, lock, event log and clean ends on faults live in
``llm.training.rundir``.
"""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from llm.common import profiling
from llm.common.collective import Collective
from llm.common.config import (
    ConfigError,
    Override,
    RunConfig,
    load_config,
    require_resumable_overrides,
)
from llm.common.devices import resolve_placement
from llm.common.progress import StageProgress
from llm.common.trackers import TrackerMissing, check_trackers, open_trackers
from llm.evaluation.held_out import evaluate_team
from llm.models.agents import LoraTeam
from llm.training.builder import Components, build, configured_task
from llm.training.checkpoint import (
    CHECKPOINTS,
    STAGE_PREFIX,
    LatestCheckpoint,
    ResumePoint,
    RunDirectoryError,
    latest_checkpoint,
    recover_interrupted_writes,
    require_resumable,
    stage_directories,
    write_atomically,
    write_checkpoint,
)
from llm.training.distributed import (
    agree,
    check_world,
    record_world,
    replicas_agree,
    require_same_world,
)
from llm.training.preflight import (
    MIN_FREE_BYTES,
    check_run_name,
    require_writable_directory,
)
from llm.training.records import (
    RunPosition,
    StageMetrics,
    UpdateMetrics,
    final_summary,
    log_scalars,
)
from llm.training.rundir import (
    RunFailed,
    TrainingInterrupted,
    create_run_directory,
    directory_identity,
    error_line,
    log_event,
    log_failure,
    record_failure,
    require_new_run_directory,
    signals_deferred,
    sigterm_interrupts,
    writer_thread_errors_folded,
)
from llm.training.runlock import RunLock
from llm.training.runlock import acquire as acquire_run_lock
from llm.training.task_check import check_task
from teamtr.penalty import EpisodicPenalty
from teamtr.reports import StageReport, UpdateRecord
from teamtr.stage import run_stage, stage_order


# -- training --------------------------------------------------------------------------------------
def check_training(
    config: RunConfig,
    config_name: str = "run",
    task_check: bool | None = None,
    warns: bool = True,
) -> Path:
    """Everything a new run can check before its model loads; returns its run directory.
    ``warns``: print what the task check warns of (rank 0 of a data-parallel run only).
    ``task_check``: play the task on a tiny model (``check_task``); by default only where the
    task is one's own code or data (``user_code``)."""
    name = config.run.name or f"{config_name}-{datetime.now():%Y%m%d-%H%M%S}"
    check_run_name(name, "[run] name")
    run_dir = Path(config.run.output_dir) / name
    require_new_run_directory(run_dir)
    require_writable_directory(run_dir.parent, "[run] output_dir", MIN_FREE_BYTES)
    try:
        check_trackers(config.run.report_to)
    except TrackerMissing as missing:
        raise ConfigError(str(missing)) from None
    task = configured_task(config)  # every data line parsed and checked, every module imported
    if user_code(config) if task_check is None else task_check:
        checked = check_task(task, config)  # a reward that fails does so now, before the load
        for warning in checked.warnings if warns else ():  # train/test overlap, ...
            print(f"warning: {warning}", file=sys.stderr, flush=True)
    return run_dir


def environment_part(record: StageMetrics) -> str:
    """A stage line's account of its environment, where it has one: the texts it added and the
    dialogues it ended."""
    if not record.environment_texts:
        return ""
    return (
        f" (environment: {record.environment_texts} texts, "
        f"{record.ended_by_environment} dialogues ended)"
    )


def user_code(config: RunConfig) -> bool:
    """Whether the run's task is one's own (a factory, a data file, a reward or metric), acts
    in an environment (whose code is as much one's own: the check tries it), or comes from
    reasoning-gym's generators (the check shows drawn problems and their answers' rewards)."""
    task = config.task
    return task.kind in ("python", "dataset", "environment", "reasoning_gym") or bool(
        task.reward or task.metric or task.environment
    )


def train(
    config: RunConfig,
    config_name: str = "run",
    progress: bool = True,
    collective: Collective | None = None,
    parts: Components | None = None,
) -> Path:
    """Run ``config.stage.stages`` stages in a new run directory; returns its path.

    ``collective``: this process's rank in a data-parallel run (``llm.training.distributed``); rank 0
    creates, locks and writes the run directory. ``parts`` are the run's components when the
    caller has built them (``build(config)``).
    """
    if collective is None:
        run_dir = check_training(config, config_name)
    else:
        name = config.run.name or f"{config_name}-{datetime.now():%Y%m%d-%H%M%S}"
        name = collective.broadcast(name)  # rank 0's timestamp names the run
        shards = check_world(config, collective.world_size)
        config = replace(config, run=replace(config.run, rollout_shards=shards, name=name))
        run_dir = Path(config.run.output_dir) / name
        checks = _failure(check_training, config, config_name, None, collective.is_main)
        agree(collective, checks)
    # Data and model are loaded before anything is written.
    parts = parts or build(config, collective, progress)
    lock = None
    try:
        if parts.writes_files:
            lock = create_run_directory(run_dir, parts.config)
            parts.sampler.engine.keep_log_in(run_dir)
        try:
            if parts.writes_files:
                if collective is not None:
                    record_world(run_dir, collective.world_size, config.run.rollout_shards)
                log_event(run_dir, "started", **placement_fields(parts.config))
            if collective is not None:
                collective.gather(None)  # every rank waits until the run directory exists
            start = ResumePoint.capture(0, parts.team, parts.updater, parts.sampler.rng, (), 0.0)
        except Exception as error:  # the run directory exists: say why it has no stages
            if parts.writes_files:
                log_failure(run_dir, error_line(error), stage=0, updates_done=0, checkpoint=None)
            if isinstance(error, OSError):
                raise RunFailed(
                    f"{run_dir}: the run could not start: {error_line(error)}"
                ) from None
            raise
        return _run(parts, run_dir, start, progress)
    finally:
        parts.sampler.close()  # a server engine stops on every way out
        if lock is not None:
            lock.release()


def resume(
    run_dir: str | Path,
    progress: bool = True,
    collective: Collective | None = None,
    device: str | None = None,
    overrides: Sequence[Override] = (),
) -> Path:
    """Continue a run from its newest valid checkpoint, exactly as if it had not stopped.

    The process that writes the run (rank 0 of a data-parallel run, which resumes with the
    number of processes it was started with) takes the run lock and cleans up interrupted
    writes first. ``device`` overrides the run's ``[run] device`` (checkpoints are read onto
    any device); ``overrides`` (``--set``) the keys a resumed run may change
    (``RESUMABLE_KEYS``), recorded in its config.json.
    """
    run_dir = Path(run_dir)
    config = resumable_config(run_dir, collective.world_size if collective else 1, overrides)
    recorded = json.dumps(config.to_dict(), indent=2).encode()
    if device is not None:
        config = replace(config, run=replace(config.run, device=device))
    writes = collective is None or collective.is_main
    lock = None
    parts: Components | None = None
    try:
        if writes:
            try:
                lock = _lock_and_recover(run_dir)
            except (RunDirectoryError, ConfigError) as error:
                if collective is None:
                    raise
                agree(collective, error)
        if collective is not None:
            agree(collective, None)  # every rank reads the checkpoints once rank 0 is done
        latest = latest_checkpoint(run_dir)
        if latest.point is not None and latest.point.finished and not goes_on(latest.point, config):
            # Said before the model loads: there is nothing to load it for.
            if writes:
                _log_resumed(run_dir, latest, latest.point.stage)
                print(f"{run_dir}: {complete_message(latest.point, config)}")
            return run_dir
        if writes and overrides:  # the run goes on with them: its record says so
            write_atomically(run_dir / "config.json", recorded)
        parts = build(config, collective, progress)
        if writes:
            parts.sampler.engine.keep_log_in(run_dir)
        # Stopped before its first checkpoint: the rebuilt run is exactly the original start.
        point = latest.point or ResumePoint.capture(
            0, parts.team, parts.updater, parts.sampler.rng, (), 0.0
        )
        if writes:
            _log_resumed(run_dir, latest, point.stage, **placement_fields(parts.config))
        return _run(parts, run_dir, point, progress)
    finally:
        if parts is not None:
            parts.sampler.close()  # a server engine stops on every way out
        if lock is not None:
            lock.release()


def goes_on(point: ResumePoint, config: RunConfig) -> bool:
    """Whether a finished run has stages left under ``config``: ``--set stage.stages`` beyond
    the stages it ran, or ``--set run.time_budget_minutes`` beyond the time it used (the run
    ended on whichever came first)."""
    budget = 60.0 * config.run.time_budget_minutes
    return point.stage < config.stage.stages and (budget <= 0 or point.elapsed_seconds < budget)


def complete_message(point: ResumePoint, config: RunConfig) -> str:
    """Why a finished run does nothing when resumed, with the key that would make it go on."""
    said = f"already complete after {point.stage} stages"
    if point.stage >= config.stage.stages:
        return (
            f"{said} ([stage] stages = {config.stage.stages}); nothing to do: "
            f"`--set stage.stages={point.stage + 1}` or more continues it"
        )
    return (
        f"{said}, its time budget of {config.run.time_budget_minutes:g} minutes spent "
        f"({point.elapsed_seconds / 60:.1f} used); nothing to do: a larger "
        "`--set run.time_budget_minutes=M` (0: none) continues it"
    )


def _lock_and_recover(run_dir: Path) -> RunLock:
    """Take the run lock, then clean up what interrupted writes left (``llm.training.checkpoint``)."""
    lock = acquire_run_lock(run_dir)
    try:
        require_writable_directory(run_dir, "--resume", MIN_FREE_BYTES)
        recovered = recover_interrupted_writes(run_dir)
        if lock.stale_pid is not None or recovered:
            log_event(run_dir, "recovered", stale_lock_pid=lock.stale_pid, actions=recovered)
    except BaseException:
        lock.release()
        raise
    return lock


def _log_resumed(run_dir: Path, latest: LatestCheckpoint, stage: int, **fields: Any) -> None:
    log_event(
        run_dir,
        "resumed",
        checkpoint=latest.directory.name if latest.directory else None,
        stage=stage,
        skipped=list(latest.skipped),
        **fields,
    )


def placement_fields(config: RunConfig) -> dict[str, str]:
    """The device and dtype a started or resumed run computes in, and why that dtype: a
    ``dtype = "auto"`` run is float32 or bfloat16 depending on the machine
    (``llm.common.devices.auto_dtype``), and a resumed run resolves it again."""
    placement = resolve_placement(config.run.device, config.run.dtype)
    return {
        "device": str(placement.device),
        "dtype": str(placement.dtype).removeprefix("torch."),
        "dtype_reason": placement.dtype_reason,
    }


def resumable_config(
    run_dir: Path, world_size: int = 1, overrides: Sequence[Override] = ()
) -> RunConfig:
    """The config of a run directory that can be resumed by ``world_size`` processes, with the
    ``--set`` values a resumed run may change (any other is a ``ConfigError``)."""
    require_resumable_overrides(overrides)
    if not run_dir.is_dir():
        raise RunDirectoryError(f"{run_dir}: no such run directory")
    require_resumable(run_dir)
    require_same_world(run_dir, world_size)
    config = load_config(run_dir / "config.json", overrides)
    try:  # as a new run does (``check_training``): before the model loads, not a traceback
        check_trackers(config.run.report_to)
    except TrackerMissing as missing:
        raise ConfigError(str(missing)) from None
    return config


def prune_checkpoints(run_dir: Path, keep: int) -> list[str]:
    """Delete every checkpoint but the ``keep`` newest (0: keep all); returns their names.
    Called once a new checkpoint is complete on disk, so a crash mid-way leaves it intact."""
    if keep <= 0:
        return []
    old = stage_directories(run_dir)[:-keep]
    for directory in old:
        shutil.rmtree(directory, ignore_errors=True)
    return [directory.name for directory in old]


def _failure(check: Any, *args: Any) -> Exception | None:
    """The error ``check(*args)`` raises, if any (to be agreed on by every rank)."""
    try:
        check(*args)
    except (RunDirectoryError, ConfigError) as error:
        return error
    return None


def _run(parts: Components, run_dir: Path, start: ResumePoint, progress: bool) -> Path:
    """Stages ``start.stage`` onwards; ``start`` is the state to continue from."""
    return _Run(parts, run_dir, start).run(progress)


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

    def with_held_out(self, groups: int) -> _ReportingSampler:
        """The inner sampler holding out ``groups`` groups per draw, still reporting
        (``teamtr.protocols.PairingSampler``)."""
        return _ReportingSampler(self._inner.with_held_out(groups), self._on_sample)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def messages_cut(episodes: Sequence[Any], sampler: Any) -> tuple[int, int]:
    """Of the messages of ``episodes``, those cut at their speaker's ``max_new_tokens``, and
    all: a cut message fills its limit without the stop token, which one that ended on its
    own carries as its last token (``llm.sampling.messages``)."""
    stop = sampler.chat.stop_id
    turns = [turn for episode in episodes for turn in episode.turns]
    cut = sum(
        len(t.message) >= sampler.settings.max_tokens_of(t.agent) and t.message[-1] != stop
        for t in turns
    )
    return cut, len(turns)


def no_signal_warning(label: str, record: StageMetrics, cut_messages: tuple[int, int]) -> str:
    """The line of a stage whose groups all earned equal rewards: GRPO's advantages were all
    zero, so no agent moved, and nothing says so but ``groups_with_signal: 0``."""
    cut, messages = cut_messages
    reward = record.train_reward if record.train_reward is not None else math.nan
    return (
        f"warning: {label}: none of the {record.groups_drawn} groups drawn had differing "
        f"rewards (mean reward {reward:.2f}), so this stage learned nothing. Usual causes: "
        f"a reward that never varies; messages cut by [sampler] max_new_tokens ({cut} of "
        f"{messages} reached it); a task too hard (or too easy) for the model. "
        "`teamtr train --check --real` plays a few dialogues of the real model and counts "
        "the groups that would carry a signal"
    )


def held_out_line(evaluation: dict[str, float]) -> str:
    """The held-out result of a periodic evaluation, as the console prints it."""
    measure = "accuracy" if "accuracy" in evaluation else "score"
    return (
        f"held-out {measure} {evaluation[measure]:.3f} +- "
        f"{evaluation['standard_error']:.3f} on {int(evaluation['n'])} problems, parse "
        f"failures {evaluation['parse_failure_rate']:.2f}"
    )


def certificate_parts(report: StageReport) -> str:
    """The certificate's two parts, surrogate gain L and penalty (Thm 3.4/3.6: certificate
    = L - penalty), and, when negative, why it certifies nothing (docs/runs.md)."""
    kept = [r for r in report.records if r.kept]
    if not kept:
        undone = sum(r.undone for r in report.records)
        return (
            f" (no update kept; {undone} undone: measured bound < 0)"
            if undone
            else " (no update kept)"
        )
    gain = sum(r.update.surrogate for r in kept)
    penalty = gain - report.certificate  # joint schemes charge one penalty for the whole move
    text = f"surrogate gain {gain:.3g} - penalty {penalty:.3g}"
    if report.certificate < 0:
        # Both parts grow as sqrt(KL) to first order: a smaller radius rarely changes the sign.
        text += "; negative: it certifies no improvement, see docs/runs.md"
    if report.measured is not None:  # [stage] certificate_groups: held-out pairs (teamtr.measured)
        text += f"; measured: {report.measured.line()}"
    return f" ({text})"
