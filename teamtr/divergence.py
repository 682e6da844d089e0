"""Divergences between action distributions, per state and per token (THEORY.md §1-2).

Every function works on numpy arrays whose trailing axis (``axis=-1`` by default) is the
action or vocabulary axis; leading axes are states, batch rows or token positions. The
language-model backend mirrors these functions in torch under the same names.

Conventions, all exact:

- ``TV(p, q) = 1/2 ||p - q||_1``.
- ``KL(p || q) = sum_a p(a) log(p(a)/q(a))`` with ``0 log 0 = 0`` and ``+inf`` where
  ``q(a) = 0 < p(a)``.
- Pinsker: ``TV(p, q) <= sqrt(KL(p || q) / 2)`` in either direction.
- Lemma 3.1 (chain rule): a message's KL is the expected sum of its per-token KLs, so a
  trust region on messages is monitored from per-token quantities on sampled rollouts.
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]

KLDirection = Literal["reverse", "forward"]
"""Which KL a trust region constrains: ``"reverse"`` = KL(new || old), ``"forward"`` =
KL(old || new). The tabular exact update supports both (ARCHITECTURE.md, "The tabular world")."""

KL_DIRECTIONS: tuple[str, ...] = get_args(KLDirection)

# Below this |log ratio| the k3 estimator is evaluated by its Taylor series: expm1(x) - x
# loses relative accuracy ~1e-16/|x| to cancellation, the series does not.
_K3_SERIES_CUTOFF = 1e-2


def _as_float(x: ArrayLike) -> FloatArray:
    return np.asarray(x, dtype=np.float64)


def log_softmax(logits: ArrayLike, axis: int = -1) -> FloatArray:
    """Numerically stable ``log softmax`` along ``axis``.

    ``-inf`` logits (masked entries) give ``-inf`` log-probabilities; a row whose logits are
    all ``-inf`` has no distribution and yields ``nan``.
    """
    x = _as_float(logits)
    shift = np.max(x, axis=axis, keepdims=True)
    # A row of all -inf has shift -inf; keep the subtraction finite so the row becomes nan
    # through log(0) below rather than through inf - inf warnings.
    shift = np.where(np.isfinite(shift), shift, 0.0)
    shifted = x - shift
    with np.errstate(divide="ignore", invalid="ignore"):
        log_norm = np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))
        out: FloatArray = shifted - log_norm
    return out


def kl(p: ArrayLike, q: ArrayLike, axis: int = -1) -> FloatArray:
    """Exact KL(p || q) along ``axis`` (per row), with ``0 log 0 = 0``.

    Returns ``+inf`` in rows where some ``q(a) = 0 < p(a)``. Inputs are probability vectors
    (non-negative, summing to one along ``axis``); they are not renormalised. The result is
    clipped at 0 from below (rounding only).
    """
    p_arr, q_arr = np.broadcast_arrays(_as_float(p), _as_float(q))
    positive = p_arr > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        log_ratio = np.log(np.where(positive, p_arr, 1.0)) - np.log(q_arr)
        terms = np.where(positive, p_arr * log_ratio, 0.0)
    # KL >= 0; rounding can leave -1e-17 when p ~ q, which would break sqrt(KL/2) downstream.
    out: FloatArray = np.maximum(np.sum(terms, axis=axis), 0.0)
    return out


def tv(p: ArrayLike, q: ArrayLike, axis: int = -1) -> FloatArray:
    """Total variation ``1/2 sum_a |p(a) - q(a)|`` along ``axis``."""
    out: FloatArray = 0.5 * np.sum(np.abs(_as_float(p) - _as_float(q)), axis=axis)
    return out


def kl_in_direction(new: ArrayLike, old: ArrayLike, direction: KLDirection) -> FloatArray:
    """Per-row KL between an updated policy and its predecessor in the given direction.

    ``"reverse"``: KL(new || old), the direction of the exponential-tilt update and of the
    per-token KL an LLM updater measures on its own samples. ``"forward"``: KL(old || new).
    """
    if direction == "reverse":
        return kl(new, old)
    if direction == "forward":
        return kl(old, new)
    raise ValueError(f"direction must be one of {KL_DIRECTIONS}, got {direction!r}")


def token_kl_from_logits(logits_p: ArrayLike, logits_q: ArrayLike) -> FloatArray:
    """Exact per-token KL(p || q) over the vocabulary (last axis) from two logit arrays.

    Computed in log space: ``sum_v p_v (log p_v - log q_v)`` with both log-probabilities from
    :func:`log_softmax`, so large logits neither overflow nor lose the small differences that
    make up a trust-region-sized KL. Shape ``(..., V) -> (...)``.
    """
    logp = log_softmax(logits_p)
    logq = log_softmax(logits_q)
    logp, logq = np.broadcast_arrays(logp, logq)
    p = np.exp(logp)
    positive = p > 0
    with np.errstate(invalid="ignore"):
        # -inf - (-inf) is nan; such entries have p = 0 and contribute 0 (0 log 0 = 0).
        terms = np.where(positive, p * (logp - logq), 0.0)
    out: FloatArray = np.maximum(np.sum(terms, axis=-1), 0.0)
    return out


def k1_estimator(logp: ArrayLike, logq: ArrayLike) -> FloatArray:
    """k1 = log p(y) - log q(y) for y ~ p: unbiased for KL(p || q), per token or per message.

    Individual values can be negative; only the mean is a KL estimate.
    """
    out: FloatArray = _as_float(logp) - _as_float(logq)
    return out


def k2_estimator(logp: ArrayLike, logq: ArrayLike) -> FloatArray:
    """k2 = 1/2 (log p(y) - log q(y))^2 for y ~ p: non-negative, biased (exact to 2nd order)."""
    diff = _as_float(logp) - _as_float(logq)
    out: FloatArray = 0.5 * diff * diff
    return out


def k3_estimator(logp: ArrayLike, logq: ArrayLike) -> FloatArray:
    """k3 = rho - 1 - log rho with rho = q(y)/p(y), y ~ p: non-negative and unbiased.

    Unbiasedness uses ``E_p[q/p] = 1``, which holds when q puts no mass outside the support of
    p (always true for softmax policies). Evaluated as ``expm1(x) - x`` with ``x = log rho``,
    and by its Taylor series for small ``|x|`` where that difference cancels.
    """
    x = _as_float(logq) - _as_float(logp)
    small = np.abs(x) < _K3_SERIES_CUTOFF
    xs = np.where(small, x, 0.0)
    # x^2/2 + x^3/6 + x^4/24 + x^5/120 + x^6/720: the remainder is < 1e-13 relative at 1e-2.
    series = xs * xs * (0.5 + xs * (1 / 6 + xs * (1 / 24 + xs * (1 / 120 + xs / 720))))
    with np.errstate(over="ignore"):
        direct = np.expm1(x) - x
    out: FloatArray = np.where(small, series, direct)
    return out


def message_kl_from_token_kls(token_kls: ArrayLike, mask: ArrayLike) -> FloatArray:
    """Sum of per-token KL terms over each message's own tokens (Lemma 3.1, chain rule).

    ``token_kls`` has shape ``(..., T)``; ``mask`` (same shape, bool or 0/1) marks the tokens of
    the message. With exact per-token KLs along y ~ p (or k1/k3 per token) the expectation of
    the result over y is the message-level KL(p(.|s) || q(.|s)). Masked-out positions are
    ignored even if they hold ``nan`` or ``inf`` (padding).
    """
    values = _as_float(token_kls)
    keep = np.asarray(mask).astype(bool)
    if keep.shape != values.shape:
        raise ValueError(f"mask must have the shape of token_kls {values.shape}, got {keep.shape}")
    out: FloatArray = np.sum(np.where(keep, values, 0.0), axis=-1)
    return out


def expected(div_per_state: ArrayLike, d: ArrayLike) -> float:
    """E_{s~d}[div(s)] = sum_s d(s) div(s): a divergence averaged under an occupancy.

    ``d`` is the occupancy (or any non-negative weights; they are not renormalised). States
    with ``d(s) = 0`` contribute 0 even where ``div(s) = inf``: an unvisited state cannot
    move the occupancy-weighted bounds of THEORY.md §2. The sup form is ``max_s div(s)``.
    """
    div = _as_float(div_per_state)
    weights = _as_float(d)
    if div.shape != weights.shape:
        raise ValueError(f"d must have the shape of div_per_state {div.shape}, got {weights.shape}")
    if np.any(weights < 0) or not np.all(np.isfinite(weights)):
        raise ValueError("d must be finite and non-negative")
    visited = weights > 0
    with np.errstate(invalid="ignore"):
        terms = np.where(visited, weights * div, 0.0)
    return float(np.sum(terms))
