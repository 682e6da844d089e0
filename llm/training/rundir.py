"""A run directory's life: created whole or not at all, locked, logged, and ended cleanly.

``create_run_directory`` writes the config and format marker into a temporary sibling, locks
it (``llm.training.runlock``) and renames it into place. ``events.jsonl`` records what happened to the
run (start, resume, recovery, interrupt, failure, finish): every run that started ends with a
"finished", "failed" or "interrupted" event where the disk allows. Checkpoint writes hold
SIGINT/SIGTERM back (``signals_deferred``) so they are never cut short. A fault of the surroundings in the middle
of a run (an ``OSError``: a full disk, a read-only path, the directory deleted) ends it through
``record_failure``: a checkpoint and a "failed" event where the disk still allows, then one
``RunFailed`` message (exit code 1); a deleted run directory is never recreated.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from llm.common.command_faults import (  # noqa: F401 (importable from here as before)
    RunFailed,
    TrainingInterrupted,
)
from llm.common.config import RunConfig
from llm.problems.tasks import TaskError
from llm.training.checkpoint import (
    CHECKPOINTS,
    ResumePoint,
    RunDirectoryError,
    latest_checkpoint,
    write_atomically,
    write_run_marker,
)
from llm.training.runlock import RunLock
from llm.training.runlock import acquire as acquire_run_lock

EVENTS = "events.jsonl"
"""Crash-related events (start, resume, skipped checkpoints, interrupt); timings differ between
runs, so they are kept out of metrics.jsonl, which an exact resume reproduces bit for bit."""
INTERRUPTED_EXIT_CODE = 130


def fault_message(error: OSError, run_dir: Path, stage: int, saved: str, gone: bool) -> str:
    """One line for a fault in (0-based) stage ``stage``, counted from 1 as progress lines do."""
    stage += 1
    what = error.strerror or type(error).__name__
    where = f" ({error.filename})" if error.filename else ""
    if gone:
        return (
            f"{run_dir}: the run directory was deleted during stage {stage}; the run stopped "
            "and nothing more was written"
        )
    return f"{run_dir}: the run stopped in stage {stage}: {what}{where}; {saved}"


def log_event(run_dir: Path, event: str, **fields: Any) -> None:
    with (run_dir / EVENTS).open("a") as handle:
        handle.write(json.dumps({"event": event, "time": f"{datetime.now():%FT%T}", **fields}))
        handle.write("\n")


def error_line(error: BaseException) -> str:
    """One line for an error: the OS's words and the file for an ``OSError``, else its text."""
    if isinstance(error, OSError):
        where = f" ({error.filename})" if error.filename else ""
        return f"{error.strerror or type(error).__name__}{where}"
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def log_failure(run_dir: Path, error: str, **fields: Any) -> None:
    """A "failed" event with the run's error line, where the disk still allows one."""
    try:
        log_event(run_dir, "failed", **fields, error=error)
    except OSError:
        pass  # the event log cannot be written either: the error message still says it


@contextmanager
def writer_thread_errors_folded() -> Iterator[None]:
    """TensorBoard writes events in a thread of its own; when a write fails there (a full
    disk), the thread would print its traceback and the error then resurfaces in the run's
    next TensorBoard call (or its close), where it ends the run with one message. The thread's
    traceback is left out: the run's one ``error:`` line says it."""
    previous = threading.excepthook

    def hook(args: Any) -> None:
        if isinstance(args.exc_value, OSError) and type(args.thread).__name__ in WRITER_THREADS:
            return
        previous(args)

    threading.excepthook = hook
    try:
        yield
    finally:
        threading.excepthook = previous


WRITER_THREADS = {"_AsyncWriterThread"}
"""Class names of TensorBoard's event-writer threads (``tensorboard.summary.writer``)."""


def require_new_run_directory(run_dir: Path) -> None:
    if run_dir.exists():
        raise RunDirectoryError(
            f"{run_dir}: already exists; continue it with `teamtr train --resume {run_dir}` "
            "or choose another --name"
        )


def create_run_directory(
    run_dir: Path, config: RunConfig, fill: Callable[[Path], None] | None = None
) -> RunLock:
    """Write config and format marker into a temporary directory and rename it into place, so
    that a run directory either exists complete or not at all; it is locked for this process
    before it appears (the lock moves with the directory). ``fill`` writes what else the
    directory must hold when it appears (``teamtr swap``: a checkpoint to continue from)."""
    require_new_run_directory(run_dir)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    temporary = run_dir.with_name(f".{run_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir()
    lock = None
    try:
        lock = acquire_run_lock(temporary)
        config_json = json.dumps(config.to_dict(), indent=2).encode()
        write_atomically(temporary / "config.json", config_json)
        write_run_marker(temporary)
        if fill is not None:
            fill(temporary)
        try:
            os.replace(temporary, run_dir)
        except OSError as error:
            if run_dir.exists():  # another process created it since the check above
                raise RunDirectoryError(
                    f"{run_dir}: created by another process meanwhile; choose another --name"
                ) from None
            raise error from None
    except BaseException:
        if lock is not None:
            lock.release()
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return lock


@contextmanager
def signals_deferred(reraise: bool = True) -> Iterator[None]:
    """Hold SIGINT/SIGTERM while a checkpoint is written, so it is never cut short; a signal
    that arrived meanwhile is raised as KeyboardInterrupt afterwards (if ``reraise``)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = {
        number: signal.signal(number, lambda n, _frame: received.append(n))
        for number in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    if received and reraise:
        raise KeyboardInterrupt


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C: checkpoint and exit cleanly."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(_number: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def directory_identity(path: Path) -> tuple[int, int] | None:
    try:
        status = path.stat()
    except OSError:
        return None
    return status.st_dev, status.st_ino


def record_failure(
    run_dir: Path,
    error: Exception,
    position: dict[str, int],
    point: ResumePoint,
    save: Callable[[ResumePoint], Path],
    writes: bool = True,
) -> None:
    """Save what can be saved after ``error``; an error of the surroundings (``OSError``)
    becomes ``RunFailed`` with one message, any other (a bug) propagates as it is. Only the
    process that ``writes`` the run (rank 0 of a data-parallel run) saves and logs."""
    gone = not run_dir.is_dir()
    saved = "no checkpoint could be written"
    checkpoint = None
    if writes and not gone:
        try:
            checkpoint = save(point).name
            saved = f"state saved in {run_dir / CHECKPOINTS / checkpoint}"
        except OSError:
            newest = latest_checkpoint(run_dir).directory
            if newest is not None:
                saved = f"no new checkpoint could be written; the newest is {newest}"
    message = error_line(error)
    if isinstance(error, OSError):
        message = fault_message(error, run_dir, position["stage"], saved, gone)
        if not gone:
            message += f"; after fixing it, continue with `teamtr train --resume {run_dir}`"
    elif isinstance(error, TaskError) and not gone:
        # The task's own code failed (a reward that raised or returned no number): bad input,
        # not a bug of the run; the stage it stopped in runs again on resume.
        message = (
            f"{message}; the run stopped in stage {position['stage'] + 1}, {saved}; after "
            f"fixing it, continue with `teamtr train --resume {run_dir}`"
        )
    if writes and not gone:
        log_failure(run_dir, message, **position, checkpoint=checkpoint)
    if isinstance(error, OSError):
        raise RunFailed(message) from None
    if isinstance(error, TaskError):
        raise type(error)(message) from error
