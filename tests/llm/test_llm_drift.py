"""The drift estimator of ``teamtr llm-scaling`` against exact enumeration (``llm.update.drift``).

Two agents speak in the order 0, 1, 0 over a 4-token vocabulary (token 1 ends a message),
messages of at most 2 tokens: 13 possible messages, 13^3 = 2197 dialogues, each with its exact
probability under a team from the training forward pass. KL(P_A || P_B) between the two teams'
dialogue distributions is computed by summing over all of them, and checked against
``dialogue_kls``: its expectation under A (the same enumeration, weighted) must equal it to
float32 rounding (Lemma 3.1's chain rule is an identity), and its mean over dialogues sampled
from A must match it within 5 standard errors (a false failure about once in 1.7 million runs).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from llm_test_support import make_team, perturb_agent, with_rewards
from test_llm_prefix_reuse import token_chat

from llm.conversation.dialogue import ChatFormat, Episode, Turn
from llm.conversation.router import FixedOrder
from llm.problems.tasks import Problem
from llm.sampling.sampler import DialogueSampler, SamplerSettings
from llm.update.drift import dialogue_kls, l1_bound, surrogate_on
from llm.update.updater import TrustRegionUpdater, UpdaterSettings

VOCAB = 4
STOP = 1
MESSAGE_TOKENS = 2
SPEAKERS = (0, 1, 0)
SAMPLED = 3000
TEMPERATURE = 0.7
FLOAT32_EPS = float(np.finfo(np.float32).eps)


def messages() -> list[tuple[int, ...]]:
    """Every message of at most 2 tokens: the stop token alone, or any first token that is not
    a stop followed by any second token (the message is cut after 2 tokens)."""
    return [(STOP,)] + [(a, b) for a in range(VOCAB) if a != STOP for b in range(VOCAB)]


def sampler_for(episodes: int) -> DialogueSampler:
    settings = SamplerSettings(
        prompts_per_batch=episodes // 2,
        group_size=2,
        turns=len(SPEAKERS),
        max_new_tokens=MESSAGE_TOKENS,
        score_chunk=512,
        temperature=TEMPERATURE,
        merged_generation=False,  # sample from the very model that scores
    )
    return DialogueSampler(
        token_chat(), FixedOrder(2), lambda rng, n: [Problem("q", "1")] * n, settings
    )


def teams():
    base = make_team(VOCAB, 2, seed=3)
    with torch.no_grad():  # a randomly initialised head is nearly uniform; sharpen it
        base.backbone.model.get_base_model().lm_head.weight.mul_(20.0)
    team_b = perturb_agent(perturb_agent(base, 0, 0.5, seed=4), 1, 0.5, seed=5)
    team_a = perturb_agent(perturb_agent(team_b, 0, 1.0, seed=6), 1, 1.0, seed=7)
    return team_a, team_b


def enumerated(sampler: DialogueSampler) -> list[Episode]:
    prompt = tuple(token_chat().encode_prompt("q"))
    return [
        Episode(
            Problem("q", "1"),
            prompt,
            0,
            tuple(Turn(k, m) for k, m in zip(SPEAKERS, ms, strict=True)),
        )
        for ms in itertools.product(messages(), repeat=len(SPEAKERS))
    ]


def log_probabilities(sampler: DialogueSampler, team, episodes) -> np.ndarray:
    logps = sampler.scored_logps(team, tuple(episodes))
    return np.array([float(sum(t.double().sum() for t in turns)) for turns in logps])


@pytest.fixture(scope="module")
def world():
    sampler = sampler_for(SAMPLED)
    team_a, team_b = teams()
    episodes = enumerated(sampler)
    log_a = log_probabilities(sampler, team_a, episodes)
    log_b = log_probabilities(sampler, team_b, episodes)
    p_a = np.exp(log_a)
    # Every dialogue is listed once: the probabilities of each team sum to 1.
    assert p_a.sum() == pytest.approx(1.0, abs=1e-5)
    assert np.exp(log_b).sum() == pytest.approx(1.0, abs=1e-5)
    exact_kl = float(np.sum(p_a * (log_a - log_b)))
    return sampler, team_a, team_b, episodes, p_a, exact_kl


def largest_logit(team, episodes, chat: ChatFormat | None = None) -> float:
    """max |logit| any agent of ``team`` produces on ``episodes`` (for the float32 bound)."""
    from llm.logprobs.scoring import message_logits

    largest = 0.0
    with torch.no_grad():
        for agent in range(team.n_agents):
            batch = message_logits(
                team.use(agent), chat or token_chat(), episodes, agent, range(64)
            )
            largest = max(largest, float(batch.logits.abs().max()))
    return largest


def test_expected_estimate_is_the_exact_dialogue_kl(world):
    sampler, team_a, team_b, episodes, p_a, exact_kl = world
    per_dialogue = dialogue_kls(
        token_chat(), team_a, team_b, episodes, temperature=TEMPERATURE, chunk_size=512
    )
    assert exact_kl > 0.05  # the teams differ enough for the check to mean something
    # Both sides are the same sums of float32 log-softmax values; each log-probability is off
    # by at most ~ V * eps32 * max|logit| (the log-sum-exp over V entries), and a dialogue sums
    # 6 token positions of two teams: 12 such errors, a bound on the KL's absolute error too.
    tolerance = 12 * VOCAB * FLOAT32_EPS * max(largest_logit(team_a, episodes), 1.0)
    assert float(np.sum(p_a * per_dialogue)) == pytest.approx(exact_kl, abs=tolerance)


def test_sampled_estimate_matches_the_exact_kl_within_five_standard_errors(world):
    sampler, team_a, team_b, _, _, exact_kl = world
    torch.manual_seed(0)
    drawn = sampler.sample(team_a).episodes
    values = dialogue_kls(
        token_chat(), team_a, team_b, drawn, temperature=TEMPERATURE, chunk_size=512
    )
    error = values.std(ddof=1) / math.sqrt(len(values))
    assert abs(values.mean() - exact_kl) < 5 * error
    # Power: dialogues of the wrong team (B) give another expectation, told apart at 5 s.e.
    wrong = sampler.sample(team_b).episodes
    other = dialogue_kls(
        token_chat(), team_a, team_b, wrong, temperature=TEMPERATURE, chunk_size=512
    )
    spread = math.hypot(error, other.std(ddof=1) / math.sqrt(len(other)))
    assert abs(other.mean() - exact_kl) > 5 * spread


def test_only_agents_that_differ_are_scored(world):
    sampler, team_a, team_b, episodes, p_a, _ = world
    # The same team: no agent differs, every dialogue's KL is exactly 0 (nothing is scored).
    same = dialogue_kls(token_chat(), team_a, team_a, episodes[:50], temperature=TEMPERATURE)
    assert np.array_equal(same, np.zeros(50))
    # Agent 1 alone differs: only its turn contributes; exact KL from the enumeration.
    only_one = team_b.with_agent(1, team_a.agent(1))
    log_mixed = log_probabilities(sampler, only_one, episodes)
    log_b = log_probabilities(sampler, team_b, episodes)
    p_mixed = np.exp(log_mixed)
    exact = float(np.sum(p_mixed * (log_mixed - log_b)))
    per_dialogue = dialogue_kls(
        token_chat(), only_one, team_b, episodes, temperature=TEMPERATURE, chunk_size=512
    )
    tolerance = 12 * VOCAB * FLOAT32_EPS * max(largest_logit(only_one, episodes), 1.0)
    assert float(np.sum(p_mixed * per_dialogue)) == pytest.approx(exact, abs=tolerance)


def test_l1_bound_is_pinsker():
    assert l1_bound(0.5) == pytest.approx(1.0, abs=1e-12)
    assert l1_bound(0.0) == 0.0
    assert l1_bound(-1e-18) == 0.0  # a float rounding below zero is no distance


def test_surrogate_on_the_training_batch_is_the_updaters():
    """On the batch it trained on, ``surrogate_on`` recomputes the updater's own L_i."""
    team = make_team(VOCAB, 2, seed=11)
    sampler = sampler_for(16)
    torch.manual_seed(1)
    rollouts = with_rewards(sampler.sample(team), [1.0, 0.0] * 8)
    updater = TrustRegionUpdater(
        token_chat(), UpdaterSettings(learning_rate=5e-2, steps=1), score_chunk=8
    )
    update = updater.update(team, 1, rollouts, radius=10.0)
    assert update.accepted and update.surrogate != 0.0
    updated = team.with_agent(1, update.policy)
    again = surrogate_on(token_chat(), rollouts, 1, updated, chunk_size=8)
    # Both sum exp(sum of a message's float32 log-ratios) * A over 16 dialogues: a few eps32
    # of relative error per term, |A| <= A_max = 2.
    assert again == pytest.approx(update.surrogate, abs=16 * 2 * 64 * FLOAT32_EPS)
    # Unchanged policy: every ratio is 1 and group-normalised advantages average to 0.
    assert surrogate_on(token_chat(), rollouts, 1, team, chunk_size=8) == pytest.approx(
        0.0, abs=1e-6
    )


def test_chain_identity_of_the_drift_study():
    """Three agents speak once each, in order, one token over 4: 64 dialogues, enumerated.

    With pi_hat^j the team whose agents 0..j-1 are updated, every D_stale term is a sum of
    per-agent message KLs measured under the last team alone (``studies.llm.drift.scaling``):
    KL(P_{pi_hat^j} || P_{pi_hat^0}) = sum_{k<j} E_{pi_hat^3}[agent k's message KL]."""
    from llm.update.drift import agent_message_kls

    base = make_team(VOCAB, 3, seed=21)
    with torch.no_grad():
        base.backbone.model.get_base_model().lm_head.weight.mul_(20.0)
    teams = [base]
    for k in range(3):
        teams.append(perturb_agent(teams[-1], k, 1.0, seed=30 + k))
    chat = ChatFormat(
        headers=((2,), (3,), (0,)),
        stop_id=STOP,
        closing=(),
        encode_prompt=lambda question: [0, 2],
        decode=lambda ids: " ".join(map(str, ids)),
        pad_id=0,
    )
    settings = SamplerSettings(turns=3, max_new_tokens=1, temperature=TEMPERATURE)
    sampler = DialogueSampler(chat, FixedOrder(3), lambda rng, n: [Problem("q", "1")] * n, settings)
    episodes = [
        Episode(Problem("q", "1"), (0, 2), 0, tuple(Turn(k, (y,)) for k, y in enumerate(ys)))
        for ys in itertools.product(range(VOCAB), repeat=3)
    ]
    log_p = [log_probabilities(sampler, team, episodes) for team in teams]
    per_agent = agent_message_kls(
        chat, teams[3], teams[0], episodes, temperature=TEMPERATURE, chunk_size=64
    )
    kappa = np.exp(log_p[3]) @ per_agent  # E_{pi_hat^3}[agent k's message KL], exactly
    for j in (1, 2, 3):
        exact = float(np.sum(np.exp(log_p[j]) * (log_p[j] - log_p[0])))
        assert exact > 0.01
        # float32 log-softmax over 4 entries (see the first test): 3 positions of two teams on
        # each side, and up to 3 kappas summed.
        tolerance = 6 * VOCAB * FLOAT32_EPS * max(largest_logit(teams[3], episodes, chat), 1.0) * 3
        assert float(kappa[:j].sum()) == pytest.approx(exact, abs=tolerance)
