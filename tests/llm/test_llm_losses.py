"""The torch losses agree with the core's numpy definitions on the same inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llm.logprobs import losses
from teamtr import divergence, surrogate


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


def test_divergences_agree_with_core(rng):
    logits_p, logits_q = rng.normal(size=(2, 5, 7, 11)) * 3
    lp, lq = torch.tensor(logits_p), torch.tensor(logits_q)
    np.testing.assert_allclose(
        losses.log_softmax(lp).numpy(), divergence.log_softmax(logits_p), atol=1e-12
    )
    p, q = np.exp(divergence.log_softmax(logits_p)), np.exp(divergence.log_softmax(logits_q))
    np.testing.assert_allclose(
        losses.kl(torch.tensor(p), torch.tensor(q)).numpy(), divergence.kl(p, q), atol=1e-12
    )
    np.testing.assert_allclose(
        losses.tv(torch.tensor(p), torch.tensor(q)).numpy(), divergence.tv(p, q), atol=1e-12
    )
    np.testing.assert_allclose(
        losses.token_kl_from_logits(lp, lq).numpy(),
        divergence.token_kl_from_logits(logits_p, logits_q),
        atol=1e-12,
    )


def test_estimators_agree_with_core(rng):
    logp = np.log(rng.uniform(0.01, 1, size=(4, 9)))
    # include log ratios below the k3 series cut-off
    logq = logp + np.concatenate([rng.normal(size=(4, 5)), rng.normal(size=(4, 4)) * 1e-3], axis=1)
    for name in ("k1_estimator", "k2_estimator", "k3_estimator"):
        mine = getattr(losses, name)(torch.tensor(logp), torch.tensor(logq)).numpy()
        np.testing.assert_allclose(
            mine, getattr(divergence, name)(logp, logq), rtol=1e-12, atol=1e-15
        )
    mask = rng.random((4, 9)) < 0.6
    values = rng.random((4, 9))
    np.testing.assert_allclose(
        losses.message_kl_from_token_kls(torch.tensor(values), torch.tensor(mask)).numpy(),
        divergence.message_kl_from_token_kls(values, mask),
    )


def test_surrogate_and_advantages_agree_with_core(rng):
    rewards = rng.integers(0, 2, size=12).astype(float)
    for a_max in (0.5, 3.0):
        np.testing.assert_allclose(
            losses.group_normalised_advantages(torch.tensor(rewards), 4, a_max).numpy(),
            surrogate.group_normalised_advantages(rewards, 4, a_max),
            atol=1e-12,
        )
    logp_old = np.log(rng.uniform(0.05, 1, size=(3, 6)))
    logp_new = logp_old + rng.normal(size=(3, 6)) * 0.3
    mask = rng.random((3, 6)) < 0.7
    mask[:, 0] = True
    for advantages in (rng.normal(size=3), rng.normal(size=(3, 6))):
        torch_value = losses.clipped_surrogate(
            torch.tensor(logp_new),
            torch.tensor(logp_old),
            torch.tensor(advantages),
            torch.tensor(mask),
            0.2,
        )
        assert float(torch_value) == pytest.approx(
            surrogate.clipped_surrogate(logp_new, logp_old, advantages, mask, 0.2), abs=1e-12
        )


def test_group_normalised_advantages_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    advantages = losses.group_normalised_advantages(rewards, 4, a_max=1.5, eps=0.0)
    # group 1: mean 1/2, std 1/2 -> ±1; group 2: constant -> 0; group 3: mean 1/4, std sqrt(3)/4
    expected_third = [(1 - 0.25) / (np.sqrt(3) / 4)] + [(0 - 0.25) / (np.sqrt(3) / 4)] * 3
    np.testing.assert_allclose(advantages[:8].numpy(), [1, -1, -1, 1, 0, 0, 0, 0])
    # the positive outlier (sqrt(3) = 1.73) is clipped to A_max = 1.5
    np.testing.assert_allclose(advantages[8:].numpy(), [1.5, *expected_third[1:]])
    with pytest.raises(ValueError, match="group_size"):
        losses.group_normalised_advantages(rewards, 1, 1.0)


def test_surrogate_gradient_comes_only_from_masked_tokens():
    logp_new = torch.zeros(2, 4, requires_grad=True)
    mask = torch.tensor([[True, True, False, False], [False, True, True, False]])
    value = losses.clipped_surrogate(
        logp_new, torch.zeros(2, 4), torch.tensor([1.0, -2.0]), mask, 0.2
    )
    value.backward()
    assert torch.equal(logp_new.grad != 0, mask)
