"""The walk of an update's trust-region steps (THEORY.md §2, Thm 3.4): up to ``steps`` Adam
steps, each one ``llm.update.backtracking.backtracked_step`` shrunk into the region, with the
step size one ``StepSize`` keeps from update to update, and where the walk got to (``Walk``).

A non-finite loss, gradient, KL or surrogate raises ``NonFiniteUpdate`` inside a step; the walk
then ends with no admitted iterate, and the updater puts parameters and optimiser state back.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from llm.common.settings import UpdaterSettings
from llm.update.backtracking import backtracked_step
from teamtr.trust_region import TrustRegion


class NonFiniteUpdate(ArithmeticError):
    """Raised inside an update when ``quantity`` (loss, gradient, kl, surrogate) is not finite."""

    def __init__(self, quantity: str) -> None:
        super().__init__(f"non-finite {quantity}")
        self.quantity = quantity


@dataclass(frozen=True)
class Measurement:
    kl: float
    kl_quantile: float
    surrogate: float
    statistic: float


@dataclass
class Walk:
    """Where an update's trust-region steps got to (``take_steps``)."""

    step_size: StepSize
    last: Measurement | None = None
    """The last admitted iterate's measurement (None: no step admitted)."""
    last_tried: float = math.nan
    """The statistic of the step that could not be brought inside, where one could not."""
    backtracks: int = 0
    steps: int = 0
    non_finite: str | None = None


@dataclass
class StepSize:
    """Where an agent's steps start, as a fraction of ``learning_rate``, and how that moves:
    the whole step-size rule of an update in one place (as scipy's trust-region driver keeps
    its radius rule). A rejected step (no shrink within ``max_backtracks`` fits the region)
    leaves the next update starting where this one gave up; with ``warm_start`` an accepted
    step starts the next one at its own scale; an update that never backtracked tries a step
    ``1 / shrink`` larger next time (at most the full learning rate)."""

    scale: float
    shrink: float
    max_backtracks: int
    warm_start: bool

    def on_accept(self, step_scale: float) -> None:
        if self.warm_start:
            self.scale = step_scale

    def on_reject(self) -> None:
        self.scale *= self.shrink**self.max_backtracks

    def after_update(self, backtracks: int, non_finite: bool) -> float:
        """The scale the agent's next update starts from (1 without ``warm_start``)."""
        if not non_finite and backtracks == 0:
            self.scale = min(1.0, self.scale / self.shrink)
        return self.scale if self.warm_start else 1.0


def take_steps(
    walk: Walk,
    parameters: Sequence[torch.nn.Parameter],
    optimizer: torch.optim.Optimizer,
    settings: UpdaterSettings,
    accumulate_gradient: Callable[[], None],
    measure: Callable[[], Measurement],
    radius: float,
    gradient: list[torch.Tensor | None] | None,
    reuse_gradient: bool,
) -> Walk:
    """Up to ``steps`` Adam steps, each starting where the last admitted one ended (with
    ``warm_start``, at the step size the previous update admitted) and shrunk into the
    region; a step that cannot be ends the walk at the last admitted iterate. ``walk`` starts
    at its step size, and with no step where ``walk.non_finite`` is set already; ``gradient``
    is the first step's, where the reference pass gave it."""
    s = settings
    for _ in range(s.steps if walk.non_finite is None else 0):
        try:
            result = backtracked_step(
                parameters,
                optimizer,
                s.learning_rate,
                accumulate_gradient,
                measure,
                operator.attrgetter("statistic"),
                # No slack: the statistic admitted is the KL reported, never above delta_i
                # (the stage loop then checks it with its own kl_tolerance).
                TrustRegion(radius, tolerance=0.0),
                shrink=s.shrink,
                max_backtracks=s.max_backtracks,
                initial_scale=walk.step_size.scale,
                gradient=gradient,
                reuse_gradient=reuse_gradient,
            )
        except NonFiniteUpdate as event:
            walk.non_finite = event.quantity
            break
        gradient = None  # the next step's gradient is at the new parameters
        walk.backtracks += result.backtracks
        if not result.accepted or result.candidate is None:
            walk.last_tried = result.statistic
            walk.step_size.on_reject()
            break
        walk.steps += 1
        walk.last = result.candidate
        walk.step_size.on_accept(result.step_scale)
    if walk.non_finite is not None:
        walk.last, walk.steps = None, 0
    return walk
