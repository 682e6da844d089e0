"""``[sampler] draw``: both ways draw a token from softmax(logits / T), checked against the exact
probabilities with a stated statistical tolerance: every token's count within 5 binomial
standard errors of N p (a false failure on one of V tokens has probability under V * 6e-7)."""

from __future__ import annotations

import copy

import pytest
import torch
from llm_test_support import arithmetic_sampler, perturb_agent

from llm.common.config import ConfigError, load_config, parse_override
from llm.engines.draw import InverseCdfDraw, inverse_cdf_tokens
from llm.engines.messages import generate_messages

TEMPERATURE = 0.7
Z = 5.0  # standard errors allowed per token


def assert_counts_follow(tokens: torch.Tensor, probabilities: torch.Tensor) -> None:
    """``tokens`` (N draws) are counts of a multinomial(N, ``probabilities``): each token's count
    within Z binomial standard errors, and none of a zero-probability token."""
    n = tokens.numel()
    counts = torch.bincount(tokens.flatten(), minlength=probabilities.numel()).double()
    p = probabilities.double()
    assert counts[p == 0].sum() == 0
    se = (n * p * (1 - p)).sqrt()
    worst = float(((counts - n * p).abs() / se.clamp(min=1e-12))[p > 0].max())
    assert worst < Z, worst


def test_inverse_cdf_draws_softmax_and_never_a_zero_probability_token():
    logits = torch.tensor([2.0, 0.5, -1.0, float("-inf"), 0.0, 3.0, -7.0])
    rows = 200_000
    torch.manual_seed(0)
    tokens = inverse_cdf_tokens(logits.expand(rows, -1) / TEMPERATURE)
    assert tokens.shape == (rows, 1)
    assert_counts_follow(tokens, torch.softmax(logits / TEMPERATURE, dim=-1))


def test_the_processor_hands_generate_a_one_hot_argmax_and_records_the_drawn_logps():
    torch.manual_seed(1)
    scores = torch.randn(5, 11)
    recorded: list[torch.Tensor] = []
    processor = InverseCdfDraw(TEMPERATURE, recorded)
    torch.manual_seed(2)
    out = processor(torch.zeros((5, 1), dtype=torch.long), scores)
    torch.manual_seed(2)
    expected = inverse_cdf_tokens(scores / TEMPERATURE)
    assert torch.equal(out.argmax(-1, keepdim=True), expected)
    assert torch.equal(
        out.isfinite(), torch.zeros_like(out, dtype=torch.bool).scatter_(1, expected, True)
    )
    logps = torch.log_softmax(scores / TEMPERATURE, dim=-1).gather(-1, expected)[:, 0]
    (step,) = recorded
    assert torch.equal(step, logps)
    with pytest.raises(ValueError, match="temperature"):
        InverseCdfDraw(0.0)


@pytest.mark.parametrize("draw", ["multinomial", "inverse_cdf"])
def test_generate_draws_each_first_token_from_the_models_softmax(draw, char_chat, char_team):
    """4,000 rows of one context, one token each, through ``generate_messages``: the counts are
    the model's own softmax(logits / T) at that context (the control, generate's multinomial,
    passes the same check)."""
    sampler = arithmetic_sampler(char_chat, n_agents=3)
    context = char_chat.context(sampler.new_episodes()[0], 0)
    model = copy.deepcopy(
        sampler.engine.speaker_model(perturb_agent(char_team, 0, scale=1.0, seed=5), 0)
    )
    with torch.no_grad():  # the tiny model's logits lie within 1: sharpened, so T matters
        model.get_output_embeddings().weight.mul_(25.0)
    rows = 4000
    torch.manual_seed(3)
    messages = generate_messages(model, [context] * rows, char_chat, 1, TEMPERATURE, draw=draw)
    tokens = torch.tensor([m[0] for m in messages])
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([list(context)])).logits[0, -1].float()
    probabilities = torch.softmax(logits / TEMPERATURE, dim=-1)
    # Peaked enough that a wrong temperature moves some count by many standard errors, spread
    # enough that several tokens are drawn.
    assert 0.2 < float(probabilities.max()) < 0.9 and int((probabilities > 0.01).sum()) >= 3
    assert_counts_follow(tokens, probabilities)


def test_draw_is_a_sampler_key_with_the_multinomial_default():
    assert load_config("smoke").sampler.draw == "multinomial"
    chosen = load_config("smoke", [parse_override('sampler.draw="inverse_cdf"')])
    assert chosen.sampler.draw == "inverse_cdf"
    with pytest.raises(ConfigError, match="sampler.draw"):
        load_config("smoke", [parse_override('sampler.draw="gumbel"')])
