"""One process per run directory: an advisory lock held for the life of a run.

``teamtr train`` (new or ``--resume``) takes an exclusive ``flock`` on ``teamtr_run.lock`` in
the run directory before it writes anything there and keeps the descriptor open until it
exits. The kernel releases a ``flock`` when its process ends, however it ends (``kill -9``
included), so a lock file left behind by a dead process never blocks: the next run takes the
lock and notes the stale PID it replaces. A second process finds the lock held and stops with
``RunLockedError`` (exit code 2) naming the holder's PID. Reading a run (``teamtr eval``,
``teamtr swap``) takes no lock.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

from llm.training.checkpoint import RunDirectoryError

LOCK_FILE = "teamtr_run.lock"


class RunLockedError(RunDirectoryError):
    """Another live process holds the run directory's lock."""


@dataclass
class RunLock:
    """A held lock; ``release`` (or the process's exit) lets the next run in."""

    path: Path
    descriptor: int
    stale_pid: int | None
    """The PID written by a process that died holding the lock, if there was one."""

    def release(self) -> None:
        if self.descriptor >= 0:
            os.close(self.descriptor)  # closing the last descriptor releases the flock
            self.descriptor = -1


def _recorded_pid(descriptor: int) -> int | None:
    text = os.pread(descriptor, 64, 0).decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None


def acquire(run_dir: Path) -> RunLock:
    """Lock ``run_dir`` for this process, or raise RunLockedError naming the holder."""
    path = run_dir / LOCK_FILE
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise RunDirectoryError(f"{path}: cannot create the run lock ({error.strerror})") from None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _recorded_pid(descriptor)
        os.close(descriptor)
        who = f"process {holder}" if holder is not None else "another process"
        raise RunLockedError(
            f"{run_dir}: in use by {who} (it holds {LOCK_FILE}); wait for it to finish or stop "
            "it first"
        ) from None
    stale = _recorded_pid(descriptor)
    try:
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)
    except OSError as error:
        os.close(descriptor)
        raise RunDirectoryError(f"{path}: cannot write the run lock ({error.strerror})") from None
    return RunLock(path, descriptor, stale if stale != os.getpid() else None)
