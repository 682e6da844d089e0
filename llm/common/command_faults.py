"""The faults a ``teamtr`` command ends on with an exit code of its own (``docs/runs.md``),
and where a torchrun rank stands: defined apart from the modules that raise them (model loading,
checkpoints, the distributed world, the stage loop), which import torch, so that the CLI can
catch them, and a bad argument or config end the command, without importing torch (an error
line in 0.5 s, not 5). Each raising module imports its class from here; the names stay
importable from there too.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


class ModelNotAvailableError(RuntimeError):
    """No model could be found for a source; the message lists what was tried (exit 2)."""


class IncompatibleTeamError(ValueError):
    """The agents of a heterogeneous team cannot share one transcript (exit 2)."""


class RunDirectoryError(ValueError):
    """A run directory or checkpoint cannot be used; the message names the path and why
    (exit 2)."""


class DistributedSetupError(ValueError):
    """The processes cannot form (or continue) a run (exit 2)."""


class RunFailed(Exception):
    """The run stopped on a fault of its surroundings (a full disk, its directory deleted, a
    path it cannot write); a "failed" event and a checkpoint were written where possible. The
    CLI prints the message and exits with code 1."""


class TrainingInterrupted(Exception):
    """SIGINT or SIGTERM stopped the run; its state was saved in ``checkpoint`` (exit 130)."""

    def __init__(self, run_dir: Path, checkpoint: Path) -> None:
        super().__init__(f"interrupted; state saved in {checkpoint}")
        self.run_dir = run_dir
        self.checkpoint = checkpoint


def launched_by_torchrun(environ: dict[str, str] | None = None) -> bool:
    """Whether this process is one rank of a torch.distributed launch (or claims to be)."""
    environ = dict(os.environ) if environ is None else environ
    return any(name in environ for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def rank_from_environment() -> int:
    """This process's rank as torchrun announces it (0 outside a launch, or if unreadable)."""
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


PEER_REPORT_WAIT_S = 60.0
"""How long a rank other than 0 that found bad input waits for torchrun to end it."""


def leave_the_report_to_rank_zero() -> None:
    """On a rank other than 0 of a torchrun launch that found bad input, wait to be terminated.

    Every rank runs the same checks, but torchrun's agent terminates all ranks as soon as one
    exits: a rank that exits first (it imported torch sooner) cuts rank 0 off before rank 0 says
    why. Waiting here lets rank 0 report and exit first; the agent then ends this process. The
    wait is bounded so that a rank 0 which passed the checks (it cannot know a peer failed)
    stops at the latest ``PEER_REPORT_WAIT_S`` later, when this rank exits and the agent ends it.
    """
    # TORCHELASTIC_RUN_ID is set by torchrun's agent only, not by a hand-made environment.
    if rank_from_environment() == 0 or "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    time.sleep(PEER_REPORT_WAIT_S)
