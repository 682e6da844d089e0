"""The pre-update policy on an agent's batch: what every ratio and KL of an update is measured
against (THEORY.md §2, Thm 3.4), the advantages its surrogate weighs, and the check that the
ratio is 1 there before any step.

``TrustRegionUpdater._reference_pass`` scores every chunk once at the pre-update parameters
(``Reference``; all of them with the first step's gradient, ``ReferencePass``).
``check_on_policy`` then holds those log-probs against the behaviour log-probs: every token to
``ratio_tolerance`` in float32, the sampler's recorded log-probs within what rounding explains in
half precision (``llm.update.mismatch``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from llm.common.collective import Collective
from llm.logprobs.scoring import MessageBatch
from llm.models.precision import is_half
from llm.sampling.rollouts import DialogueRollouts
from llm.update.mismatch import (
    MismatchTally,
    PolicyMismatch,
    laid_out,
    message_weights_of,
    mismatch_kl_tolerance,
    truncated_weights,
)


class RatioCheckError(AssertionError):
    """Before an update the new/old ratio must be 1: the rollouts' behaviour log-probs do not
    match the agent's policy (stale rollouts, a different temperature, or dropout)."""


@dataclass
class Reference:
    """The pre-update policy on one chunk: what every KL and ratio is measured against."""

    indices: list[int]
    batch: MessageBatch
    logps: torch.Tensor
    advantages: torch.Tensor
    log_probs: torch.Tensor | None = None
    """(M, T, V) log-softmax of ``batch.logits``, kept once per update (None: recompute it)."""
    message_weights: torch.Tensor | None = None
    """(M,) min(π/μ, C) of each whole message where the update corrects for the sampler's
    policy μ (``llm.update.mismatch``): the surrogate L̂_i's importance weight; None: 1."""

    def vocabulary_log_probs(self) -> torch.Tensor:
        return self.batch.log_probs() if self.log_probs is None else self.log_probs

    @property
    def has_signal(self) -> bool:
        """False when every (weighted) advantage of the chunk is 0: its clipped surrogate is
        0 x ratio whatever the parameters, so its gradient is exactly 0 and computing it can
        be skipped. Dynamic sampling's filler groups (no reward difference) are such chunks."""
        return bool(self.advantages.any())


@dataclass(frozen=True)
class ReferencePass:
    """What one pass over the batch at the pre-update parameters gives
    (``TrustRegionUpdater._reference_pass``)."""

    chunks: list[Reference]
    n_tokens: int
    """The agent's message tokens in the global batch (the pooled token mean's denominator)."""
    first_gradient: list[torch.Tensor | None] | None
    """The first step's gradient, summed over ranks (``reuse_work`` and signal; else None)."""
    non_finite: str | None
    """``"loss"`` or ``"gradient"`` when the first step's was not finite (the update is then
    rejected before any step)."""


def weighted_advantages(
    rollouts: DialogueRollouts,
    weights: np.ndarray,
    batch: MessageBatch,
    logps: torch.Tensor,
    sampled: dict[tuple[int, int], torch.Tensor] | None,
    cap: float | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each message's advantage times its episode's weight; with a correction ``cap`` C, each
    token's further weighted by min(π/μ, C) against the ``sampled`` log-probs μ (truncated
    importance sampling, ``llm.update.mismatch``), and the messages' weights beside."""
    advantages = torch.tensor(
        [rollouts.advantages[e] * weights[e] for e, _ in batch.refs],
        dtype=torch.float32,
        device=logps.device,
    )
    if cap is None or sampled is None:
        return advantages, None
    recorded = laid_out(sampled, batch.refs, batch.mask)
    token_weights = truncated_weights(logps, recorded, batch.mask, cap)
    return (
        advantages.unsqueeze(-1) * token_weights,
        message_weights_of(logps, recorded, batch.mask, cap),
    )


def check_on_policy(
    agent: int,
    chunks: list[Reference],
    behaviour: dict[tuple[int, int], torch.Tensor],
    recorded: bool,
    precision: torch.dtype,
    cap: float | None,
    tolerance: float,
    collective: Collective,
) -> PolicyMismatch | None:
    """Before any step the new/old ratio must be 1: the reference pass's log-probs of every
    message equal the behaviour log-probs (else ``RatioCheckError``: stale rollouts,
    another temperature, dropout). In float32, every token to ``ratio_tolerance``; in half
    precision the sampler's recorded log-probs, whose KL from the trainer's per token must
    lie within what rounding explains (``llm.update.mismatch.mismatch_kl_tolerance``).
    Checked once all ranks have scored their shard, so that all of them raise together.
    Returns the sampler's mismatch where ``behaviour`` is what the sampler recorded (else
    None: the behaviour log-probs are the trainer's own)."""
    half = is_half(precision)
    worst = (0.0, "")
    tally = MismatchTally()
    for chunk in chunks:
        for row, (e, t) in enumerate(chunk.batch.refs):
            now = chunk.logps[row][chunk.batch.mask[row]]
            gaps = now - behaviour[(e, t)].to(now.device)
            gap = float(gaps.abs().max())
            if math.isnan(gap):  # NaN > tolerance is False: count it as infinitely far
                gap = math.inf
            if gap > worst[0]:
                worst = (gap, f"agent {agent}, episode {e}, turn {t}")
            if recorded:
                tally.add(gaps, tolerance, cap)
    largest = collective.max(worst[0])
    mismatch = None
    if recorded:
        kl_tolerance = mismatch_kl_tolerance(precision) if half else math.inf
        together = tally.summed(collective.sum, collective.max)
        mismatch = together.result(tolerance, kl_tolerance)
    if half and mismatch is not None:
        if not mismatch.kl <= mismatch.kl_tolerance:  # NaN included
            raise RatioCheckError(
                f"agent {agent}: the sampler's log-probs lie KL {mismatch.kl:.3g} nats a token "
                f"from the trainer's before the update, above the {mismatch.kl_tolerance:.3g} "
                f"that rounding to {str(precision).removeprefix('torch.')} explains "
                "(stale rollouts?)"
            )
        return mismatch
    if not largest <= tolerance:  # NaN included
        where = worst[1] if worst[0] == largest else f"agent {agent}, on another rank"
        raise RatioCheckError(
            f"{where}: |log new - log old| = {largest:.3g} before the update (ratio must be 1)"
        )
    return mismatch
