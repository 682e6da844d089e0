"""Stage-0 alignment of an adapter (llm.update.adapter_alignment): the constraint holds, the
objective drops.

Every KL is re-measured here independently of ``align_adapter``: a fresh team with the candidate
in agent k's slot, scored by ``llm.logprobs.scoring.message_logits``, compared token by token.
"""

from __future__ import annotations

import math

import pytest
import torch
from llm_test_support import arithmetic_sampler, perturb_agent, token_kl_resolution

from llm.logprobs.losses import token_kl_from_logits
from llm.logprobs.scoring import message_logits
from llm.models.agents import AdapterWeights, LoraTeam
from llm.sampling.sampler import SamplerSettings
from llm.update.adapter_alignment import AlignmentError, AlignmentSettings, align_adapter

AGENT = 1


# The policy the alignment scores at: temperature 1, as ``message_logits`` below.
POLICY = SamplerSettings(temperature=1.0)


def independent_mean_kl(
    team: LoraTeam, policy: AdapterWeights, reference: AdapterWeights, chat, episodes
) -> float:
    """E over agent AGENT's probe tokens of the exact KL(policy‖reference)."""
    logits = {}
    for name, weights in (("policy", policy), ("reference", reference)):
        model = team.with_agent(AGENT, weights).use(AGENT)
        with torch.no_grad():
            batch = message_logits(model, chat, episodes, AGENT, range(len(episodes)))
        assert batch is not None
        logits[name] = batch.logits
    per_token = token_kl_from_logits(logits["policy"], logits["reference"])
    return float(per_token[batch.mask].mean())


@pytest.fixture
def setting(char_team, char_chat):
    """A current team (agent 1 trained a little), a distant new adapter, probe dialogues."""
    team = perturb_agent(char_team, AGENT, scale=0.05, seed=1)
    new_adapter = perturb_agent(char_team, AGENT, scale=0.4, seed=2).agent(AGENT)
    sampler = arithmetic_sampler(char_chat, prompts_per_batch=3, max_new_tokens=8)
    episodes, _ = sampler.play(team, sampler.new_episodes())
    return team, new_adapter, char_chat, episodes


def test_alignment_lowers_kl_to_new_adapter_inside_delta0(setting):
    team, new_adapter, chat, episodes = setting
    current = team.agent(AGENT)
    direct = independent_mean_kl(team, new_adapter, current, chat, episodes)
    delta0 = 0.3 * direct
    result = align_adapter(
        team,
        AGENT,
        new_adapter,
        chat,
        episodes,
        AlignmentSettings(delta0=delta0, steps=6, learning_rate=1e-3),
        POLICY,
    )
    kl_to_cur = independent_mean_kl(team, result.policy, current, chat, episodes)
    kl_to_pre = independent_mean_kl(team, result.policy, new_adapter, chat, episodes)
    kl_cur_to_pre = independent_mean_kl(team, current, new_adapter, chat, episodes)
    # The alignment's own KLs against the independent re-measurement: mean per-token exact KLs
    # of the same adapters on the same tokens, computed in other batch shapes, so equal up to a
    # per-token KL's float32 resolution (2 eps ln V = 1.1e-6 nats whatever the KL; the former
    # rel = 1e-3 allowed 4e-6 to 1.5e-5 at these KLs of 4e-3 to 1.5e-2; measured 2e-10 to 5e-8
    # with ATEN_CPU_CAPABILITY=default, avx2 and natively on AVX-512).
    tolerance = token_kl_resolution(team.backbone.model.config.vocab_size)
    assert kl_to_cur <= delta0 + tolerance
    assert abs(kl_to_cur - result.kl_to_cur) <= tolerance
    assert abs(kl_to_pre - result.kl_to_pre) <= tolerance
    assert abs(result.pre_kl_to_cur - direct) <= tolerance
    # Closer to π_pre than the current agent is, and the gradient steps improved on the
    # interpolation; no adapter beats the unrestricted closed form of THEORY.md.
    assert kl_to_pre < 0.8 * kl_cur_to_pre
    assert result.steps >= 1
    assert result.kl_to_pre < result.interpolated_kl_to_pre
    assert result.kl_to_pre >= result.closed_form_kl_to_pre * (1 - 1e-3)
    assert 0 < result.multiplier < float("inf")
    # The team passed in still holds the current agent.
    assert team.agent(AGENT) is current


def test_huge_delta0_keeps_the_new_adapter(setting):
    team, new_adapter, chat, episodes = setting
    result = align_adapter(
        team, AGENT, new_adapter, chat, episodes, AlignmentSettings(delta0=1e6), POLICY
    )
    assert result.policy.equal(new_adapter)
    assert result.kl_to_pre == 0.0
    assert result.multiplier == 0.0
    assert result.steps == 0


def test_tiny_delta0_stays_at_the_current_agent(setting):
    team, new_adapter, chat, episodes = setting
    current = team.agent(AGENT)
    delta0 = 1e-6
    result = align_adapter(
        team, AGENT, new_adapter, chat, episodes, AlignmentSettings(delta0=delta0, steps=2), POLICY
    )
    kl_to_cur = independent_mean_kl(team, result.policy, current, chat, episodes)
    assert kl_to_cur <= delta0 * (1 + 1e-3)
    assert result.interpolation < 0.05
    kl_cur_to_pre = independent_mean_kl(team, current, new_adapter, chat, episodes)
    # Not a float tolerance: the policy sits within KL delta0 of the current agent, so its KL
    # to pi_pre moves by the first-order term E_cur[(pi / pi_cur - 1) log(pi_cur / pi_pre)],
    # at most sqrt(chi2(pi || pi_cur) Var_cur[log(pi_cur / pi_pre)]) by Cauchy-Schwarz, with
    # chi2 ~ 2 KL and the variance ~ 2 KL(pi_cur || pi_pre) for nearby policies, and averaged
    # over tokens by Jensen: 2 sqrt(delta0 KL(pi_cur || pi_pre)), plus the second-order term
    # (at most delta0). Here 2.4e-4, 1.6% of the KL (the former bound was 5%); measured 3e-5.
    moved = 2 * math.sqrt(kl_to_cur * kl_cur_to_pre) + kl_to_cur
    assert abs(result.kl_to_pre - kl_cur_to_pre) <= moved


def test_mismatched_adapter_and_silent_agent_are_rejected(setting, char_chat):
    team, new_adapter, chat, episodes = setting
    truncated = AdapterWeights(dict(list(new_adapter.tensors.items())[:-1]))
    with pytest.raises(AlignmentError, match="do not match"):
        align_adapter(team, AGENT, truncated, chat, episodes)
    only_first_turns = [e.with_turns(e.turns[:1]) for e in episodes]  # agent 0 speaks first
    with pytest.raises(AlignmentError, match="never speaks"):
        align_adapter(team, AGENT, new_adapter, chat, only_first_turns)
    with pytest.raises(AlignmentError, match="agent must lie"):
        align_adapter(team, 7, new_adapter, chat, episodes)
