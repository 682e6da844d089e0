"""Where a run's scalars go: ``[run] report_to``, TensorBoard (the default) and trackio.

Every tracker takes the same keys, one value per stage: ``stage/<name>`` (the stage's own),
``agent<k>/<name>`` (each agent's update), ``eval/<name>`` (the held-out evaluation),
as ``llm.training.stages.records.log_scalars`` writes them through ``add_scalar(tag, value, step)``.

- ``tensorboard``: event files in ``<run>/tensorboard`` (a stage run again, after a resume,
  replaces its points: ``purge_step``).
- ``trackio`` (``pip install 'teamtr[trackio]'``): local, no account; the project ``teamtr``,
  one run per run directory (its name), in trackio's folder (``$TRACKIO_DIR``, default
  ``~/.cache/huggingface/trackio``); ``trackio show --project teamtr`` draws it. A resumed run
  goes on in the same trackio run. The scalars of one stage are one ``trackio.log`` call.

Nothing a checkpoint holds is lost to a crash: a stage's scalars are flushed (``flush``) before
its checkpoint is written, and a resumed run logs again, to each tracker that had not stored
them (``behind``), the checkpoint's stages: trackio writes from a thread, so a SIGKILL right
after a checkpoint can still take the last row it was handed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any

TRACKERS = ("tensorboard", "trackio")
"""The values ``[run] report_to`` takes."""
TRACKIO_PROJECT = "teamtr"


class TrackerMissing(RuntimeError):
    """A tracker of ``report_to`` whose library is not installed."""


class NoWriter:
    """Takes the scalars and keeps none (ranks other than 0, or no tracker at all)."""

    def add_scalar(self, *_args: Any) -> None:
        pass

    def flush(self) -> None:
        pass

    def behind(self, _step: int) -> NoWriter:
        return self

    def close(self) -> None:
        pass


class TrackioWriter:
    """``add_scalar`` for trackio: the scalars of one step gathered, logged as one row when the
    step changes or the run closes."""

    def __init__(self, run_name: str, resumed: bool) -> None:
        try:
            import trackio
        except ImportError:
            raise TrackerMissing(
                "[run] report_to: trackio is not installed (pip install 'teamtr[trackio]')"
            ) from None
        self._trackio = trackio
        self._run = trackio.init(
            project=TRACKIO_PROJECT,
            name=run_name,
            resume="allow" if resumed else "never",
            embed=False,
            auto_log_gpu=False,
            auto_log_cpu=False,
        )
        self._step: int | None = None
        self._row: dict[str, float] = {}
        self.stored_through = _last_stored_step(run_name) if resumed else 0
        """The last step trackio had stored for this run when it was opened (0: none; None:
        unknown, so nothing is logged again)."""

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        if step != self._step:
            self.flush()
            self._step = step
        self._row[tag] = float(value)

    def flush(self) -> None:
        """The gathered step as one row, handed to trackio (which stores it from a thread)."""
        if self._row:
            self._run.log(self._row, step=self._step)
            self._row = {}

    def close(self) -> None:
        self.flush()
        self._run.finish()


def _last_stored_step(run_name: str) -> int | None:
    """The largest step trackio's local store holds for ``run_name`` (0 if none), read as
    ``trackio.init`` reads it to resume a run; None where this trackio reads it otherwise (a
    store that moved): a resumed run then logs nothing again rather than fail."""
    try:
        from trackio.sqlite_storage import SQLiteStorage

        return SQLiteStorage.get_max_step_for_run(TRACKIO_PROJECT, run_name) or 0
    except (ImportError, AttributeError):
        return None


class Writers:
    """One ``add_scalar`` to every tracker; closed together."""

    def __init__(self, writers: Sequence[Any]) -> None:
        self.writers = tuple(writers)

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        for writer in self.writers:
            writer.add_scalar(tag, value, step)

    def flush(self) -> None:
        """Every tracker's scalars so far out of this process (before a checkpoint)."""
        for writer in self.writers:
            writer.flush()

    def behind(self, step: int) -> Writers:
        """The trackers that had not stored ``step`` when they were opened: trackio's from its
        store; TensorBoard's are never behind, since its points are flushed before the
        checkpoint of their stage is written (and ``purge_step`` drops those after it)."""
        return Writers(
            [
                w
                for w in self.writers
                if isinstance(w, TrackioWriter)
                and w.stored_through is not None
                and w.stored_through < step
            ]
        )

    def close(self) -> None:
        for writer in self.writers:
            writer.close()


def check_trackers(report_to: Sequence[str]) -> None:
    """A ``TrackerMissing`` naming the first tracker whose library is absent (before a run
    starts, so that a missing library never costs a stage)."""
    import importlib.util

    for name in report_to:
        if name == "trackio" and importlib.util.find_spec("trackio") is None:
            raise TrackerMissing(
                "[run] report_to: trackio is not installed (pip install 'teamtr[trackio]')"
            )


def _writer(name: str, run_dir: Path, start_stage: int) -> Any:
    if name == "tensorboard":
        from torch.utils.tensorboard import SummaryWriter

        # purge_step drops TensorBoard points of stages that are about to be run again: the
        # (start_stage + 1)-th stage onwards, logged at step start_stage + 1 onwards.
        purge = start_stage + 1 if start_stage else None
        return SummaryWriter(str(run_dir / "tensorboard"), purge_step=purge)
    return TrackioWriter(run_dir.name, resumed=start_stage > 0)


@contextmanager
def open_trackers(
    run_dir: Path, report_to: Sequence[str], start_stage: int, writes: bool
) -> Iterator[Any]:
    """The run's trackers as one writer. Closed on leaving: at the end of a run, inside the
    run's error handling, so that a write that failed in a writer's thread (a full disk) is the
    run's one error, before "finished"; after an error, quietly (that error is reported)."""
    if not writes:
        yield NoWriter()
        return
    with ExitStack() as opening:
        writers = []
        for name in report_to:
            writer = _writer(name, run_dir, start_stage)
            opening.callback(_quietly_closed, writer)  # a later writer failing closes this one
            writers.append(writer)
        opening.pop_all()
    writer = Writers(writers)
    try:
        yield writer
    except BaseException:
        for each in writers:
            _quietly_closed(each)
        raise
    writer.close()


def _quietly_closed(writer: Any) -> None:
    with suppress(OSError):  # its directory is gone or full: the failure is reported
        writer.close()
