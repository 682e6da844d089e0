"""The cheaper stage computes what the straightforward one computes (old path against new path).

Every reuse in ``reuse_work`` (sampler and updater) is checked against the computation it
replaces, run for real on a tiny team: prompt sharing in scoring (the same logits and gradients
up to float rounding), lazily computed behaviour log-probs (bit-identical), and the update
(reference log-softmax kept, first gradient from the reference pass, gradient reused by every
backtrack): the same log-probs, KL, surrogate, accepted step and certificate.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from llm_test_support import (
    FLOAT32_EPSILON,
    arithmetic_sampler,
    logit_resolution,
    penalty_resolution,
    perturb_agent,
    surrogate_resolution,
    turn_kl_resolution,
    with_rewards,
)

from llm.common import profiling
from llm.common.settings import SamplerSettings
from llm.engines.hf.messages import generate_messages
from llm.engines.vllm.client import VLLMEngine
from llm.logprobs.losses import per_token_kl, per_token_kl_from_log_probs
from llm.logprobs.scoring import message_logits
from llm.sampling.rollouts import BehaviourLogps
from llm.update.updater import TrustRegionUpdater, UpdaterSettings
from teamtr.penalty import EpisodicPenalty

REWARDS = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0]
FLOAT_TOLERANCE = dict(rtol=1e-4, atol=1e-6)
"""float32 rounding of an update run in other batch shapes (its adapters and Adam's moments)."""
TEMPERATURE = 0.7
"""The scoring temperature of the prompt-sharing test."""


@pytest.fixture
def team(char_team):
    team = char_team
    for agent in range(team.n_agents):  # non-zero adapters: every agent is its own policy
        team = perturb_agent(team, agent, scale=0.3, seed=agent)
    return team


def rollouts_of(team, chat, reuse_work: bool):
    # T = 1, the temperature these updates were calibrated at (the updater scores at the same T)
    sampler = arithmetic_sampler(chat, prompts_per_batch=2, group_size=4, temperature=1.0)
    sampler.reuse_work = reuse_work
    torch.manual_seed(0)
    return with_rewards(sampler.sample(team), REWARDS), sampler


@pytest.mark.parametrize("headers", ["template", "empty"])
def test_prompt_sharing_scores_like_whole_transcripts(team, char_chat, headers):
    rollouts, _ = rollouts_of(team, char_chat, reuse_work=False)
    if headers == "empty":  # a message then starts right after the prompt
        char_chat = dataclasses.replace(char_chat, headers=((),) * team.n_agents)
    assert len({e.prompt for e in rollouts.episodes}) == 2  # two groups of four
    for agent in range(team.n_agents):
        model = team.use(agent)
        scored = {}
        for share in (False, True):
            model.zero_grad(set_to_none=True)
            batch = message_logits(
                model,
                char_chat,
                rollouts.episodes,
                agent,
                range(8),
                TEMPERATURE,
                share_prompt=share,
            )
            assert batch is not None
            batch.token_logps().sum().backward()
            gradient = {k: p.grad.clone() for k, p in team.backbone.parameters_of(agent).items()}
            scored[share] = (batch, gradient)
        (full, full_grad), (shared, shared_grad) = scored[False], scored[True]
        assert full.refs == shared.refs
        assert torch.equal(full.tokens, shared.tokens) and torch.equal(full.mask, shared.mask)
        mask = full.mask.unsqueeze(-1).expand_as(full.logits)
        # Other batch shapes: the logits agree to their float32 resolution along the forward
        # chain, adapters' rank-r branches included (``logit_resolution``, whatever order the
        # kernels sum in; its premise, raw logits below 1, checked), each divided by T with one
        # rounding more on either side. The former rtol 1e-4, atol 1e-6 failed
        # MKL_CBWR=COMPATIBLE (1.9e-6 on a logit of 5e-3).
        positions = max(
            len(char_chat.context(e, a)) for e in rollouts.episodes for a in range(team.n_agents)
        )
        assert float(full.logits.detach().abs().max()) * TEMPERATURE < 1
        rank = model.peft_config[model.active_adapter].r
        config = team.backbone.model.config
        tolerance = (logit_resolution(config, positions, rank) + FLOAT32_EPSILON) / TEMPERATURE
        torch.testing.assert_close(shared.logits[mask], full.logits[mask], atol=tolerance, rtol=0)
        for key, value in full_grad.items():
            # Summed over hundreds of tokens: rounding is relative to the gradient's size.
            error = float((shared_grad[key] - value).norm() / value.norm())
            assert error < 1e-4, (key, error)


def test_lazy_behaviour_logps_are_the_eager_ones_bit_for_bit(team, char_chat):
    rollouts, sampler = rollouts_of(team, char_chat, reuse_work=True)
    assert isinstance(rollouts.old_logps, BehaviourLogps)
    other = perturb_agent(team, 1, scale=1.0, seed=7)
    other.use(1)  # another team sits in the backbone when the log-probs are first asked for
    lazy = [list(turns) for turns in rollouts.old_logps]
    eager = sampler.scored_logps(team, rollouts.episodes)
    for agent in range(team.n_agents):  # every agent's now, as the reference path does
        eager.of_agent(agent)
    assert len(lazy) == len(eager)
    for e, turns in enumerate(eager):
        assert len(lazy[e]) == len(turns)
        for t, logps in enumerate(turns):
            assert torch.equal(lazy[e][t], logps), (e, t)


def test_kl_from_kept_log_probs_equals_kl_from_logits():
    generator = torch.Generator().manual_seed(0)
    new, old = (torch.randn(3, 5, 11, generator=generator) for _ in range(2))
    tokens = torch.randint(0, 11, (3, 5), generator=generator)
    mask = torch.rand(3, 5, generator=generator) > 0.3
    for estimator in ("exact", "k1", "k3"):
        for direction in ("reverse", "forward"):
            from_logits = per_token_kl(
                new, old, tokens, mask, estimator=estimator, direction=direction
            )
            from_log_probs = per_token_kl_from_log_probs(
                torch.log_softmax(new, -1),
                torch.log_softmax(old, -1),
                tokens,
                mask,
                estimator=estimator,
                direction=direction,
            )
            assert torch.equal(from_logits, from_log_probs), (estimator, direction)


def run_update(team, chat, reuse_work: bool, settings: UpdaterSettings, radius: float):
    rollouts, _ = rollouts_of(team, chat, reuse_work)
    updater = TrustRegionUpdater(chat, settings, reuse_work=reuse_work)
    with profiling.recording() as profile:
        update = updater.update(team, 1, rollouts, radius)
    state = updater.optimizers[1].state_dict()
    return rollouts, update, state, profile


@pytest.mark.parametrize(
    "estimator, direction", [("exact", "reverse"), ("k3", "forward"), ("exact", "forward")]
)
def test_the_cheaper_update_is_the_same_update(team, char_chat, estimator, direction):
    settings = UpdaterSettings(
        learning_rate=0.05,
        steps=3,
        max_backtracks=8,
        estimator=estimator,
        direction=direction,
        warm_start=False,
    )
    radius = 0.004  # lr 0.05 is far outside: every step backtracks
    old_rollouts, old, old_state, old_profile = run_update(team, char_chat, False, settings, radius)
    new_rollouts, new, new_state, new_profile = run_update(team, char_chat, True, settings, radius)
    assert [e.turns for e in old_rollouts.episodes] == [e.turns for e in new_rollouts.episodes]
    assert old.accepted and new.accepted and old.backtracks >= 2
    assert (new.backtracks, new.outcome, new.steps, new.tokens) == (
        old.backtracks,
        old.outcome,
        old.steps,
        old.tokens,
    )
    # The same update scored in other batch shapes: the recorded KLs and surrogate agree to
    # their float32 resolution (llm_test_support; V = 99, messages of at most 6 tokens, H = 3
    # turns, |A| <= a_max): 6.6e-6 for a KL of about 4e-3, 3.9e-5 for a surrogate of about
    # 1e-2, looser than the former rel = 1e-4 (4e-7 and 1e-6); measured at most 9e-8 and 3e-7
    # with ATEN_CPU_CAPABILITY=default, avx2 and natively on AVX-512.
    vocabulary = team.backbone.model.config.vocab_size
    longest = max(len(t.message) for e in old_rollouts.episodes for t in e.turns)
    kl_tolerance = turn_kl_resolution(vocabulary, longest)
    surrogate_tolerance = surrogate_resolution(
        vocabulary, longest, old_rollouts.a_max, old_rollouts.horizon
    )
    assert kl_tolerance < 0.01 * old.kl and surrogate_tolerance < 0.01 * abs(old.surrogate)
    assert abs(new.kl - old.kl) <= kl_tolerance
    assert abs(new.kl_quantile - old.kl_quantile) <= kl_tolerance  # a quantile of the same KLs
    assert abs(new.surrogate - old.surrogate) <= surrogate_tolerance
    penalty = EpisodicPenalty(old_rollouts.horizon)
    charged = {
        path: penalty.kl_penalty(u.advantage_bound, u.kl)
        for path, u in (("old", old), ("new", new))
    }
    certificate = {"old": old.surrogate - charged["old"], "new": new.surrogate - charged["new"]}
    # the certificate's tolerance is theirs carried through c sqrt(KL / 2)
    certificate_tolerance = surrogate_tolerance + penalty_resolution(
        charged["old"], old.kl, kl_tolerance
    )
    assert abs(certificate["new"] - certificate["old"]) <= certificate_tolerance
    for key, value in old.policy.tensors.items():
        torch.testing.assert_close(new.policy.tensors[key], value, **FLOAT_TOLERANCE)
    for index, values in old_state["state"].items():
        for name, tensor in values.items():
            torch.testing.assert_close(new_state["state"][index][name], tensor, **FLOAT_TOLERANCE)
    # ...for less work: no training pass at any backtrack, none for the first step.
    score_chunk = TrustRegionUpdater(char_chat, settings).score_chunk  # as in run_update
    chunks = len(range(0, len(old_rollouts.episodes), score_chunk))
    assert old_profile.calls["backtrack train forward"] == old.backtracks * chunks
    assert "backtrack train forward" not in new_profile.calls
    assert new_profile.calls["train forward"] == old_profile.calls["train forward"] - chunks
    assert old_profile.counts["scored positions"] > 2 * new_profile.counts["scored positions"]


def test_identical_paths_bit_for_bit_without_prompt_sharing(team, char_chat):
    """With the prompt scored per row on both sides, the reuse of reference log-softmax,
    first gradient and backtrack gradients changes no bit of the update."""
    settings = UpdaterSettings(learning_rate=0.05, steps=2, max_backtracks=6, warm_start=False)
    rollouts, _ = rollouts_of(team, char_chat, reuse_work=False)
    results = []
    for reuse in (False, True):
        updater = TrustRegionUpdater(char_chat, settings, reuse_work=reuse, share_prompt=False)
        results.append(updater.update(team, 1, rollouts, radius=0.004))
    old, new = results
    assert old.backtracks >= 2 and old.accepted
    assert (new.kl, new.surrogate, new.backtracks) == (old.kl, old.surrogate, old.backtracks)
    assert all(torch.equal(new.policy.tensors[k], v) for k, v in old.policy.tensors.items())


def test_happo_weights_are_the_same_with_lazy_logps(team, char_chat):
    weights = []
    for reuse in (False, True):
        rollouts, sampler = rollouts_of(team, char_chat, reuse)
        changed = perturb_agent(team, 2, scale=0.3, seed=11)
        weights.append(sampler.importance_weighted(rollouts, changed).weights)
    assert not np.allclose(weights[0], 1.0)
    # A weight is exp(sum of the other agents' log-ratios) over at most H messages of at most
    # L tokens: its relative resolution is that sum's, H L log-prob pairs each resolved to
    # eps ln V (as a surrogate's, per unit advantage): 2e-5, tighter than the former 1e-4;
    # measured 3.8e-6 natively on AVX-512 and with ATEN_CPU_CAPABILITY=avx2, 0 with =default.
    vocabulary = team.backbone.model.config.vocab_size
    longest = max(len(t.message) for e in rollouts.episodes for t in e.turns)
    relative = surrogate_resolution(vocabulary, longest, 1.0, rollouts.horizon)
    np.testing.assert_allclose(weights[1], weights[0], rtol=relative, atol=0)


def test_rollouts_keep_lazy_logps_through_replace(team, char_chat):
    rollouts, _ = rollouts_of(team, char_chat, reuse_work=True)
    reweighted = dataclasses.replace(rollouts, weights=np.full(8, 2.0))
    assert reweighted.old_logps is rollouts.old_logps


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_generation_from_shared_prompts_samples_what_whole_contexts_sample(
    team, char_chat, temperature
):
    """Same seed, same policy: every token of every turn is the same (a wrong cache or position
    would change the random model's distribution and, over 72 draws, the samples)."""
    rollouts, _ = rollouts_of(team, char_chat, reuse_work=False)
    prompt_lengths = [len(e.prompt) for e in rollouts.episodes]
    for turn in range(3):
        agent = rollouts.episodes[0].turns[turn].agent
        contexts = [
            char_chat.context(e.with_turns(e.turns[:turn]), agent) for e in rollouts.episodes
        ]
        for model in (team.generation_model(agent), team.use(agent)):
            torch.manual_seed(1)
            whole = generate_messages(model, contexts, char_chat, 6, temperature)
            torch.manual_seed(1)
            shared = generate_messages(model, contexts, char_chat, 6, temperature, prompt_lengths)
            assert shared == whole, turn


def test_the_in_process_engine_runs_a_groups_prompt_once_and_a_server_engine_does_not(char_chat):
    """The sampler asks its engine whether to send each context's prompt length: the
    in-process engine shares every prompt of two tokens or more (a one-token prompt shares
    nothing); a server keeps its own prefix cache and is sent whole contexts."""
    engine = arithmetic_sampler(char_chat).engine
    assert engine.shares_prompts([7, 7, 9]) and not engine.shares_prompts([7, 1])
    served = SamplerSettings(engine="vllm", engine_url="http://127.0.0.1:1")
    assert not VLLMEngine(char_chat, served).shares_prompts([7, 7, 9])


RADIUS_FOR_TWO = 0.02
"""Wide enough that both steps of the update are admitted (after backtracking)."""


def test_a_chunk_without_signal_gets_no_gradient_pass_and_changes_no_bit(team, char_chat):
    """Dynamic sampling's filler group (equal rewards: every advantage 0) is scored for the KL
    but gets no training pass, and the update is bit for bit the straightforward one."""
    settings = UpdaterSettings(learning_rate=0.05, steps=2, max_backtracks=6, warm_start=False)
    rollouts, _ = rollouts_of(team, char_chat, reuse_work=False)
    rollouts = with_rewards(rollouts, [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    assert not rollouts.advantages[4:].any() and rollouts.advantages[:4].all()
    results, profiles = [], []
    for reuse in (False, True):
        # One group a chunk, so that the second chunk is the filler group alone.
        updater = TrustRegionUpdater(
            char_chat, settings, score_chunk=4, reuse_work=reuse, share_prompt=False
        )
        with profiling.recording() as profile:
            results.append(updater.update(team, 1, rollouts, radius=RADIUS_FOR_TWO))
        profiles.append(profile)
    old, new = results
    assert old.accepted and old.steps == 2
    assert (new.kl, new.surrogate, new.backtracks) == (old.kl, old.surrogate, old.backtracks)
    assert all(torch.equal(new.policy.tensors[k], v) for k, v in old.policy.tensors.items())
    # Two gradients, each of the one chunk with signal: the first from the reference pass, the
    # second step's from one training forward pass; the straightforward path trains on both
    # chunks at both steps (and again at every backtrack).
    assert (profiles[1].calls["train backward"], profiles[1].calls["train forward"]) == (2, 1)
    assert (profiles[0].calls["train backward"], profiles[0].calls["train forward"]) == (4, 4)
