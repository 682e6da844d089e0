"""The log-probabilities the generating model drew each token with (``generate_messages``'s
``sampled_logps``): recording them changes no sample, and they are the training forward pass's
up to float32 rounding (the measurement behind ``bench/behaviour_logp_gap.py``)."""

from __future__ import annotations

import copy

import pytest
import torch
from llm_test_support import (
    FLOAT32_EPSILON,
    arithmetic_sampler,
    logit_resolution,
    perturb_agent,
)

from llm.conversation.dialogue import Turn
from llm.engines.hf.messages import generate_messages

TEMPERATURE = 0.7


@pytest.mark.parametrize("draw", ["multinomial", "inverse_cdf"])
def test_recording_changes_no_sample_and_matches_the_training_pass(draw, char_chat, char_team):
    team = perturb_agent(char_team, 0, scale=0.3, seed=3)  # merged weights differ from the base
    sampler = arithmetic_sampler(char_chat, n_agents=3)
    episodes = sampler.new_episodes()
    contexts = [char_chat.context(e, 0) for e in episodes]
    model = sampler.engine.speaker_model(team, 0)
    torch.manual_seed(1)
    plain = generate_messages(model, contexts, char_chat, 6, TEMPERATURE, draw=draw)
    torch.manual_seed(1)
    recorded: list[torch.Tensor] = []
    messages = generate_messages(
        model, contexts, char_chat, 6, TEMPERATURE, sampled_logps=recorded, draw=draw
    )
    assert messages == plain
    assert [len(r) for r in recorded] == [len(m) for m in messages]
    assert all(bool((r <= 0).all()) for r in recorded)

    played = [e.with_turns([Turn(0, m)]) for e, m in zip(episodes, messages, strict=True)]
    training = sampler.agent_logps(team, played, 0)  # the training model, LoRA unmerged
    gap = max(
        float((training[(e, 0)] - recorded[e]).abs().max())
        for e in range(len(played))
        if messages[e]
    )
    # Logits of both passes agree to ``logit_resolution`` (the merge's rank-r terms included);
    # a log-probability at temperature T carries twice that over T, plus the log-sum-exp's
    # rounding over V entries of at most max|z| / T each. The premise, logits below 1, is checked.
    config = team.backbone.model.config
    positions = max(len(c) for c in contexts) + 6
    rank = next(v for k, v in team.agent(0).tensors.items() if "lora_A" in k).shape[0]
    with torch.no_grad():
        ids = torch.tensor([list(contexts[0]) + list(messages[0])])
        max_logit = float(team.use(0)(input_ids=ids).logits.abs().max())
    assert max_logit < 1.0
    bound = 2 * logit_resolution(config, positions, adapter_rank=rank) / TEMPERATURE
    bound += config.vocab_size * FLOAT32_EPSILON * max_logit / TEMPERATURE
    assert gap <= bound, (gap, bound)


def test_greedy_decoding_has_no_sampling_distribution_to_record(char_chat, char_team):
    sampler = arithmetic_sampler(char_chat, n_agents=3)
    contexts = [char_chat.context(e, 0) for e in sampler.new_episodes()]
    with pytest.raises(ValueError, match="sampling"):
        generate_messages(char_team.use(0), contexts, char_chat, 4, 0.0, sampled_logps=[])


def test_sampling_records_its_logps_in_float32_and_always_in_half_precision(char_chat, char_team):
    """Greedy decoding (evaluation) records nothing; a half-precision model records what it
    drew with even where the float32 check reads the scoring pass ("scored"), because its
    updates measure and correct the sampler's mismatch (``llm.update.mismatch``)."""
    sampler = arithmetic_sampler(char_chat, n_agents=3)
    model = sampler.engine.speaker_model(char_team, 0)
    assert sampler.engine.records_logps(model, 0.7)
    assert not sampler.engine.records_logps(model, 0.0)
    half = copy.deepcopy(model).to(torch.bfloat16)
    assert sampler.engine.records_logps(half, 0.7)
    assert arithmetic_sampler(char_chat, n_agents=3, behaviour_logps="scored").engine.records_logps(
        half, 0.7
    )
    scored = arithmetic_sampler(char_chat, n_agents=3, behaviour_logps="scored")
    assert not scored.engine.records_logps(model, 0.7)
