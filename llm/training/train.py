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
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from llm.common import profiling
from llm.common.collective import Collective
from llm.common.config import ConfigError, RunConfig, load_config
from llm.sampling.sampler import DialogueRollouts
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
from llm.training.evaluation import evaluate_team
from llm.training.preflight import (
    MIN_FREE_BYTES,
    check_run_name,
    require_writable_directory,
)
from llm.training.progress import StageProgress
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
from llm.update.updater import non_finite_quantity
from teamtr.penalty import EpisodicPenalty
from teamtr.reports import StageReport, UpdateRecord
from teamtr.stage import run_stage


def stage_metrics(
    stage: int, report: StageReport, seconds: float, cpu_seconds: float
) -> dict[str, Any]:
    calls: tuple[DialogueRollouts, ...] = report.sampled_rollouts
    first = calls[0] if calls else None
    return {
        "stage": stage,
        "scheme": report.scheme,
        "order": list(report.order),
        "certificate": report.certificate,
        "train_reward": first.mean_reward if first else None,
        "train_parse_failure_rate": first.parse_failure_rate if first else None,
        # TeamTR samples again after every update: the intermediate teams' rewards, in order.
        "rollout_rewards": [c.mean_reward for c in calls],
        "generated_tokens": sum(c.generated_tokens for c in calls),
        "reused_turns": sum(c.reused_turns for c in calls),
        # Groups played (dynamic sampling's discarded ones included), those among them with
        # differing rewards, and those each batch handed to the updater holds.
        "groups_drawn": sum(c.groups_drawn for c in calls),
        "groups_with_signal": sum(c.groups_with_signal for c in calls),
        "batch_signal_groups": [c.held_signal_groups for c in calls],
        "sampling_seconds": sum(c.wall_seconds for c in calls),
        "wall_seconds": seconds,
        # This process's CPU time for the stage (sampling and updates; the held-out evaluation
        # after it is not counted): the x axis of a learning curve against training compute.
        "cpu_seconds": cpu_seconds,
        "updates": [
            {
                "agent": r.agent,
                "kept": r.kept,
                "accepted": r.update.accepted,
                "surrogate": r.update.surrogate,
                "kl": r.update.kl,
                "kl_quantile": r.update.kl_quantile,
                "backtracks": r.update.backtracks,
                "non_finite": non_finite_quantity(r.update),
                "penalty": r.penalty,
                "certificate": r.certificate,
            }
            for r in report.records
        ],
    }


# -- training --------------------------------------------------------------------------------------
def check_training(
    config: RunConfig, config_name: str = "run", task_check: bool | None = None
) -> Path:
    """Everything a new run can check before its model loads; returns its run directory.
    ``task_check``: play the task on a tiny model (``check_task``); by default only where the
    task is one's own code or data (``user_code``)."""
    name = config.run.name or f"{config_name}-{datetime.now():%Y%m%d-%H%M%S}"
    check_run_name(name, "[run] name")
    run_dir = Path(config.run.output_dir) / name
    require_new_run_directory(run_dir)
    require_writable_directory(run_dir.parent, "[run] output_dir", MIN_FREE_BYTES)
    task = configured_task(config)  # every data line parsed and checked, every module imported
    if user_code(config) if task_check is None else task_check:
        check_task(task, config)  # a reward that fails does so now, before the model loads
    return run_dir


def user_code(config: RunConfig) -> bool:
    """Whether the run's task is one's own (a factory, a data file, a reward or metric)."""
    task = config.task
    return task.kind in ("python", "dataset") or bool(task.reward or task.metric)


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
        agree(collective, _failure(check_training, config, config_name))
    # Data and model are loaded before anything is written.
    parts = parts or build(config, collective, progress)
    lock = None
    try:
        if parts.writes_files:
            lock = create_run_directory(run_dir, parts.config)
        try:
            if parts.writes_files:
                if collective is not None:
                    record_world(run_dir, collective.world_size, config.run.rollout_shards)
                log_event(run_dir, "started")
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
        if lock is not None:
            lock.release()


def resume(
    run_dir: str | Path,
    progress: bool = True,
    collective: Collective | None = None,
    device: str | None = None,
) -> Path:
    """Continue a run from its newest valid checkpoint, exactly as if it had not stopped.

    The process that writes the run (rank 0 of a data-parallel run, which resumes with the
    number of processes it was started with) takes the run lock and cleans up interrupted
    writes first. ``device`` overrides the run's ``[run] device`` (checkpoints are read onto
    any device).
    """
    run_dir = Path(run_dir)
    config = resumable_config(run_dir, collective.world_size if collective else 1)
    if device is not None:
        config = replace(config, run=replace(config.run, device=device))
    writes = collective is None or collective.is_main
    lock = None
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
        if latest.point is not None and latest.point.finished:
            # Said before the model loads: there is nothing to load it for.
            if writes:
                _log_resumed(run_dir, latest, latest.point.stage)
                print(
                    f"{run_dir}: already complete after {latest.point.stage} stages; nothing to do"
                )
            return run_dir
        parts = build(config, collective, progress)
        # Stopped before its first checkpoint: the rebuilt run is exactly the original start.
        point = latest.point or ResumePoint.capture(
            0, parts.team, parts.updater, parts.sampler.rng, (), 0.0
        )
        if writes:
            _log_resumed(run_dir, latest, point.stage)
        return _run(parts, run_dir, point, progress)
    finally:
        if lock is not None:
            lock.release()


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


def _log_resumed(run_dir: Path, latest: LatestCheckpoint, stage: int) -> None:
    log_event(
        run_dir,
        "resumed",
        checkpoint=latest.directory.name if latest.directory else None,
        stage=stage,
        skipped=list(latest.skipped),
    )


def resumable_config(run_dir: Path, world_size: int = 1) -> RunConfig:
    """The config of a run directory that can be resumed by ``world_size`` processes."""
    if not run_dir.is_dir():
        raise RunDirectoryError(f"{run_dir}: no such run directory")
    require_resumable(run_dir)
    require_same_world(run_dir, world_size)
    return load_config(run_dir / "config.json")


def _failure(check: Any, *args: Any) -> Exception | None:
    """The error ``check(*args)`` raises, if any (to be agreed on by every rank)."""
    try:
        check(*args)
    except (RunDirectoryError, ConfigError) as error:
        return error
    return None


class _NoWriter:
    """Stands in for TensorBoard's writer on ranks other than 0."""

    def add_scalar(self, *_args: Any) -> None:
        pass

    def close(self) -> None:
        pass


def _run(parts: Components, run_dir: Path, start: ResumePoint, progress: bool) -> Path:
    """Stages ``start.stage`` onwards; ``start`` is the state to continue from."""
    config = parts.config
    sampler_rng = parts.sampler.rng
    resume_point = start
    position = {"stage": start.stage, "updates_done": 0}
    writer = None
    bar: StageProgress | None = None
    identity = directory_identity(run_dir)

    def require_run_directory() -> None:
        """A deleted (or replaced) run directory is never recreated half-empty."""
        if parts.writes_files and directory_identity(run_dir) != identity:
            raise FileNotFoundError(errno.ENOENT, "run directory deleted", str(run_dir))

    def note_update(record: UpdateRecord) -> None:
        position["updates_done"] = record.position + 1

    writes = parts.writes_files
    together = parts.collective

    def save(point: ResumePoint) -> Path:
        if not writes:  # rank 0 saves; the others only say where
            return run_dir / CHECKPOINTS / f"{STAGE_PREFIX}{point.stage}"
        require_run_directory()
        with signals_deferred(reraise=False):
            return write_checkpoint(run_dir, point)

    try:
        from torch.utils.tensorboard import SummaryWriter

        team = start.restore(parts.team, parts.updater, sampler_rng)
        metrics_lines = list(start.metrics_lines)
        # Lines after the checkpoint belong to stages that will be run again.
        lines = "".join(x + "\n" for x in metrics_lines)
        if writes:
            write_atomically(run_dir / "metrics.jsonl", lines.encode())
        penalty = EpisodicPenalty(config.sampler.turns)
        # purge_step drops TensorBoard points of stages that are about to be run again.
        writer = (
            SummaryWriter(str(run_dir / "tensorboard"), purge_step=start.stage or None)
            if writes
            else _NoWriter()
        )
        stages = config.stage.stages
        budget_seconds = 60.0 * config.run.time_budget_minutes
        clock = time.process_time if config.run.budget_clock == "cpu" else time.perf_counter
        run_started = clock() - start.elapsed_seconds
        bar = StageProgress(
            scheme=config.stage.scheme,
            stages=stages,
            start_stage=start.stage,
            budget_seconds=budget_seconds,
            elapsed_seconds=start.elapsed_seconds,
            enabled=progress and writes,
        )
        metrics_path = run_dir / "metrics.jsonl" if writes else Path(os.devnull)
        record: dict[str, Any] | None = None
        checkpoint: Path | None = None
        with (
            sigterm_interrupts(),
            writer_thread_errors_folded(),
            metrics_path.open("a") as metrics,
        ):
            for stage in range(start.stage, stages):
                with profiling.section("checkpoint"):  # the run directory is still there
                    require_run_directory()
                position.update(stage=stage, updates_done=0)
                started = time.perf_counter()
                cpu_started = time.process_time()
                # Exclusive of the sampler's and updater's own sections: the certificate
                # (Thm 3.4/3.6 arithmetic on the updates' measurements) and the loop's bookkeeping.
                with profiling.section("certificate and stage loop"):
                    report, team = run_stage(
                        team,
                        parts.sampler,
                        parts.updater,
                        config.stage,
                        penalty,
                        stage_index=stage,
                        on_update=note_update,
                    )
                with profiling.section("logging"):
                    record = stage_metrics(
                        stage,
                        report,
                        time.perf_counter() - started,
                        time.process_time() - cpu_started,
                    )
                elapsed = clock() - run_started
                out_of_time = budget_seconds > 0 and elapsed >= budget_seconds
                if together is not None:  # rank 0's clock decides for every rank
                    out_of_time = together.broadcast(out_of_time)
                    replicas_agree(together, team.policies)
                last = stage == stages - 1 or out_of_time
                if (
                    config.run.eval_every
                    and ((stage + 1) % config.run.eval_every == 0 or last)
                    and parts.test_problems
                ):
                    record["eval"] = evaluate_team(
                        team, parts.sampler, parts.test_problems, collective=together
                    )
                with profiling.section("logging"):
                    require_run_directory()
                    line = json.dumps(record)
                    metrics.write(line + "\n")
                    metrics.flush()
                    metrics_lines.append(line)
                with profiling.section("checkpoint"):
                    resume_point = ResumePoint.capture(
                        stage + 1,
                        team,
                        parts.updater,
                        sampler_rng,
                        tuple(metrics_lines),
                        clock() - run_started,
                        finished=last,
                    )
                with profiling.section("logging"):
                    log_scalars(writer, stage, record)
                if writes and (
                    last
                    or (
                        config.run.checkpoint_every
                        and (stage + 1) % config.run.checkpoint_every == 0
                    )
                ):
                    require_run_directory()
                    with profiling.section("checkpoint"), signals_deferred():
                        checkpoint = write_checkpoint(run_dir, resume_point)
                with profiling.section("logging"):
                    bar.stage_done(
                        stage,
                        clock() - run_started,
                        record["wall_seconds"],
                        record["train_reward"] if record["train_reward"] is not None else math.nan,
                        report.certificate,
                    )
                if last:
                    break
            # Closed here, not only below: a TensorBoard write that failed in its thread (a
            # full disk) surfaces now, as the run's one error, not after "finished".
            closing, writer = writer, None
            closing.close()
        if writes:
            log_event(run_dir, "finished", **final_summary(resume_point.stage, record, checkpoint))
    except KeyboardInterrupt:
        checkpoint = save(resume_point)
        if writes:
            log_event(
                run_dir,
                "interrupted",
                **position,
                checkpoint=checkpoint.name,
                resumes_at={"stage": resume_point.stage, "update": 0},
            )
        raise TrainingInterrupted(run_dir, checkpoint) from None
    except RunDirectoryError as error:  # the checkpoint does not fit the run: nothing to save
        if writes:
            log_failure(run_dir, error_line(error), **position, checkpoint=None)
        raise
    except Exception as error:
        record_failure(run_dir, error, position, resume_point, save, writes=writes)
        raise
    finally:
        if bar is not None:
            bar.close()
        if writer is not None:
            try:
                writer.close()
            except OSError:  # its directory is gone or full: the failure is already reported
                pass
    return run_dir


def final_summary(
    stages: int, record: dict[str, Any] | None, checkpoint: Path | None
) -> dict[str, Any]:
    """The fields of a "finished" event: stages done, the last stage's metrics (and its
    evaluation), the checkpoint to evaluate or resume from."""
    metrics = {}
    if record is not None:
        keys = ("certificate", "train_reward", "train_parse_failure_rate", "eval")
        metrics = {key: record[key] for key in keys if key in record}
    return {
        "stages": stages,
        "metrics": metrics,
        "checkpoint": str(checkpoint) if checkpoint is not None else None,
    }


def log_scalars(writer: Any, stage: int, record: dict[str, Any]) -> None:
    for key in (
        "certificate",
        "train_reward",
        "train_parse_failure_rate",
        "generated_tokens",
        "groups_drawn",
        "groups_with_signal",
        "wall_seconds",
    ):
        if record[key] is not None:
            writer.add_scalar(f"stage/{key}", record[key], stage)
    for update in record["updates"]:
        for key in ("surrogate", "kl", "backtracks"):
            writer.add_scalar(f"agent{update['agent']}/{key}", update[key], stage)
    for key, value in record.get("eval", {}).items():
        writer.add_scalar(f"eval/{key}", value, stage)
