"""Progress on long work: a live bar on a terminal, one plain line per stage anywhere else.

A bar redraws itself with carriage returns, which in a log file (CI, ``nohup``, ``2> log``)
become one long line of frames; so bars are drawn only when stderr is a terminal, and
otherwise each stage prints one summary line. The libraries' model-loading bars follow the
same rule (``library_bars``); ``--no-progress`` silences everything.
"""

from __future__ import annotations

import os
import sys
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
    """The progress of a run's stages: counts stages, or, under a time budget, the budget."""

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
            self.bar = tqdm(total=stages, initial=start_stage, desc=f"{scheme} stages")

    def stage_done(
        self, stage: int, elapsed_seconds: float, stage_seconds: float, reward: float, cert: float
    ) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            budget = (
                f", budget {elapsed_seconds / 60:.1f}/{self.budget / 60:.1f} min"
                if self.budget > 0
                else ""
            )
            print(
                f"{self.scheme} stage {stage + 1}/{self.stages}: reward {reward:.2f}, "
                f"certificate {cert:.3g}, {stage_seconds:.1f} s{budget}",
                file=sys.stderr,
                flush=True,
            )
            return
        self.bar.set_postfix(stage=stage + 1, reward=f"{reward:.2f}", cert=f"{cert:.3g}")
        if self.budget > 0:
            self.bar.update(max(0, min(round(elapsed_seconds), self.bar.total) - self.bar.n))
        else:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


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
