"""Torch versions of the core's divergence and surrogate functions, under the same names.

``teamtr.divergence`` and ``teamtr.surrogate`` define the quantities in numpy; the updater
needs them differentiable and on batches of logits, so they are mirrored here and a test
asserts both agree on the same inputs. Shapes follow the core: the vocabulary is the last axis,
``(B, T)`` batches of per-token values with a ``(B, T)`` mask of the tokens that count.

Per-token KL estimates for the trust region (THEORY.md §2, Lemma 3.1) are built on rollout
tokens y ~ old. ``"forward"`` = KL(old || new) is then a plain sum along the message;
``"reverse"`` = KL(new || old) needs the message prefix drawn from new, so each token's term is
weighted by the prefix ratio prod_{s<t} new/old (and, for sampled estimators, the token's own
ratio): unbiased for the message KL by the tower property.
"""

from __future__ import annotations

import math

import torch

from llm.common.settings import DIRECTIONS, ESTIMATORS, Direction, Estimator

_K3_SERIES_CUTOFF = 1e-2  # same cut-off as teamtr.divergence.k3_estimator


def at_least_float32(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in float32 if it is in a narrower floating type, else as it is."""
    if tensor.dtype in (torch.float16, torch.bfloat16):
        return tensor.float()
    return tensor


def log_softmax(logits: torch.Tensor, axis: int = -1) -> torch.Tensor:
    return torch.log_softmax(logits, dim=axis)


def kl(p: torch.Tensor, q: torch.Tensor, axis: int = -1) -> torch.Tensor:
    """Exact KL(p || q) of probability vectors along ``axis``, with 0 log 0 = 0."""
    positive = p > 0
    safe_p = torch.where(positive, p, torch.ones_like(p))
    terms = torch.where(positive, p * (torch.log(safe_p) - torch.log(q)), torch.zeros_like(p))
    return terms.sum(dim=axis)


def tv(p: torch.Tensor, q: torch.Tensor, axis: int = -1) -> torch.Tensor:
    return 0.5 * (p - q).abs().sum(dim=axis)


def token_kl_from_logits(logits_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    """Exact per-token KL(p || q) over the vocabulary, in log space. ``(..., V) -> (...)``."""
    return token_kl_from_log_probs(
        torch.log_softmax(logits_p, dim=-1), torch.log_softmax(logits_q, dim=-1)
    )


def token_kl_from_log_probs(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """``token_kl_from_logits`` on log-probabilities already normalised over the vocabulary."""
    p = logp.exp()
    terms = torch.where(p > 0, p * (logp - logq), torch.zeros_like(p))
    return terms.sum(dim=-1)


def token_tv_from_logits(logits_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    """Exact per-token TV over the vocabulary. ``(..., V) -> (...)``."""
    return tv(torch.softmax(logits_p, dim=-1), torch.softmax(logits_q, dim=-1))


def k1_estimator(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """log p(y) - log q(y), y ~ p: unbiased for KL(p || q)."""
    return logp - logq


def k2_estimator(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    diff = logp - logq
    return 0.5 * diff * diff


def k3_estimator(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """rho - 1 - log rho with rho = q(y)/p(y), y ~ p: non-negative, unbiased for KL(p || q)."""
    x = logq - logp
    small = x.abs() < _K3_SERIES_CUTOFF
    xs = torch.where(small, x, torch.zeros_like(x))
    series = xs * xs * (0.5 + xs * (1 / 6 + xs * (1 / 24 + xs * (1 / 120 + xs / 720))))
    return torch.where(small, series, torch.expm1(x) - x)


def message_kl_from_token_kls(token_kls: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of per-token KL terms over each message's own tokens (Lemma 3.1, chain rule)."""
    if mask.shape != token_kls.shape:
        raise ValueError(f"mask must have shape {tuple(token_kls.shape)}, got {tuple(mask.shape)}")
    keep = mask.bool()
    return torch.where(keep, token_kls, torch.zeros_like(token_kls)).sum(dim=-1)


def group_normalised_advantages(
    rewards: torch.Tensor, group_size: int, a_max: float, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO advantages per contiguous group: (r - mean) / (std + eps), clipped to ±a_max."""
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be one-dimensional, got shape {tuple(rewards.shape)}")
    if group_size < 2:
        raise ValueError(
            f"group_size must be >= 2 (a group of one has no baseline), got {group_size}"
        )
    if rewards.numel() % group_size != 0:
        raise ValueError(f"len(rewards) = {rewards.numel()} is not a multiple of {group_size}")
    if not (math.isfinite(a_max) and a_max > 0):
        raise ValueError(f"a_max must be finite and > 0, got {a_max!r}")
    groups = rewards.to(torch.float64).reshape(-1, group_size)
    centred = groups - groups.mean(dim=1, keepdim=True)
    std = groups.std(dim=1, keepdim=True, unbiased=False)
    denom = torch.where(std + eps > 0, std + eps, torch.ones_like(std))
    return torch.clamp(centred / denom, -a_max, a_max).reshape(rewards.shape)


def clipped_surrogate(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
) -> torch.Tensor:
    """PPO clipped objective averaged over the masked tokens (to be maximised); differentiable.

    ``advantages`` is per sequence ``(B,)`` or per token ``(B, T)``.
    """
    if logp_new.shape != logp_old.shape or logp_new.shape != mask.shape:
        raise ValueError("logp_new, logp_old and mask must share one shape")
    adv = advantages
    if adv.shape == logp_new.shape[:1]:
        adv = adv.reshape(adv.shape + (1,) * (logp_new.ndim - 1))
    keep = mask.bool()
    n_tokens = int(keep.sum())
    if n_tokens == 0:
        raise ValueError("mask selects no tokens: the surrogate of an empty batch is undefined")
    log_ratio = torch.where(keep, logp_new - logp_old, torch.zeros_like(logp_new))
    ratio = log_ratio.exp()
    per_token = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
    return torch.where(keep, per_token, torch.zeros_like(per_token)).sum() / n_tokens


def per_token_kl(
    logits_new: torch.Tensor,
    logits_old: torch.Tensor,
    tokens: torch.Tensor,
    mask: torch.Tensor,
    *,
    estimator: Estimator = "exact",
    direction: Direction = "reverse",
) -> torch.Tensor:
    """Per-token KL terms ``(B, T)`` whose masked sum over a message estimates the message KL.

    ``logits_*`` are ``(B, T, V)``: the logits that predicted ``tokens`` ``(B, T)``, which were
    sampled from the old policy. See the module docstring for the reverse-direction weights.
    """
    # At least float32 whatever the model's dtype: the KLs the trust region admits are a few
    # 1e-3 nats spread over the whole vocabulary, below bfloat16's resolution (float32 and
    # float64 logits are used as they are).
    logits_new, logits_old = at_least_float32(logits_new), at_least_float32(logits_old)
    return per_token_kl_from_log_probs(
        torch.log_softmax(logits_new, dim=-1),
        torch.log_softmax(logits_old, dim=-1),
        tokens,
        mask,
        estimator=estimator,
        direction=direction,
    )


def per_token_kl_from_log_probs(
    log_probs_new: torch.Tensor,
    log_probs_old: torch.Tensor,
    tokens: torch.Tensor,
    mask: torch.Tensor,
    *,
    estimator: Estimator = "exact",
    direction: Direction = "reverse",
) -> torch.Tensor:
    """``per_token_kl`` on vocabulary log-probabilities ``(B, T, V)`` (log-softmax already
    taken): the old policy's can then be computed once per update and reused at every step."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    log_probs_new, log_probs_old = at_least_float32(log_probs_new), at_least_float32(log_probs_old)
    keep = mask.bool()
    logp_new = log_probs_new.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    logp_old = log_probs_old.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    log_ratio = torch.where(keep, logp_new - logp_old, torch.zeros_like(logp_new))
    if direction == "forward":
        if estimator == "exact":
            terms = token_kl_from_log_probs(log_probs_old, log_probs_new)
        elif estimator == "k1":
            terms = k1_estimator(logp_old, logp_new)
        else:
            terms = k3_estimator(logp_old, logp_new)
    else:
        # log prod_{s<t} r_s: the ratio of the message prefix before token t.
        prefix = torch.cumsum(log_ratio, dim=-1) - log_ratio
        if estimator == "exact":
            terms = prefix.exp() * token_kl_from_log_probs(log_probs_new, log_probs_old)
        elif estimator == "k1":
            terms = (prefix + log_ratio).exp() * k1_estimator(logp_new, logp_old)
        else:
            terms = (prefix + log_ratio).exp() * k3_estimator(logp_new, logp_old)
    return torch.where(keep, terms, torch.zeros_like(terms))
