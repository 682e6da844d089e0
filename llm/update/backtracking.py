"""One optimiser step kept inside a trust region: snapshot, step, measure, restore, backtrack.

Shared by the agent update (``llm.update.updater``) and the Stage-0 alignment
(``llm.update.adapter_alignment``): both take Adam steps on LoRA parameters, measure each
candidate, and shrink the step until the measurement is admitted
(``teamtr.trust_region.backtrack``); a step that is never admitted leaves parameters and
optimiser state exactly as they were (a rejected step must not move the policy, nor Adam's
moments, which outlive it).

Every try of one step starts from the same parameters, so its gradient is the same: it is
computed once and reused by every backtrack (bit-identical to recomputing it, since the forward
and backward passes are deterministic), and a backtrack costs only the measurement.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from llm.common import profiling
from teamtr.trust_region import BacktrackResult, TrustRegion, backtrack

MeasurementT = TypeVar("MeasurementT")


class ParameterSnapshot:
    """Parameters and optimiser state, to be put back bit for bit."""

    def __init__(self, parameters: Sequence[torch.nn.Parameter], optimizer: torch.optim.Optimizer):
        with profiling.section("snapshot and restore"):
            self.parameters = list(parameters)
            self.optimizer = optimizer
            self.values = [p.detach().clone() for p in self.parameters]
            self.state: dict[str, Any] = copy.deepcopy(optimizer.state_dict())

    def restore(self) -> None:
        with profiling.section("snapshot and restore"):
            with torch.no_grad():
                for parameter, value in zip(self.parameters, self.values, strict=True):
                    parameter.copy_(value)
            self.optimizer.load_state_dict(copy.deepcopy(self.state))


def backtracked_step(
    parameters: Sequence[torch.nn.Parameter],
    optimizer: torch.optim.Optimizer,
    learning_rate: float,
    accumulate_gradient: Callable[[], None],
    measure: Callable[[], MeasurementT],
    statistic: Callable[[MeasurementT], float],
    trust_region: TrustRegion,
    *,
    shrink: float,
    max_backtracks: int,
    initial_scale: float = 1.0,
    gradient: Sequence[torch.Tensor | None] | None = None,
    reuse_gradient: bool = True,
) -> BacktrackResult[MeasurementT]:
    """One Adam step at ``learning_rate * scale``, shrunk until ``statistic(measure())`` is
    admitted by ``trust_region``; a rejected step restores parameters and optimiser state.

    ``accumulate_gradient`` adds the objective's gradient at the current parameters to their
    ``.grad`` (it may raise to abort the step; the caller restores what it must). ``gradient``,
    when given, is that gradient already computed at the current parameters (e.g. by the pass
    that scored the reference policy); ``reuse_gradient=False`` recomputes it at every try.
    Every try after the first is profiled as ``"backtrack <section>"``.
    """
    saved = ParameterSnapshot(parameters, optimizer)
    if gradient is None and reuse_gradient:
        optimizer.zero_grad(set_to_none=True)
        accumulate_gradient()
        gradient = [None if p.grad is None else p.grad.detach().clone() for p in saved.parameters]

    def propose(scale: float) -> MeasurementT:
        # Every try after the first has a smaller scale (shrink < 1): a backtrack.
        with profiling.prefixed("backtrack " if scale < initial_scale else ""):
            saved.restore()
            for group in optimizer.param_groups:
                group["lr"] = learning_rate * scale
            optimizer.zero_grad(set_to_none=True)
            if gradient is None:  # reuse_gradient=False: the straightforward path
                accumulate_gradient()
            else:
                for parameter, value in zip(saved.parameters, gradient, strict=True):
                    parameter.grad = None if value is None else value.clone()
            with profiling.section("adam step"):
                optimizer.step()
            return measure()

    result = backtrack(
        propose,
        statistic,
        trust_region,
        shrink=shrink,
        max_backtracks=max_backtracks,
        initial_scale=initial_scale,
    )
    if not result.accepted or result.candidate is None:
        saved.restore()  # never keep a step outside the region
    return result
