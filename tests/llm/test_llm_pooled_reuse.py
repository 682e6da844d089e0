"""Prefix reuse with dynamic sampling plays exact samples of the new team (llm/sampling/
sampler.py, "Prefix reuse and the filter combine through the pool").

Two agents speak in the order 0, 1, 0, one token each, over a 4-token vocabulary: 64 dialogues
whose exact probabilities come from the training forward pass (as in test_llm_prefix_reuse.py).
A dialogue earns 1 when agent 0 opens with token 0 (about a fifth of them do), so a group's
rewards differ when one of its dialogues opens with 0 and the other not: the filter tilts the
kept batch towards openings with 0.
The filter is set to draw all its rounds (its goal is out of reach), so that the groups played
are a fixed number of independent dialogues. After agent 1 changes, the groups the resample
plays continuing the pool's prefixes, and those a fresh draw plays, must both fit the new
team's exact distribution (chi-square goodness of fit, p > 1e-3); the batch the filter keeps
is the same function of the groups played in both. Continuing the prefixes of the kept
(filtered) batch instead, the construction that is not exact, must not fit (p < 1e-6), which
shows the test has power.
"""

from __future__ import annotations

import dataclasses

import torch
from test_llm_prefix_reuse import (
    exact_distribution,
    goodness_of_fit,
    teams_before_and_after,
    token_chat,
)

from llm.conversation.router import FixedOrder
from llm.problems.task import Task
from llm.problems.tasks import Problem
from llm.sampling.sampler import DialogueSampler, SamplerSettings

GROUPS = 1000


def opens_with_zero(dialogue) -> float:
    return float(dialogue.messages[0] == "0")


def test_pooled_prefix_reuse_plays_exact_samples_of_the_new_team():
    old_team, new_team = teams_before_and_after(10.0)
    settings = SamplerSettings(
        prompts_per_batch=GROUPS,
        group_size=2,
        turns=3,
        max_new_tokens=1,
        score_chunk=4 * GROUPS,
        signal_groups=GROUPS,  # out of reach: every draw plays its two rounds
        max_draws=GROUPS,
    )
    task = Task(lambda rng, n: [Problem("q", "")] * n, reward=opens_with_zero)
    sampler = DialogueSampler(token_chat(), FixedOrder(2), task, settings)
    torch.manual_seed(0)
    previous = sampler.sample(old_team)
    reused = sampler.sample(new_team, previous=previous, updated_agent=1)
    fresh = sampler.sample(new_team)
    # The inexact construction: the kept batch's prefixes, tilted by the old team's filter.
    tilted = dataclasses.replace(previous, pool=previous.episodes)
    naive = sampler.sample(new_team, previous=tilted, updated_agent=1)
    for draw in (previous, reused, fresh, naive):
        assert draw.groups_drawn == 2 * GROUPS and len(draw.pool) == 4 * GROUPS
    assert reused.reused_turns == 4 * GROUPS  # turn 0 of every pooled dialogue was kept
    assert naive.reused_turns == 2 * GROUPS  # one round of the kept batch, one fresh
    assert reused.generated_tokens == 2 * 4 * GROUPS and fresh.generated_tokens == 3 * 4 * GROUPS

    distribution = exact_distribution(sampler, new_team, previous.pool[0].prompt)
    assert goodness_of_fit(fresh.pool, distribution) > 1e-3
    assert goodness_of_fit(reused.pool, distribution) > 1e-3
    assert goodness_of_fit(naive.pool, distribution) < 1e-6
