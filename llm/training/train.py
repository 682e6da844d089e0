"""Training runs: start a run, or resume one, and hand its stages to ``llm.training.stages``.

The run's parts come from ``llm.training.builder.build`` (data, models, sampler, updater); this
module checks the run, creates or locks its directory, and runs the parts from a resume point
(``llm.training.stages.loop.run_stages``). Every scheme goes through ``teamtr.stage.run_stage``;
the single-agent GRPO baseline is the same loop with ``n_agents = 1`` (one adapter speaks every
turn).

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

import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from llm.common.collective import Collective
from llm.common.config import (
    ConfigError,
    Override,
    RunConfig,
    load_config,
    require_resumable_overrides,
)
from llm.common.devices import resolve_placement
from llm.common.trackers import TrackerMissing, check_trackers
from llm.training.builder import Components, build, configured_task
from llm.training.checkpoint import (
    LatestCheckpoint,
    ResumePoint,
    RunDirectoryError,
    latest_checkpoint,
    recover_interrupted_writes,
    require_resumable,
    write_atomically,
)
from llm.training.distributed import (
    agree,
    check_world,
    record_world,
    require_same_world,
)
from llm.training.preflight import (
    MIN_FREE_BYTES,
    check_run_name,
    require_writable_directory,
)
from llm.training.rundir import (
    RunFailed,
    create_run_directory,
    error_line,
    log_event,
    log_failure,
    require_new_run_directory,
)
from llm.training.runlock import RunLock
from llm.training.runlock import acquire as acquire_run_lock
from llm.training.stages.loop import run_stages
from llm.training.task_check import check_task


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
        return run_stages(parts, run_dir, start, progress)
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
        return run_stages(parts, run_dir, point, progress)
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


def _failure(check: Any, *args: Any) -> Exception | None:
    """The error ``check(*args)`` raises, if any (to be agreed on by every rank)."""
    try:
        check(*args)
    except (RunDirectoryError, ConfigError) as error:
        return error
    return None
