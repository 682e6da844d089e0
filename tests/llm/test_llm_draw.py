"""``[sampler] draw``: both ways draw a token from softmax(logits / T), checked against the exact
probabilities with a stated statistical tolerance: every token's count within 5 binomial
standard errors of N p (a false failure on one of V tokens has probability under V * 6e-7)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from llm_test_support import arithmetic_sampler, perturb_agent

from llm.common.config import ConfigError, load_config, parse_override
from llm.engines.hf.draw import InverseCdfDraw, inverse_cdf_tokens
from llm.engines.hf.messages import generate_messages

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


def exact_log_softmax(scores: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(scores / T) in float64, term by term with Python's math: nothing shared with
    the float32 code under test."""
    z = [float(s) / temperature for s in scores]
    top = max(z)
    log_total = top + math.log(sum(math.exp(v - top) for v in z))
    return torch.tensor([v - log_total for v in z], dtype=torch.float64)


def test_the_processor_draws_softmax_hands_generate_a_one_hot_argmax_and_records_the_logps():
    """200,000 rows of one row of scores through the processor: its tokens follow the exact
    softmax(scores / T) (every count within Z binomial standard errors: a temperature applied
    twice to the draw fails), they are the inverse-CDF draws of the same seed, the scores it
    hands ``generate`` are 0 at the drawn token and -inf elsewhere, and the log-probs it records
    are the exact log softmax(scores / T) at those tokens to float32's rounding."""
    torch.manual_seed(1)
    scores = 2 * torch.randn(11)
    rows = 200_000
    batch = scores.repeat(rows, 1)
    recorded: list[torch.Tensor] = []
    processor = InverseCdfDraw(TEMPERATURE, recorded)
    torch.manual_seed(2)
    out = processor(torch.zeros((rows, 1), dtype=torch.long), batch)
    tokens = out.argmax(-1, keepdim=True)
    exact = exact_log_softmax(scores, TEMPERATURE)
    assert_counts_follow(tokens, exact.exp())
    torch.manual_seed(2)
    assert torch.equal(tokens, inverse_cdf_tokens(batch / TEMPERATURE))
    assert torch.equal(
        out.isfinite(), torch.zeros_like(out, dtype=torch.bool).scatter_(1, tokens, True)
    )
    (step,) = recorded
    assert step.dtype == torch.float32 and step.shape == (rows,)
    # float32 rounds z = s / T (|z| u), its shift by the maximum (2 |z| u), each exponential, the
    # sum of V of them and its logarithm (V + 2 units of the total), and the last difference
    # (|log p| u): within (4 max|z| + V + 4 + max|log p|) u of the exact value.
    u = torch.finfo(torch.float32).eps / 2
    v = scores.numel()
    tolerance = (4 * float(scores.abs().max()) / TEMPERATURE + v + 4 + float(-exact.min())) * u
    assert float((step.double() - exact[tokens[:, 0]]).abs().max()) <= tolerance
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
