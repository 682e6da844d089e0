"""Prefix reuse yields exact on-policy samples of the intermediate team (docs/llm_results.md, "Sampler").

Two agents speak in the order 0, 1, 0, one token each, over a 4-token vocabulary: 64 possible
dialogues whose exact probabilities under a team come from the training forward pass. After
agent 1 changes, dialogues sampled with prefix reuse (turn 0 kept, turns 1-2 regenerated) and
with full resampling must both fit the new team's exact distribution (chi-square goodness of fit,
p > 1e-3); the old dialogues kept whole must not (p < 1e-6), which shows the test has power.
Agent 0's turn 2 of the reused draw continues from the keys and values it computed over turn 0
in the previous draw (``[sampler] kept_contexts_mb``), so the fit checks that path as well.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch
from llm_test_support import FLOAT32_EPSILON, make_team, perturb_agent
from scipy.stats import chisquare

from llm.common import profiling
from llm.conversation.dialogue import ChatFormat, Episode, Turn
from llm.conversation.router import FixedOrder
from llm.problems.tasks import Problem
from llm.sampling.sampler import DialogueSampler, SamplerSettings

VOCAB = 4
EPISODES = 4000


def token_chat() -> ChatFormat:
    return ChatFormat(
        headers=((2,), (3,)),
        stop_id=1,
        closing=(),
        encode_prompt=lambda question: [0, 2],
        decode=lambda ids: " ".join(map(str, ids)),
        pad_id=0,
    )


def outcome(episode: Episode) -> tuple[int, ...]:
    return tuple(turn.message[0] for turn in episode.turns)


def exact_distribution(sampler: DialogueSampler, team, prompt: tuple[int, ...]) -> dict:
    outcomes = list(itertools.product(range(VOCAB), repeat=3))
    episodes = [
        Episode(
            Problem("q", "1"),
            prompt,
            0,
            tuple(Turn(a, (y,)) for a, y in zip((0, 1, 0), ys, strict=True)),
        )
        for ys in outcomes
    ]
    logps = sampler.scored_logps(team, tuple(episodes))
    probabilities = np.array([float(sum(t.sum() for t in turns).exp()) for turns in logps])
    # The probabilities sum to 1 up to float32 rounding (whatever error the logits carry, a
    # softmax is normalised): each log-prob l = z - logsumexp(z) is off by about
    # eps (V + 2 max|l|) (the log-sum-exp sums V terms of at most 1; z and it, of the order of
    # max|l|, are rounded once more), three of them are summed and exponentiated (2 eps more),
    # and the relative errors, weighted by p, add up to their largest; 64 outcomes are summed
    # (64 eps). About 1.1e-5 here (the former 1e-5); measured 2e-7 with
    # ATEN_CPU_CAPABILITY=default, avx2 and natively on AVX-512.
    largest = max(float(t.abs().max()) for turns in logps for t in turns)
    per_outcome = 3 * FLOAT32_EPSILON * (VOCAB + 2 * largest) + 2 * FLOAT32_EPSILON
    tolerance = per_outcome + len(outcomes) * FLOAT32_EPSILON
    assert abs(probabilities.sum() - 1.0) <= tolerance, (probabilities.sum(), tolerance)
    return dict(zip(outcomes, probabilities, strict=True))


def goodness_of_fit(episodes, distribution: dict) -> float:
    keys = list(distribution)
    index = {key: i for i, key in enumerate(keys)}
    counts = np.zeros(len(keys))
    for episode in episodes:
        counts[index[outcome(episode)]] += 1
    expected = np.array([distribution[k] for k in keys]) * len(episodes)
    big = expected >= 5  # pool sparse cells so the chi-square approximation holds
    observed, fitted = counts[big], expected[big]
    if not big.all():
        observed = np.append(observed, counts[~big].sum())
        fitted = np.append(fitted, expected[~big].sum())
    fitted *= observed.sum() / fitted.sum()
    return float(chisquare(observed, fitted).pvalue)


def teams_before_and_after(sharpness: float):
    """A two-agent team over the 4-token vocabulary, and the same team with agent 1 changed.

    A randomly initialised head is nearly uniform; it is sharpened by ``sharpness``."""
    old_team = make_team(VOCAB, 2, seed=3)
    with torch.no_grad():
        old_team.backbone.model.get_base_model().lm_head.weight.mul_(sharpness)
    old_team = perturb_agent(old_team, 0, 0.5, seed=4)
    old_team = perturb_agent(old_team, 1, 0.5, seed=5)
    return old_team, perturb_agent(old_team, 1, 5.0, seed=6)


def test_prefix_reuse_matches_full_resampling():
    old_team, new_team = teams_before_and_after(40.0)
    settings = SamplerSettings(
        prompts_per_batch=EPISODES // 2,
        group_size=2,
        turns=3,
        max_new_tokens=1,
        score_chunk=EPISODES,
    )
    sampler = DialogueSampler(
        token_chat(), FixedOrder(2), lambda rng, n: [Problem("q", "1")] * n, settings
    )
    torch.manual_seed(0)
    previous = sampler.sample(old_team)
    with profiling.recording() as profile:
        reused = sampler.sample(new_team, previous=previous, updated_agent=1)
    fresh = sampler.sample(new_team)
    # Agent 0, unchanged, read turn 0 in the previous draw: its turn 2 continues from those
    # keys and values ([sampler] kept_contexts_mb), so the fit below covers that path too.
    assert profile.counts["kept context positions"] >= EPISODES

    assert reused.reused_turns == EPISODES  # turn 0 of every episode was kept
    assert all(
        a.turns[0] == b.turns[0] for a, b in zip(previous.episodes, reused.episodes, strict=True)
    )
    assert reused.generated_tokens == 2 * EPISODES and fresh.generated_tokens == 3 * EPISODES
    # A kept turn keeps the log-probs it was drawn with (the check's behaviour log-probs, exact
    # for it: agent 0 did not change); the regenerated turns carry their own, drawn anew.
    for a, b in zip(previous.episodes, reused.episodes, strict=True):
        assert b.turns[0].sampled_logps is a.turns[0].sampled_logps is not None
        assert all(turn.sampled_logps is not None for turn in b.turns)

    distribution = exact_distribution(sampler, new_team, previous.episodes[0].prompt)
    assert goodness_of_fit(fresh.episodes, distribution) > 1e-3
    assert goodness_of_fit(reused.episodes, distribution) > 1e-3
    assert goodness_of_fit(previous.episodes, distribution) < 1e-6
