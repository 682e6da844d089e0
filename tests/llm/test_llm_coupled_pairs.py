"""Coupled continuations of held-out pairs (``[sampler] held_out_coupled``): a held-out dialogue
and its continuation by the next team draw every token of turn t from the numbers of (the
dialogue's seed, t), by an exponential race (Gumbel-max, ``llm.engines.hf.draw.CoupledDraw``).
Checked on tiny random models: the same team on both sides gives the same tokens (every pair 0,
where independent noise does not); each side's tokens are exact draws of the engine's
softmax(logits / T); the pairs' mean is the exact J(new) - J(old) within its standard errors,
with a smaller spread than independent noise gives."""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest
import torch
from llm_test_support import arithmetic_sampler, perturb_agent
from scipy.stats import chi2

import llm
from llm.conversation.dialogue import Turn
from llm.engines.hf.messages import generate_messages
from llm.engines.protocol import TurnRequest
from llm.models.agents import AdapterWeights, LoraTeam
from llm.problems.task import Dialogue, Task
from llm.problems.tasks import Problem
from llm.sampling.held_out_groups import HeldOut, continue_groups, turn_seeds

TEMPERATURE = 0.7
Z = 4.0
"""Standard errors allowed between a sampled mean and its exact value (a false failure has
probability 6e-5 per comparison)."""
CHI_SQUARE_P = 1e-6
"""A chi-square fit fails below this p-value: a false failure has probability 1e-6."""
TINY = {
    "source": "tiny",
    "n_agents": 2,
    "turns": 2,
    "threads": 1,
    "temperature": TEMPERATURE,
    "system_prompt": "Add.",
}


def odd_character(dialogue: Dialogue) -> float:
    """A reward in [0, 1] that splits a character vocabulary: the final message's first
    character's code is odd (0.5 for an empty message)."""
    return float(ord(dialogue.final[0]) % 2) if dialogue.final else 0.5


ONE_PROBLEM = Task([Problem("1 + 1?", "2")], reward=odd_character)


def odd_characters(dialogue: Dialogue) -> float:
    """A reward in [0, 1] that every message moves: the mean of ``odd_character`` over the
    messages."""
    return float(np.mean([float(ord(m[0]) % 2) if m else 0.5 for m in dialogue.messages]))


BOTH = Task([Problem("1 + 1?", "2")], reward=odd_characters)


@pytest.mark.parametrize("updated_agent", [0, 1])
def test_with_the_same_team_on_both_sides_coupled_pairs_are_zero_and_independent_ones_are_not(
    updated_agent,
):
    """The held-out groups of one draw continued by the same team in the next (the stage's
    own path): coupled, every continuation repeats its dialogue token for token and every pair
    is exactly 0; with independent noise, the same draws differ."""
    nonzero = {}
    for coupled in (True, False):
        team, sampler, _, _ = llm.build_team(
            task=ONE_PROBLEM, **TINY, max_new_tokens=4, held_out_coupled=coupled
        )
        held = sampler.with_held_out(40)
        first = held.sample(team)
        second = held.sample(team, previous=first, updated_agent=updated_agent)
        assert first.held_out is not None and second.held_out is not None
        assert second.pairs is not None and second.pairs.differences.size == 40
        old, new = first.held_out.episodes, second.held_out.continued
        seeds = [e.noise_seed for e in old]
        assert len(set(seeds)) == (len(seeds) if coupled else 1)
        assert (seeds[0] is not None) == coupled
        # The training groups are never coupled: they draw from the engine's generator.
        assert all(e.noise_seed is None for e in first.episodes)
        if coupled:
            assert [e.turns for e in new] == [e.turns for e in old]
            assert np.all(second.pairs.differences == 0.0)
        nonzero[coupled] = int(np.count_nonzero(second.pairs.differences))
    assert nonzero[True] == 0 and nonzero[False] >= 5, nonzero


def test_a_continuation_repeats_an_unchanged_agents_turn_without_drawing_it():
    """Continued from agent 0's turn by the same team, a coupled dialogue's agent 0 message is
    drawn again (the same tokens) and agent 1's, whose dialogue so far is the old one, is the
    old turn: only agent 0's tokens are generated. Independent dialogues repeat nothing."""
    team, sampler, _, _ = llm.build_team(task=ONE_PROBLEM, **TINY, max_new_tokens=4)
    for coupled in (True, False):
        fresh, _ = sampler.play(team, sampler.new_episodes(20, 1, coupled))
        _, rewards = sampler.graded(fresh)
        held = HeldOut(tuple(fresh), rewards, 1, 0)
        _, continuation = continue_groups(sampler, team, held, 0, (0.0, 1.0))
        continued, tokens = continuation.episodes, continuation.generated_tokens
        drawn = continued if not coupled else [e.with_turns(e.turns[:1]) for e in continued]
        assert tokens == sum(len(t.message) for e in drawn for t in e.turns)
        if coupled:
            assert [e.turns for e in continued] == [e.turns for e in fresh]
            assert all(
                new.turns[1].sampled_logps is old.turns[1].sampled_logps
                for new, old in zip(continued, fresh, strict=True)
            )


def test_a_turns_seed_is_its_dialogues_seed_and_index_alone():
    """The seed of a turn depends on the dialogue's noise seed and the turn's index only."""
    _, sampler, _, _ = llm.build_team(task=ONE_PROBLEM, **TINY, max_new_tokens=2)
    episodes = sampler.new_episodes(3, 1, coupled=True)
    seeds = turn_seeds(episodes)
    assert seeds is not None and len(set(seeds)) == 3 and all(0 <= s < 2**63 for s in seeds)
    assert turn_seeds(episodes[::-1]) == seeds[::-1]
    later = turn_seeds([e.with_turns([Turn(0, (5,))]) for e in episodes])
    assert later is not None and set(later).isdisjoint(seeds)
    assert turn_seeds(sampler.new_episodes(2, 1)) is None
    with pytest.raises(ValueError, match="mixes"):
        turn_seeds([episodes[0], replace(episodes[1], noise_seed=None)])


def stepped(team: LoraTeam, agent: int, step: float, seed: int) -> LoraTeam:
    """``team`` with agent ``agent``'s LoRA B matrices moved by ``step`` times N(0, 1) noise:
    a small update."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {
        key: value + step * torch.randn(value.shape, generator=generator)
        if "lora_B" in key
        else value
        for key, value in team.agent(agent).tensors.items()
    }
    return team.with_agent(agent, AdapterWeights(tensors))


def sharpened(sampler, team, agent: int):
    """``agent``'s generating model, its logits scaled 25-fold: the tiny model's lie within 1,
    which would leave the temperature nothing to act on."""
    model = copy.deepcopy(sampler.engine.speaker_model(team, agent))
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(25.0)
    return model


def softmax_at(model, context) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([list(context)])).logits[0, -1].float()
    return torch.softmax(logits / TEMPERATURE, dim=-1)


def race_agreement(p: torch.Tensor, q: torch.Tensor) -> float:
    """The probability that one exponential race draws the same token from ``p`` and from
    ``q``: sum_i P(i wins both) = sum_i 1 / sum_j max(p_j / p_i, q_j / q_i) (token i wins both
    races iff E_j > E_i max(p_j / p_i, q_j / q_i) for every j, independent exponentials)."""
    p, q = p.double(), q.double()
    support = ((p > 0) & (q > 0)).nonzero()[:, 0]
    ratios = torch.maximum(p[None, :] / p[support, None], q[None, :] / q[support, None])
    return float((1.0 / ratios.sum(dim=1)).sum())


def assert_chi_square_fits(tokens: torch.Tensor, probabilities: torch.Tensor) -> None:
    """``tokens`` are draws of ``probabilities``: no zero-probability token, and Pearson's
    chi-square over the tokens expected 5 times or more (the others pooled into one cell, or
    into the smallest large one while that pool is expected under 5 times) has a p-value above
    ``CHI_SQUARE_P``."""
    counts = torch.bincount(tokens.flatten(), minlength=probabilities.numel()).double()
    expected = tokens.numel() * probabilities.double()
    assert counts[expected == 0].sum() == 0
    large = expected >= 5
    observed, wanted = counts[large], expected[large]
    pooled, pooled_expected = counts[~large].sum(), expected[~large].sum()
    if float(pooled_expected) >= 5:
        observed = torch.cat([observed, pooled.reshape(1)])
        wanted = torch.cat([wanted, pooled_expected.reshape(1)])
    else:
        smallest = int(wanted.argmin())
        observed[smallest] += pooled
        wanted[smallest] += pooled_expected
    statistic = float(((observed - wanted) ** 2 / wanted).sum())
    p_value = float(chi2.sf(statistic, observed.numel() - 1))
    assert p_value > CHI_SQUARE_P, (statistic, observed.numel(), p_value)


def test_each_side_of_a_coupled_draw_is_the_engines_softmax(char_chat, char_team):
    """4,000 coupled rows of one context drawn by a policy and a small step from it, with the
    same seeds,
    two tokens each: each policy's first tokens follow its own softmax(logits / T), its second
    tokens after its most frequent first token follow the softmax at that longer context (a
    step that reused the first step's numbers fails this), each by a chi-square fit; and the two
    policies draw the same first token as often as the race's coupling says (within Z standard
    errors), far more often than independent draws would."""
    sampler = arithmetic_sampler(char_chat, n_agents=3)
    context = char_chat.context(sampler.new_episodes()[0], 0)
    before = perturb_agent(char_team, 0, scale=1.0, seed=5)
    models = [sharpened(sampler, team, 0) for team in (before, stepped(before, 0, 0.1, seed=6))]
    rows = 4000
    firsts = []
    for model in models:
        messages = generate_messages(
            model, [context] * rows, char_chat, 2, TEMPERATURE, seeds=range(rows)
        )
        first = torch.tensor([m[0] for m in messages])
        probabilities = softmax_at(model, context)
        assert 0.2 < float(probabilities.max()) < 0.9 and int((probabilities > 0.01).sum()) >= 3
        assert_chi_square_fits(first, probabilities)
        counts = torch.bincount(first, minlength=probabilities.numel())
        counts[char_chat.stop_id] = 0
        common = int(counts.argmax())
        second = torch.tensor([m[1] for m in messages if m[0] == common])
        assert second.numel() >= 500
        assert_chi_square_fits(second, softmax_at(model, [*context, common]))
        firsts.append(first)
    p, q = (softmax_at(model, context) for model in models)
    same = float((firsts[0] == firsts[1]).double().mean())
    expected = race_agreement(p, q)
    assert abs(same - expected) <= Z * (expected * (1 - expected) / rows) ** 0.5
    assert expected > float((p * q).sum()) + 0.2


def test_the_engine_draws_a_requests_seeds_alike_in_any_batch(char_chat, char_team):
    """``TurnRequest.seeds`` reach ``generate_messages``, and a row's message depends on its
    seed alone: the same seeds draw the same messages in another batch and order."""
    sampler = arithmetic_sampler(char_chat, n_agents=3, temperature=TEMPERATURE)
    context = char_chat.context(sampler.new_episodes()[0], 0)
    team = perturb_agent(char_team, 0, scale=1.0, seed=5)
    policy = char_chat.policy(0)
    request = TurnRequest(team, 0, policy, [context] * 6, 6, TEMPERATURE, False, seeds=range(6))
    drawn = sampler.engine.draw(request).messages
    model = sampler.engine.speaker_model(team, 0)
    direct = generate_messages(model, [context] * 6, char_chat, 6, TEMPERATURE, seeds=range(6))
    assert drawn == direct and len(set(drawn)) > 1
    alone = replace(request, contexts=[context] * 2, seeds=[4, 1])
    assert sampler.engine.draw(alone).messages == [drawn[4], drawn[1]]


def exact_returns(sampler, team, task: Task) -> tuple[float, dict[int, float]]:
    """J(team) on the one-problem task with one-token messages, exactly, and the expected
    reward of agent 1's message after each first message: agent 0's token enumerated, agent
    1's expectation summed over the vocabulary."""
    episode = sampler.new_episodes(1, 1)[0]
    chat = sampler.chat
    first = softmax_at(sampler.engine.speaker_model(team, 0), chat.context(episode, 0))
    answerer = sampler.engine.speaker_model(team, 1)
    vocabulary = first.numel()
    after: dict[int, float] = {}
    for token in range(vocabulary):
        opened = episode.with_turns([Turn(0, (token,))])
        second = softmax_at(answerer, chat.context(opened, 1))
        rewards = torch.tensor(
            [
                task.training_reward(
                    sampler.dialogue(opened.with_turns([*opened.turns, Turn(1, (t,))]))
                )
                for t in range(vocabulary)
            ],
            dtype=torch.float64,
        )
        after[token] = float((second.double() * rewards).sum())
    return float(sum(float(first[t]) * after[t] for t in after)), after


@pytest.mark.parametrize("updated_agent", [1, 0])
def test_coupled_pairs_mean_is_the_exact_improvement_with_a_smaller_spread(updated_agent):
    """1,500 held-out dialogues of an old team continued by a new one (one agent changed; after
    agent 0, agent 1's turn is the old one wherever agent 0's message came out the same): the
    old side's mean is J(old), the continuation's J(new) and the pairs' mean J(new) - J(old),
    each within Z standard errors of the exact value; the coupled pairs' variance is under 3/4
    of independent noise's (about 0.6 measured, on an update that moves J by 0.1)."""
    team, sampler, _, _ = llm.build_team(task=BOTH, **TINY, max_new_tokens=1)
    with torch.no_grad():  # sharpened: the tiny model's logits lie within 1
        team.backbone.model.get_output_embeddings().weight.mul_(8.0)
    old = perturb_agent(team, updated_agent, scale=0.5, seed=1)
    new = stepped(old, updated_agent, 0.3, seed=4)
    j_old, _ = exact_returns(sampler, old, BOTH)
    j_new, _ = exact_returns(sampler, new, BOTH)
    rows = 1500
    spread = {}
    for coupled in (True, False):
        fresh, tokens = sampler.play(old, sampler.new_episodes(rows, 1, coupled))
        _, rewards = sampler.graded(fresh)
        held = HeldOut(tuple(fresh), rewards, 1, tokens)
        pairs, continued = continue_groups(sampler, new, held, updated_agent, (0.0, 1.0))
        new_rewards = continued.rewards
        for sampled, exact in (
            (rewards, j_old),
            (new_rewards, j_new),
            (pairs.differences, j_new - j_old),
        ):
            assert abs(sampled.mean() - exact) <= Z * sampled.std(ddof=1) / rows**0.5
        spread[coupled] = float(pairs.differences.std(ddof=1))
    assert abs(j_new - j_old) > 0.05
    assert spread[True] ** 2 < 0.75 * spread[False] ** 2, spread


def test_sequential_draws_take_the_last_updates_continuations_before_fresh_groups():
    """Pairs drawn on for one update (``draw_pairs``) leave their continuations, dialogues of
    the new team, to the next update's draws: those take them first, in order, as their old
    sides (no fresh group played for them), and play fresh groups only for the rest. A stage's
    first draw forgets them."""
    team, sampler, _, _ = llm.build_team(task=BOTH, **TINY, max_new_tokens=2)
    held = sampler.with_held_out(2)
    old = perturb_agent(team, 1, scale=0.5, seed=1)
    new = stepped(old, 1, 0.3, seed=4)
    newer = stepped(new, 0, 0.3, seed=5)
    held.sample(old)  # a stage's first draw
    first = held.draw_pairs(old, new, 1, 3)
    assert first is not None and first.differences.size == 3
    (reserve,) = [r for r in held.reserves if r.team is new]
    assert reserve.held_out is not None
    waiting = reserve.held_out.episodes
    assert len(waiting) == 3 and all(e.noise_seed is not None for e in waiting)
    held.take_pair_draw_tokens()
    # The next update's first 3 old sides are those continuations: continued from agent 0's
    # turn with the same numbers, each pair is exactly J-difference 0 where newer's agent 0
    # gives new's message, and only agent 0's turn (and what follows a changed one) is drawn.
    second = held.draw_pairs(new, newer, 0, 3)
    assert second is not None and second.differences.size == 3
    assert reserve.held_out is None  # all three read
    tokens_reused = held.take_pair_draw_tokens()
    assert tokens_reused <= 3 * 2 * 2  # at most two turns of two tokens each, no fresh group
    third = held.draw_pairs(new, newer, 0, 2)  # none left: fresh groups of new
    assert third is not None and held.take_pair_draw_tokens() > 0
    assert {id(r.team) for r in held.reserves} <= {id(new), id(newer)}
    held.sample(newer)
    assert held.reserves == []


def test_a_draw_after_an_update_holds_out_its_continuations():
    """After an update, a draw's held-out groups are the previous draw's continued by the new
    team (exact draws of it on problems no update read): no fresh held-out group is played."""
    team, sampler, _, _ = llm.build_team(task=ONE_PROBLEM, **TINY, max_new_tokens=3)
    held = sampler.with_held_out(4)
    first = held.sample(team)
    new = stepped(perturb_agent(team, 0, 0.5, seed=2), 0, 0.3, seed=3)
    second = held.sample(new, previous=first, updated_agent=0)
    assert first.held_out is not None and second.held_out is not None
    assert second.held_out.episodes == second.held_out.continued
    assert [e.noise_seed for e in second.held_out.episodes] == [
        e.noise_seed for e in first.held_out.episodes
    ]
    assert second.held_out.rewards.tolist() == held.graded(second.held_out.episodes)[1].tolist()


def test_chained_pairs_mean_is_the_exact_improvement_of_each_update():
    """1,500 held-out dialogues of a team continued by its update of agent 1 (drawn on, as a
    stage's sequential draws are), whose continuations are then the old sides of the next
    update's (agent 0's) pairs: each update's pairs' mean is its exact J(new) - J(old), and the
    continuations' rewards average J of the team between, within Z standard errors."""
    team, sampler, _, _ = llm.build_team(task=BOTH, **TINY, max_new_tokens=1)
    with torch.no_grad():  # sharpened: the tiny model's logits lie within 1
        team.backbone.model.get_output_embeddings().weight.mul_(8.0)
    teams = [perturb_agent(perturb_agent(team, 1, scale=0.5, seed=1), 0, scale=0.5, seed=7)]
    teams.append(stepped(teams[0], 1, 0.3, seed=4))
    teams.append(stepped(teams[1], 0, 0.3, seed=6))
    values = [exact_returns(sampler, t, BOTH)[0] for t in teams]
    held = sampler.with_held_out(1)
    held.sample(teams[0])
    rows = 1500
    for agent, (old, new) in zip((1, 0), zip(teams, teams[1:], strict=False), strict=True):
        pairs = held.draw_pairs(old, new, agent, rows)
        assert pairs is not None
        exact = values[teams.index(new)] - values[teams.index(old)]
        d = pairs.differences
        assert abs(d.mean() - exact) <= Z * d.std(ddof=1) / rows**0.5, (agent, exact)
        (reserve,) = [r for r in held.reserves if r.team is new]
        assert reserve.held_out is not None
        rewards = reserve.held_out.rewards
        j_new = values[teams.index(new)]
        assert abs(rewards.mean() - j_new) <= Z * rewards.std(ddof=1) / rows**0.5
    # Each update moves J by about 0.1, over twice the checks' Z standard errors (about 0.04):
    # a reserve of the wrong team (old sides one update behind) fails the pairs' check.
    assert min(abs(values[1] - values[0]), abs(values[2] - values[1])) > 0.08, values
