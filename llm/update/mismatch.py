"""The sampler's policy against the trainer's: measured at every update, checked, corrected.

The rollouts of an update are drawn by the generating model (``llm.engines.hf.messages``), whose
recorded log-probs ``log μ(y_t)`` come from cached one-token-at-a-time decoding; the updater
scores the same tokens with the training forward pass over whole transcripts, ``log π(y_t)``.
In float32 the two agree to rounding (|gap| ~ 4e-5 a token on SmolLM2, ``ratio_tolerance``
1e-4). In half precision every matrix product rounds to 8 (bfloat16) or 11 (float16)
significant bits, in a different order in the two computations, and the gap is real: the
training–inference mismatch (Yao et al. 2025, "Your efficient RL framework secretly brings you
off-policy RL training"). This module

- measures it per update (``PolicyMismatch``: max, mean, the share of tokens over the
  tolerance, and the KL(μ || π) per token it amounts to, by the k3 estimator, which is
  non-negative and unbiased for tokens drawn from μ);
- derives the on-policy check's tolerance from the precision (``mismatch_kl_tolerance``): the
  check then refuses rollouts whose sampler is further from the trainer than rounding explains
  (stale rollouts, another temperature), in half precision as in float32;
- corrects the update for the rest (``truncated_weights``): truncated importance sampling,
  w_t = min(π(y_t) / μ(y_t), C), so that the surrogate estimates E_π rather than E_μ.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from llm.models.precision import unit_roundoff

KL_TOLERANCE_FACTOR = 1024.0
"""c in the half-precision tolerance c·u² on the mismatch KL per token (see
``mismatch_kl_tolerance``)."""


def mismatch_kl_tolerance(dtype: torch.dtype) -> float:
    """The largest KL(μ || π) per token that rounding to ``dtype`` explains: c·u², c = 1024.

    Sampling decodes one position at a time from a key/value cache; training runs whole
    transcripts. The two round every matrix product's output to the format's unit roundoff u
    after summing in another order, and the differences compound through the layers into a
    per-token log-prob gap g whose root mean square is a multiple k of u; the KL the two
    distributions lie apart is E[g²]/2 = k²u²/2 (second order in g). The tolerance admits k up
    to √(2c) ≈ 45, several times the k measured on SmolLM2 in bfloat16 (docs/scaling_out.md,
    "Half precision", with ``bench/behaviour_logp_gap.py``): 0.016 nats a token in bfloat16
    (u = 2^-8), 2.4e-4 in float16 (u = 2^-11). A rollout stale by one update of radius δ per
    turn lies ~δ/(tokens per turn) away: refused from δ ≈ 0.016 nats times a turn's tokens in
    bfloat16; below that, the truncated importance weights (``truncated_weights``) correct for
    it as for the rounding.
    """
    return KL_TOLERANCE_FACTOR * unit_roundoff(dtype) ** 2


@dataclass(frozen=True)
class PolicyMismatch:
    """Per message token of one update's batch: the sampler's recorded log-probs against the
    trainer's pre-update pass, g_t = log π(y_t) - log μ(y_t)."""

    tokens: int
    max_gap: float
    """max |g_t| (inf where a gap is NaN)."""
    mean_gap: float
    """mean |g_t|."""
    over_tolerance: float
    """The share of tokens with |g_t| above ``gap_tolerance``."""
    gap_tolerance: float
    """``[updater] ratio_tolerance``: the per-token tolerance of a float32 check."""
    kl: float
    """mean of k3 = e^{g} - 1 - g: KL(μ || π) per token, estimated on tokens drawn from μ."""
    kl_tolerance: float
    """The largest ``kl`` the precision explains (``mismatch_kl_tolerance``); inf in float32,
    where the check is on ``max_gap``."""
    truncated: float = 0.0
    """The share of tokens whose importance weight π/μ was cut at the cap (0 uncorrected)."""

    def as_dict(self) -> dict[str, float]:
        return {
            "tokens": self.tokens,
            "max_gap": self.max_gap,
            "mean_gap": self.mean_gap,
            "over_tolerance": self.over_tolerance,
            "kl": self.kl,
            "truncated": self.truncated,
        }


@dataclass
class MismatchTally:
    """Sums of one update's per-token gaps, chunk by chunk (combined over ranks by the caller)."""

    tokens: int = 0
    largest: float = 0.0
    gap_sum: float = 0.0
    over: int = 0
    kl_sum: float = 0.0
    truncated: int = 0

    def add(self, gap: torch.Tensor, gap_tolerance: float, cap: float | None) -> None:
        """One message's tokens: ``gap`` = log π(y_t) - log μ(y_t), trainer minus sampler."""
        gap = gap.detach().double().cpu()
        if gap.numel() == 0:
            return
        magnitude = gap.abs()
        largest = float(magnitude.max())
        self.largest = max(self.largest, math.inf if math.isnan(largest) else largest)
        self.tokens += gap.numel()
        self.gap_sum += float(magnitude.sum())
        self.over += int((magnitude > gap_tolerance).sum())
        self.kl_sum += float(torch.expm1(gap).sub(gap).sum())  # k3 with ρ = π/μ, y ~ μ
        if cap is not None:
            self.truncated += int((gap > math.log(cap)).sum())

    def result(self, gap_tolerance: float, kl_tolerance: float) -> PolicyMismatch:
        n = max(self.tokens, 1)
        return PolicyMismatch(
            tokens=self.tokens,
            max_gap=self.largest,
            mean_gap=self.gap_sum / n,
            over_tolerance=self.over / n,
            gap_tolerance=gap_tolerance,
            kl=self.kl_sum / n,
            kl_tolerance=kl_tolerance,
            truncated=self.truncated / n,
        )

    def summed(
        self, total: Callable[[float], float], largest: Callable[[float], float]
    ) -> MismatchTally:
        """The tally of the global batch: ``total`` sums a number over the ranks, ``largest``
        takes its maximum (``llm.common.collective.Collective``; identities in one process)."""
        return MismatchTally(
            tokens=int(total(self.tokens)),
            largest=largest(self.largest),
            gap_sum=total(self.gap_sum),
            over=int(total(self.over)),
            kl_sum=total(self.kl_sum),
            truncated=int(total(self.truncated)),
        )


def truncated_weights(
    trainer: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor, cap: float
) -> torch.Tensor:
    """(M, T) truncated importance weights min(π(y_t) / μ(y_t), C), 1 where masked, detached.

    Yao et al.'s truncated importance sampling: the tokens were drawn from μ, so the policy
    gradient of E_π[·] is E_μ[(π/μ) ∇ ...]; truncating at C bounds its variance at the price of
    a bias on the tokens it cuts (their share is ``PolicyMismatch.truncated``).
    """
    log_weight = torch.where(mask, trainer.detach() - sampler, torch.zeros_like(trainer))
    return torch.clamp(log_weight.exp(), max=cap)


def laid_out(
    recorded: dict[tuple[int, int], torch.Tensor],
    refs: tuple[tuple[int, int], ...],
    mask: torch.Tensor,
) -> torch.Tensor:
    """(M, T) the recorded log-probs of the messages ``refs`` in a ``MessageBatch``'s layout
    (message m's tokens at the first positions of row m, 0 where masked)."""
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    for row, ref in enumerate(refs):
        logps = recorded[ref]
        out[row, : len(logps)] = logps.to(out.device, torch.float32)
    return out


def message_weights_of(
    trainer: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor, cap: float
) -> torch.Tensor:
    """(M,) min(π(y)/μ(y), C) of each whole message y (the product of its tokens' ratios),
    detached: the importance weight of the surrogate L̂_i, whose ratio is per message."""
    log_weight = torch.where(mask, trainer.detach() - sampler, torch.zeros_like(trainer))
    return torch.clamp(log_weight.sum(dim=-1).exp(), max=cap)
