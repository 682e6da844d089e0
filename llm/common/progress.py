"""Progress on long work: a live bar on a terminal, one plain line per stage anywhere else.

A bar redraws itself with carriage returns, which in a log file (CI, ``nohup``, ``2> log``)
become one long line of frames; so bars are drawn only when stderr is a terminal, and
otherwise each stage prints one summary line. The libraries' model-loading bars follow the
same rule (``library_bars``); ``--no-progress`` silences everything.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tqdm import tqdm


def on_terminal() -> bool:
    """Whether stderr is a terminal a bar can be drawn on: one that reports no width (a
    pseudo-terminal of size 0x0, as ``script`` or some CI runners make) gets lines instead,
    since a bar of width 0 shows nothing at all."""
    if not sys.stderr.isatty():
        return False
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns > 0
    except (OSError, ValueError):  # no size to ask for (a closed or replaced stream)
        return False


@contextmanager
def library_bars(enabled: bool) -> Iterator[None]:
    """Let the libraries' own loading bars show, or not, for the duration of a model load.

    transformers converts GGUF tensors under a ``tqdm.auto.tqdm`` bar of its own module that
    no flag reaches, so it is swapped for a disabled one while the model loads.
    """
    if enabled:
        yield
        return
    import transformers.modeling_gguf_pytorch_utils as gguf_loading
    from transformers.utils import logging as transformers_logging

    original = gguf_loading.tqdm
    was_enabled = transformers_logging.is_progress_bar_enabled()

    def silent_bar(*args: Any, **kwargs: Any) -> tqdm:
        return original(*args, **{**kwargs, "disable": True})

    gguf_loading.tqdm = silent_bar  # type: ignore[assignment]
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        gguf_loading.tqdm = original
        if was_enabled:
            transformers_logging.enable_progress_bar()


class StageProgress:
    """The progress of a run's stages: counts stages, or, under a time budget, the budget.

    Inside a stage it moves too: ``step`` reports each part of the stage as it ends (the
    sampling, each agent's update, the held-out evaluation) with the fraction of the stage
    done, so that a bar advances by fractions of a stage and a log gets one plain line per
    part, each with an estimate of the time left. ``note`` prints a line that must stay
    (a warning, a held-out result) whatever the mode.
    """

    def __init__(
        self,
        *,
        scheme: str,
        stages: int,
        start_stage: int,
        budget_seconds: float,
        elapsed_seconds: float,
        enabled: bool,
    ) -> None:
        self.stages = stages
        self.budget = budget_seconds
        self.scheme = scheme
        self.enabled = enabled
        self.start_stage = start_stage
        self.started = time.perf_counter()
        """When this process began its stages: estimates count only what it has timed."""
        self.elapsed_at_start = elapsed_seconds
        """The budget's clock when this process began (a resumed run's earlier processes')."""
        self.bar: tqdm | None = None
        if not (enabled and on_terminal()):
            return
        if self.budget > 0:
            # The budget, not ``stages`` (often a large cap), decides when the run ends.
            self.bar = tqdm(
                total=round(self.budget),
                initial=min(round(elapsed_seconds), round(self.budget)),
                unit="s",
                desc=f"{scheme} budget",
                bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} s [{elapsed}<{remaining}{postfix}]",
            )
        else:
            self.bar = tqdm(
                total=stages,
                initial=start_stage,
                desc=f"{scheme} stages",
                bar_format="{l_bar}{bar}| {n:.2f}/{total_fmt} [{elapsed}<{remaining}{postfix}]",
            )

    def label(self, stage: int) -> str:
        """``stage`` (0-based index) as every line names it: 1-based, of the run's stages."""
        return f"{self.scheme} stage {stage + 1}/{self.stages}"

    def time_left(self, stage: int, fraction: float, elapsed_seconds: float) -> str:
        """The run's time left, as a line's last clause ("" before anything is known):
        an estimate from this process's pace so far (the stages and parts it has timed,
        ``stage`` + ``fraction`` done), said as one; under a time budget that would run out
        before the stages do at that pace (or before any pace is known), the budget left
        (``elapsed_seconds`` of it spent), said as the budget. The run ends at whichever
        comes first (``[run] time_budget_minutes``: after the stage that spends it)."""
        done = stage + fraction - self.start_stage
        left = self.stages - stage - fraction
        if self.budget > 0:
            budget_left = max(0.0, self.budget - elapsed_seconds)
            # Both on the budget's clock (wall or CPU): which of the two ends the run.
            spent = elapsed_seconds - self.elapsed_at_start
            if budget_left <= 0:
                return "the time budget is spent: the run ends with this stage"
            if done <= 0 or spent / done * left > budget_left:
                return f"{duration(budget_left)} of the time budget left"
        if done <= 0:
            return ""
        pace = (time.perf_counter() - self.started) / done
        return f"about {duration(pace * left)} left at the pace so far"

    def step(self, stage: int, fraction: float, text: str, elapsed_seconds: float) -> None:
        """A part of stage ``stage`` has ended, ``fraction`` of the stage done (in [0, 1))."""
        if not self.enabled:
            return
        if self.bar is None:
            left = self.time_left(stage, fraction, elapsed_seconds)
            estimate = f"; {left}" if left else ""
            print(f"{self.label(stage)}: {text}{estimate}", file=sys.stderr, flush=True)
            return
        self.bar.set_postfix_str(f"stage {stage + 1}: {text}"[:80])
        self._advance(stage + fraction, elapsed_seconds)

    def note(self, line: str) -> None:
        """A line that stays: above the bar on a terminal, else as it is (even without
        progress, a warning is printed)."""
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)

    def stage_done(
        self,
        stage: int,
        elapsed_seconds: float,
        stage_seconds: float,
        reward: float,
        cert: float,
        detail: str = "",
    ) -> None:
        """Stage ``stage`` has ended; ``detail`` follows the certificate (its parts)."""
        if not self.enabled:
            return
        if self.bar is None:
            budget = (
                f", budget {elapsed_seconds / 60:.1f}/{self.budget / 60:.1f} min"
                if self.budget > 0
                else ""
            )
            left = self.time_left(stage, 1.0, elapsed_seconds)
            estimate = f"; {left}" if left and stage + 1 < self.stages else ""
            print(
                f"{self.label(stage)}: reward {reward:.2f}, certificate {cert:.3g}{detail}, "
                f"{stage_seconds:.1f} s{budget}{estimate}",
                file=sys.stderr,
                flush=True,
            )
            return
        self.bar.set_postfix(stage=stage + 1, reward=f"{reward:.2f}", cert=f"{cert:.3g}")
        self._advance(stage + 1.0, elapsed_seconds)

    def _advance(self, position: float, elapsed_seconds: float) -> None:
        assert self.bar is not None
        if self.budget > 0:
            self.bar.update(max(0, min(round(elapsed_seconds), self.bar.total) - self.bar.n))
        else:
            self.bar.update(max(0.0, min(position, self.stages) - self.bar.n))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def duration(seconds: float) -> str:
    """A time left, as a person reads it: "40 s", "12 min", "3.5 h"."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class CountProgress:
    """Progress over a known count of units (evaluation: generated messages), with an ETA."""

    def __init__(self, total: int, unit: str, desc: str, enabled: bool) -> None:
        self.total = total
        self.desc = desc
        self.unit = unit
        self.enabled = enabled
        self.bar = tqdm(total=total, unit=unit, desc=desc) if enabled and on_terminal() else None

    def advance(self, count: int) -> None:
        if self.bar is not None:
            self.bar.update(count)

    def close(self, summary: str) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled:
            print(f"{self.desc}: {summary}", file=sys.stderr, flush=True)
