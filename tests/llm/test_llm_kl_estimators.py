"""Exact message KL by enumeration against the per-token estimators (Lemma 3.1).

Two tiny float64 Llamas over a 4-token vocabulary; all 4^3 messages of length 3 after a fixed
prompt are enumerated. The expectation under y ~ old of each estimator's per-message sum must
equal the exact message KL in its direction, to rounding.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from llm.logprobs.losses import per_token_kl
from llm.models.loading import tiny_llama

VOCAB = 4
LENGTH = 3
PROMPT = [1, 2]


def message_logits(model, messages: torch.Tensor) -> torch.Tensor:
    prompt = torch.tensor(PROMPT).expand(messages.shape[0], -1)
    ids = torch.cat([prompt, messages], dim=1)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    return logits[:, len(PROMPT) - 1 : -1]  # position p predicts token p + 1


@pytest.fixture(scope="module")
def enumeration():
    old = tiny_llama(VOCAB, hidden=16, seed=1).double()
    new = tiny_llama(VOCAB, hidden=16, seed=2).double()
    with torch.no_grad():  # sharpen the new policy so the two directions differ clearly
        new.lm_head.weight.mul_(3.0)
    messages = torch.tensor(list(itertools.product(range(VOCAB), repeat=LENGTH)))
    logits_old, logits_new = message_logits(old, messages), message_logits(new, messages)

    def message_logp(logits):
        return torch.log_softmax(logits, -1).gather(-1, messages.unsqueeze(-1)).squeeze(-1).sum(-1)

    return messages, logits_new, logits_old, message_logp(logits_new), message_logp(logits_old)


@pytest.mark.parametrize("estimator", ["exact", "k1", "k3"])
@pytest.mark.parametrize("direction", ["reverse", "forward"])
def test_estimator_expectation_is_the_exact_message_kl(enumeration, estimator, direction):
    messages, logits_new, logits_old, logp_new, logp_old = enumeration
    p_new, p_old = logp_new.exp(), logp_old.exp()
    assert float(p_old.sum()) == pytest.approx(1.0, abs=1e-12)
    if direction == "reverse":
        exact = float((p_new * (logp_new - logp_old)).sum())
    else:
        exact = float((p_old * (logp_old - logp_new)).sum())
    mask = torch.ones_like(messages, dtype=torch.bool)
    terms = per_token_kl(
        logits_new, logits_old, messages, mask, estimator=estimator, direction=direction
    )
    expectation = float((p_old * terms.sum(-1)).sum())  # rollouts are sampled from the old policy
    assert exact > 0.05
    assert expectation == pytest.approx(exact, rel=1e-10)


def test_directions_differ(enumeration):
    _, _, _, logp_new, logp_old = enumeration
    reverse = float((logp_new.exp() * (logp_new - logp_old)).sum())
    forward = float((logp_old.exp() * (logp_old - logp_new)).sum())
    assert abs(reverse - forward) > 1e-3
