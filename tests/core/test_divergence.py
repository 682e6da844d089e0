"""Divergences against hand computations and independent brute force."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from teamtr.divergence import (
    expected,
    k1_estimator,
    k2_estimator,
    k3_estimator,
    kl,
    kl_in_direction,
    log_softmax,
    message_kl_from_token_kls,
    token_kl_from_logits,
    tv,
)


def test_kl_and_tv_by_hand() -> None:
    p = np.array([0.5, 0.5])
    q = np.array([0.25, 0.75])
    expected_kl = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert kl(p, q) == pytest.approx(expected_kl, abs=1e-15)
    assert tv(p, q) == pytest.approx(0.25, abs=1e-15)


def test_kl_zero_conventions() -> None:
    # 0 log 0 = 0: p has a zero where q does not.
    assert kl([1.0, 0.0], [0.5, 0.5]) == pytest.approx(math.log(2.0), abs=1e-15)
    # q = 0 < p gives +inf.
    assert kl([0.5, 0.5], [1.0, 0.0]) == math.inf
    # Identical distributions with zeros: exactly 0, no nan.
    assert kl([0.0, 1.0], [0.0, 1.0]) == 0.0


def test_kl_rows_and_axis() -> None:
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(4), size=3)
    q = rng.dirichlet(np.ones(4), size=3)
    rows = kl(p, q)
    by_hand = [
        sum(pi * math.log(pi / qi) for pi, qi in zip(pr, qr, strict=True))
        for pr, qr in zip(p, q, strict=True)
    ]
    np.testing.assert_allclose(rows, by_hand, rtol=1e-12)
    np.testing.assert_allclose(kl(p.T, q.T, axis=0), rows, rtol=1e-14)


def test_pinsker_both_directions() -> None:
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.full(5, 0.3), size=500)
    q = rng.dirichlet(np.full(5, 0.3), size=500)
    t = tv(p, q)
    assert np.all(t <= np.sqrt(kl(p, q) / 2) + 1e-12)
    assert np.all(t <= np.sqrt(kl(q, p) / 2) + 1e-12)


def test_kl_in_direction() -> None:
    new = np.array([0.7, 0.3])
    old = np.array([0.4, 0.6])
    assert kl_in_direction(new, old, "reverse") == kl(new, old)
    assert kl_in_direction(new, old, "forward") == kl(old, new)
    with pytest.raises(ValueError, match="direction"):
        kl_in_direction(new, old, "sideways")  # type: ignore[arg-type]


def test_log_softmax_is_stable_and_normalised() -> None:
    logits = np.array([[1000.0, 1001.0, 999.0], [-np.inf, 0.0, 0.0]])
    out = log_softmax(logits)
    np.testing.assert_allclose(np.exp(out).sum(axis=-1), 1.0, rtol=1e-15)
    ref = np.array([1.0, 2.0, 0.0]) - math.log(math.e + math.e**2 + 1.0)
    np.testing.assert_allclose(out[0], ref, rtol=1e-14)
    assert out[1, 0] == -math.inf
    np.testing.assert_allclose(out[1, 1:], math.log(0.5), rtol=1e-15)


def test_token_kl_from_logits_matches_brute_force() -> None:
    rng = np.random.default_rng(2)
    lp = rng.normal(size=(3, 4, 7)) * 3
    lq = rng.normal(size=(3, 4, 7)) * 3
    p = np.exp(lp) / np.exp(lp).sum(-1, keepdims=True)
    q = np.exp(lq) / np.exp(lq).sum(-1, keepdims=True)
    brute = np.sum(p * np.log(p / q), axis=-1)
    np.testing.assert_allclose(token_kl_from_logits(lp, lq), brute, rtol=1e-10, atol=1e-13)
    # Shift invariance and huge logits.
    np.testing.assert_allclose(
        token_kl_from_logits(lp + 5000.0, lq - 7000.0), brute, rtol=1e-9, atol=1e-12
    )


def test_token_kl_from_logits_masked_vocabulary() -> None:
    lp = np.array([0.0, -np.inf, 1.0])
    lq = np.array([0.5, 0.0, -np.inf])
    assert token_kl_from_logits(lp, lq) == math.inf
    lq2 = np.array([0.5, -np.inf, 0.0])
    p = np.array([1.0, 0.0, math.e]) / (1 + math.e)
    q = np.array([math.exp(0.5), 0.0, 1.0]) / (1 + math.exp(0.5))
    assert token_kl_from_logits(lp, lq2) == pytest.approx(kl(p, q), rel=1e-12)


def test_estimators_by_hand() -> None:
    logp, logq = math.log(0.2), math.log(0.5)
    assert k1_estimator(logp, logq) == pytest.approx(math.log(0.4), rel=1e-15)
    assert k2_estimator(logp, logq) == pytest.approx(0.5 * math.log(0.4) ** 2, rel=1e-15)
    assert k3_estimator(logp, logq) == pytest.approx(2.5 - 1 - math.log(2.5), rel=1e-14)


def test_k3_small_log_ratio_is_accurate() -> None:
    # rho - 1 - log rho = x^2/2 + x^3/6 + ... with x = log rho; compare at tiny x.
    x = np.array([1e-9, -1e-6, 3e-4, -9e-3, 1.1e-2])
    ref = np.array([float(sum(xi**k / math.factorial(k) for k in range(2, 12))) for xi in x])
    np.testing.assert_allclose(k3_estimator(np.zeros_like(x), x), ref, rtol=1e-12)
    assert np.all(k3_estimator(np.zeros(3), np.array([-50.0, 0.0, 50.0])) >= 0)


def test_k1_k3_unbiased_within_five_standard_errors() -> None:
    rng = np.random.default_rng(3)
    p = np.array([0.5, 0.3, 0.15, 0.05])
    q = np.array([0.25, 0.25, 0.25, 0.25])
    exact = float(kl(p, q))
    y = rng.choice(4, size=200_000, p=p)
    for estimator in (k1_estimator, k3_estimator):
        samples = estimator(np.log(p[y]), np.log(q[y]))
        se = samples.std(ddof=1) / math.sqrt(samples.size)
        assert abs(samples.mean() - exact) < 5 * se, estimator.__name__
    # k2 is biased here: its mean is off by far more than its standard error.
    k2 = k2_estimator(np.log(p[y]), np.log(q[y]))
    assert abs(k2.mean() - exact) > 5 * k2.std(ddof=1) / math.sqrt(k2.size)


def test_message_kl_chain_rule_by_enumeration() -> None:
    """Lemma 3.1: KL over whole messages = E_{y~p}[sum_t per-token KL] (two tokens, vocab 3)."""
    rng = np.random.default_rng(4)
    vocab, length = 3, 2
    # Autoregressive logits: first token, then second token conditioned on the first.
    lp1, lq1 = rng.normal(size=vocab), rng.normal(size=vocab)
    lp2, lq2 = rng.normal(size=(vocab, vocab)), rng.normal(size=(vocab, vocab))
    p1, q1 = np.exp(log_softmax(lp1)), np.exp(log_softmax(lq1))
    p2, q2 = np.exp(log_softmax(lp2)), np.exp(log_softmax(lq2))
    messages = list(itertools.product(range(vocab), repeat=length))
    p_msg = np.array([p1[a] * p2[a, b] for a, b in messages])
    q_msg = np.array([q1[a] * q2[a, b] for a, b in messages])
    message_kl = float(kl(p_msg, q_msg))
    token_kls = np.array(
        [
            [token_kl_from_logits(lp1, lq1), token_kl_from_logits(lp2[a], lq2[a])]
            for a, _ in messages
        ]
    )
    # A padding column that must be ignored.
    padded = np.concatenate([token_kls, np.full((len(messages), 1), np.nan)], axis=1)
    mask = np.concatenate([np.ones_like(token_kls), np.zeros((len(messages), 1))], axis=1)
    per_message = message_kl_from_token_kls(padded, mask)
    assert float(np.dot(p_msg, per_message)) == pytest.approx(message_kl, rel=1e-12)
    # Summed k1 over tokens is log p(y)/q(y): its p-expectation is the message KL as well.
    k1_tokens = np.array(
        [
            [
                k1_estimator(math.log(p1[a]), math.log(q1[a])),
                k1_estimator(math.log(p2[a, b]), math.log(q2[a, b])),
            ]
            for a, b in messages
        ]
    )
    k1_message = message_kl_from_token_kls(k1_tokens, np.ones_like(k1_tokens, dtype=bool))
    assert float(np.dot(p_msg, k1_message)) == pytest.approx(message_kl, rel=1e-12)


def test_message_kl_mask_shape_checked() -> None:
    with pytest.raises(ValueError, match="mask"):
        message_kl_from_token_kls(np.zeros((2, 3)), np.ones((2, 2)))


def test_expected_under_occupancy() -> None:
    assert expected([0.1, 0.3, math.inf], [0.25, 0.75, 0.0]) == pytest.approx(0.25, abs=1e-15)
    with pytest.raises(ValueError, match="non-negative"):
        expected([0.1, 0.2], [1.5, -0.5])
    with pytest.raises(ValueError, match="shape"):
        expected([0.1, 0.2], [1.0])
