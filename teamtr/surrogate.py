"""Surrogate objectives: the exact L_i of Theorem 3.4 and its sampled, clipped counterpart.

``exact_surrogate`` is the quantity the bounds are stated for (tabular world). The
language-model updater optimises ``clipped_surrogate`` on ``group_normalised_advantages``
(GRPO style) and logs it as the estimate L_hat_i of the certificate proxy (THEORY.md §2).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]


def group_normalised_advantages(
    rewards: ArrayLike, group_size: int, a_max: float, eps: float = 1e-6
) -> FloatArray:
    """GRPO advantages: per group, (r - mean) / (std + eps), clipped to [-a_max, a_max].

    ``rewards`` is flat, groups are contiguous: entries ``g*group_size .. (g+1)*group_size-1``
    are the completions of prompt ``g``. ``std`` is the population standard deviation
    (``ddof=0``) so a group's advantages have unit variance before clipping. The clip makes
    the declared ``a_max`` a true bound, as the certificate proxy requires (THEORY.md §2).
    A group whose rewards are all equal gets zero advantages.
    """
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 1:
        raise ValueError(f"rewards must be one-dimensional, got shape {r.shape}")
    if isinstance(group_size, bool) or not isinstance(group_size, int | np.integer):
        raise ValueError(f"group_size must be an integer >= 2, got {group_size!r}")
    if group_size < 2:
        raise ValueError(
            f"group_size must be >= 2 (a group of one has no baseline), got {group_size}"
        )
    if r.size % group_size != 0:
        raise ValueError(f"len(rewards) = {r.size} is not a multiple of group_size = {group_size}")
    if not (math.isfinite(a_max) and a_max > 0):
        raise ValueError(f"a_max must be finite and > 0, got {a_max!r}")
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be finite and >= 0, got {eps!r}")
    if not np.all(np.isfinite(r)):
        raise ValueError("rewards must be finite")
    groups = r.reshape(-1, group_size)
    centred = groups - groups.mean(axis=1, keepdims=True)
    std = groups.std(axis=1, keepdims=True)
    # With eps = 0 a constant group would divide 0 by 0; its advantages are 0 by definition.
    denom = np.where(std + eps > 0, std + eps, 1.0)
    advantages = np.clip(centred / denom, -a_max, a_max)
    out: FloatArray = advantages.reshape(r.shape)
    return out


def clipped_surrogate(
    logp_new: ArrayLike,
    logp_old: ArrayLike,
    advantages: ArrayLike,
    mask: ArrayLike,
    clip_eps: float,
) -> float:
    """PPO clipped objective, per token, averaged over the masked tokens (to be maximised).

    Per token: ``min(rho A, clip(rho, 1-clip_eps, 1+clip_eps) A)`` with
    ``rho = exp(logp_new - logp_old)``. ``logp_*`` and ``mask`` have shape ``(B, T)``;
    ``advantages`` is per sequence, shape ``(B,)``, broadcast over its tokens (or already
    ``(B, T)``). The average is pooled over all masked tokens of the batch.
    """
    new = np.asarray(logp_new, dtype=np.float64)
    old = np.asarray(logp_old, dtype=np.float64)
    keep = np.asarray(mask).astype(bool)
    adv = np.asarray(advantages, dtype=np.float64)
    if new.shape != old.shape or new.shape != keep.shape:
        raise ValueError(
            "logp_new, logp_old and mask must share one shape, got "
            f"{new.shape}, {old.shape}, {keep.shape}"
        )
    if adv.shape == new.shape[:1] and new.ndim >= 1:
        adv = adv.reshape(adv.shape + (1,) * (new.ndim - 1))
    elif adv.shape != new.shape:
        raise ValueError(
            f"advantages must have shape {new.shape[:1]} (per sequence) or {new.shape} "
            f"(per token), got {adv.shape}"
        )
    if not (math.isfinite(clip_eps) and clip_eps > 0):
        raise ValueError(f"clip_eps must be finite and > 0, got {clip_eps!r}")
    n_tokens = int(keep.sum())
    if n_tokens == 0:
        raise ValueError("mask selects no tokens: the surrogate of an empty batch is undefined")
    # Padding positions may hold -inf log-probs; keep them out of exp().
    log_ratio = np.where(keep, new - old, 0.0)
    ratio = np.exp(log_ratio)
    unclipped = ratio * adv
    clipped = np.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv
    per_token = np.minimum(unclipped, clipped)
    return float(np.sum(np.where(keep, per_token, 0.0)) / n_tokens)


def exact_surrogate(
    new_policy: ArrayLike, advantage: ArrayLike, occupancy: ArrayLike, scale: float
) -> float:
    """L_i of Theorem 3.4: ``scale * sum_s d(s) sum_a pi'(a|s) A(s,a)``.

    ``new_policy`` and ``advantage`` are S x A tables (the advantage of the team the update
    starts from, pi_hat^{i-1}), ``occupancy`` is that team's d (length S). ``scale`` is
    ``1/(1-gamma)`` in the discounted case, so L_i is in units of J; in the episodic case pass
    the horizon H with d the average of the per-step marginals.
    """
    pi = np.asarray(new_policy, dtype=np.float64)
    adv = np.asarray(advantage, dtype=np.float64)
    d = np.asarray(occupancy, dtype=np.float64)
    if pi.shape != adv.shape or pi.ndim != 2:
        raise ValueError(
            f"new_policy and advantage must be S x A tables of one shape, got {pi.shape} "
            f"and {adv.shape}"
        )
    if d.shape != pi.shape[:1]:
        raise ValueError(f"occupancy must have shape {pi.shape[:1]}, got {d.shape}")
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale!r}")
    return float(scale * np.dot(d, np.sum(pi * adv, axis=1)))
