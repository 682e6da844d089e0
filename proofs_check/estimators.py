"""THEORY.md §2, the sampled side: k1 and k3 are unbiased for the message KL (exactly and
statistically), and the Hoeffding term of Thm 3.4 covers the sampled surrogate's error.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from proofs_check import oracle
from proofs_check.instances import (
    MessagePair,
    all_messages,
    sample_messages,
    token_log_probs,
    token_logits_along,
)
from proofs_check.tolerances import (
    HOEFFDING_ETA,
    HOEFFDING_FALSE_ALARM,
    HOEFFDING_REPETITIONS,
    UNBIASED_DRAWS,
    UNBIASED_Z,
    float_allowance,
    identity_slack,
)
from proofs_check.traces import Trace
from teamtr import bounds
from teamtr.divergence import k1_estimator, k3_estimator
from teamtr.surrogate import exact_surrogate


def _estimator_values(pair: MessagePair, estimator: str, messages: NDArray[np.int64]):
    """Per-message value of the estimator: k1 or k3 summed over the message's tokens."""
    logp = token_log_probs(token_logits_along(pair.logits_p, messages, pair.vocab_size), messages)
    logq = token_log_probs(token_logits_along(pair.logits_q, messages, pair.vocab_size), messages)
    if estimator == "k1":
        values = k1_estimator(logp, logq).sum(axis=1)
    elif estimator == "k3":
        values = k3_estimator(logp, logq).sum(axis=1)
    else:
        raise ValueError(f"estimator must be 'k1' or 'k3', got {estimator!r}")
    return values, logp.sum(axis=1), logq.sum(axis=1)


def _exact_moments(pair: MessagePair, estimator: str) -> tuple[float, float, float]:
    """(exact message KL, exact mean of the estimator, its exact standard deviation), by
    enumerating every message."""
    everything = all_messages(pair.vocab_size, pair.length)
    values, logp, logq = _estimator_values(pair, estimator, everything)
    p = np.exp(logp)
    exact_kl = float(np.sum(p * (logp - logq)))
    mean = float(np.sum(p * values))
    return exact_kl, mean, math.sqrt(float(np.sum(p * (values - mean) ** 2)))


def estimator_expectation_slack(pair: MessagePair, estimator: str) -> float:
    """THEORY §2: E_{y~p}[k(y)] = KL(p || q) exactly (k1 or per-token k3 summed), by
    enumerating all messages: an identity, to 1e-9."""
    exact_kl, mean, _ = _exact_moments(pair, estimator)
    return identity_slack(mean, exact_kl, 1.0)


def estimator_unbiased_slack(
    pair: MessagePair, estimator: str, rng: np.random.Generator, n_draws: int = UNBIASED_DRAWS
) -> float:
    """THEORY §2: k1 and k3 (summed per token over y ~ p) are unbiased for the message KL.

    Draws ``n_draws`` messages y ~ p; slack = UNBIASED_Z standard errors minus |sample mean -
    exact KL|. The standard error uses the estimator's exact standard deviation (from the
    enumeration), not the sample one, which rare high-ratio messages make unreliable.
    """
    messages = sample_messages(rng, pair.logits_p, pair.vocab_size, n_draws)
    values, _, _ = _estimator_values(pair, estimator, messages)
    exact_kl, _, std = _exact_moments(pair, estimator)
    standard_error = std / math.sqrt(n_draws)
    return (
        UNBIASED_Z * standard_error
        - abs(float(np.mean(values)) - exact_kl)
        + float_allowance(exact_kl)
    )


def hoeffding_coverage_slack(
    trace: Trace,
    i: int,
    n_samples: int,
    rng: np.random.Generator,
    eta: float = HOEFFDING_ETA,
    repetitions: int = HOEFFDING_REPETITIONS,
) -> float:
    """THEORY §2 (Thm 3.4, N_i samples): the Hoeffding term 2B sqrt(log(2/eta)/(2N)) covers
    |L_hat_i - L_i| in at least 1 - eta of the repetitions.

    L_hat_i is the mean of N i.i.d. draws of A_{pi_hat^{i-1}}(s, a)/(1-gamma), s ~ d_{pi_hat^{i-1}},
    a ~ pi_hat^i, each in [-B, B] with B = max|A|/(1-gamma). Failures are counted over
    ``repetitions`` seeded repetitions; the slack is (allowed - observed failures)/repetitions,
    allowed = the (1 - HOEFFDING_FALSE_ALARM) quantile of Binomial(repetitions, eta).
    """
    mdp = trace.mdp
    ev = trace.evaluations[i - 1]
    assert isinstance(ev, oracle.Discounted)
    after = trace.tables[i]
    scale = 1.0 / (1.0 - mdp.gamma)
    exact = exact_surrogate(after, ev.A, ev.d, scale)
    # Joint law of (s, a) and the value of each pair.
    joint = (ev.d[:, None] * after).ravel()
    joint = np.clip(joint, 0.0, None) / joint.sum()
    values = (scale * ev.A).ravel()
    half_range = float(np.max(np.abs(values)))
    draws = rng.choice(values.size, size=(repetitions, n_samples), p=joint)
    estimates = values[draws].mean(axis=1)
    term = bounds.hoeffding_term(half_range, n_samples, eta)
    failures = int(np.sum(np.abs(estimates - exact) > term + float_allowance(half_range)))
    allowed = int(stats.binom.ppf(1.0 - HOEFFDING_FALSE_ALARM, repetitions, eta))
    return (allowed - failures) / repetitions
