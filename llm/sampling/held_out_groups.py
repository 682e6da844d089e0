"""Held-out groups: dialogues no update sees, continued by the next team to measure an update.

Each draw of a sampler with held-out groups (``DialogueSampler.with_held_out``) also plays
``groups`` fresh problems of the same team, ``[sampler] held_out_group_size`` dialogues each
(by default 1), that the updater never reads (they are not in ``DialogueRollouts.episodes``:
not in the gradient, nor in the KL). The next draw, after agent
k's update, cuts each of them before the first turn spoken for k (the same cut as prefix reuse:
the kept turns were drawn by agents the update did not change, so they are distributed alike
under both teams, Lemma 3.1's setting) and plays the rest with the new team. Per group, the
mean new training reward minus the mean old has expectation J(new) - J(old); the groups were
held out and their problems drawn independently, so the differences of one update are i.i.d.
given it: the pairs of ``teamtr.measured`` (one per group, so n = groups). One dialogue a
problem gives the most pairs for the tokens: the finite-n bounds pay for the reward's range
as 1/n, and a group's mean narrows only the variance.

**Coupled continuations** (``[sampler] held_out_coupled``, the default): a pair's two sides
differ by the update and by the sampling noise of the turns after the cut. Each held-out
dialogue gets a seed of its own (``Episode.noise_seed``), and every token of its turn t is drawn
from the numbers of (seed, t) alone (``turn_seeds``; ``llm.engines.hf.draw``), by the old team and
by its continuation alike. The kept turns read only the numbers of the turns before the cut, so
the continuation is an exact draw of the new team given them, as an uncoupled one: each side's
marginal is unchanged and the pairs' mean still has expectation J(new) - J(old); the seeds are
drawn independently per dialogue, so the pairs stay i.i.d. given the update. Where the two
teams give the same next-token distribution, the same numbers give the same token, and a
continuation that repeats its dialogue earns its reward: D = 0 (common random numbers). A
turn of an agent the update did not change, after a continuation that so far repeats its old
dialogue, is the old turn's message, not drawn again (``Replay``): the same policy, the same
context and the same numbers drew it, so drawing it again would compute the same tokens (up to
float rounding); a relay's continuation whose first message came out the same then costs one
turn instead of two.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from llm.conversation.dialogue import Episode
from llm.problems.rewards import Grade
from teamtr.measured import PairedDifferences


class Player(Protocol):
    """What of the sampler the held-out groups need (``DialogueSampler`` has it)."""

    def new_episodes(
        self, count: int | None = None, group_size: int | None = None, coupled: bool = False
    ) -> list[Episode]: ...

    def play(
        self, team: Any, episodes: list[Episode], *, replay: Replay | None = None
    ) -> tuple[list[Episode], int]: ...

    def graded(self, episodes: Sequence[Episode]) -> tuple[list[Grade], np.ndarray]: ...

    def cut_before(
        self, episodes: Sequence[Episode], updated_agent: int
    ) -> tuple[list[Episode], int]: ...


@dataclass(frozen=True)
class HeldOut:
    """One draw's held-out groups, and its continuation of the previous draw's."""

    episodes: tuple[Episode, ...]
    """``group_size`` contiguous dialogues a group, played fresh by the draw's team."""
    rewards: np.ndarray
    """Their training rewards."""
    group_size: int
    generated_tokens: int
    """Tokens generated for the fresh groups and for the continuation (the certificate's cost)."""
    pairs: PairedDifferences | None = None
    """Per group of the previous draw's held-out groups: mean new reward minus mean old."""
    continued: tuple[Episode, ...] = ()
    """The previous draw's held-out dialogues as this draw's team continued them."""


def group_differences(new: np.ndarray, old: np.ndarray, group_size: int) -> np.ndarray:
    """Per group of ``group_size`` contiguous dialogues: mean of ``new`` minus mean of ``old``."""
    difference = np.asarray(new, dtype=np.float64) - np.asarray(old, dtype=np.float64)
    return difference.reshape(-1, group_size).mean(axis=1)


def check_in_range(rewards: np.ndarray, reward_range: tuple[float, float]) -> None:
    """A reward outside the task's declared range would void the bound: refuse it."""
    low, high = reward_range
    outside = (rewards < low) | (rewards > high)
    if outside.any():
        raise ValueError(
            f"a held-out dialogue's training reward {float(rewards[outside][0]):g} lies outside "
            f"the task's reward range [{low:g}, {high:g}] (llm.Task reward_range, plus a format "
            "bonus's weight): the measured certificate needs every reward inside it"
        )


@dataclass(frozen=True)
class Replay:
    """A coupled continuation's old dialogues, aligned with the episodes played, and the policy
    the update changed (see ``replayed_messages``)."""

    episodes: Sequence[Episode]
    changed_policy: int


def replayed_messages(
    episodes: Sequence[Episode], indices: Sequence[int], policy: int, replay: Replay | None
) -> dict[int, tuple[tuple[int, ...], torch.Tensor | None]]:
    """Of ``indices``, the episodes whose next turn, spoken for ``policy``, is its old
    dialogue's next turn again, with that turn's message and recorded log-probs: coupled
    episodes whose turns so far equal their old dialogue's, where ``policy`` is not the one the
    update changed (the same policy at the same context with the same numbers)."""
    if replay is None or policy == replay.changed_policy:
        return {}
    found = {}
    for index in indices:
        episode, old = episodes[index], replay.episodes[index]
        turn = len(episode.turns)
        if episode.noise_seed is None or episode.noise_seed != old.noise_seed:
            continue
        if turn < len(old.turns) and old.turns[:turn] == episode.turns:
            found[index] = (old.turns[turn].message, old.turns[turn].sampled_logps)
    return found


def turn_seeds(episodes: Sequence[Episode]) -> list[int] | None:
    """Per episode, the seed of its next turn's numbers: a function of its ``noise_seed`` and
    the turn's index alone (below 2**63); None where no episode is coupled."""
    coupled = [e.noise_seed is not None for e in episodes]
    if not any(coupled):
        return None
    if not all(coupled):
        raise ValueError("a turn's batch mixes coupled and uncoupled dialogues")
    seeds = []
    for episode in episodes:
        # Spawn keys >= 1 give independent streams for each (seed, turn).
        sequence = np.random.SeedSequence(episode.noise_seed, spawn_key=(len(episode.turns) + 1,))
        high, low = (int(word) for word in sequence.generate_state(2, np.uint32))
        seeds.append((high << 32 | low) >> 1)
    return seeds


def draw_held_out(
    player: Player,
    team: Any,
    groups: int,
    group_size: int,
    training_range: tuple[float, float] | None,
    previous: HeldOut | None = None,
    updated_agent: int | None = None,
    coupled: bool = True,
) -> HeldOut:
    """``groups`` fresh held-out groups of ``team`` and, where ``previous`` and
    ``updated_agent`` are given (and ``team`` differs from ``previous``'s team in that agent
    alone, which the caller checks), the pairs of its continuation. No pairs where the task's
    training rewards have no declared range (``training_range`` None). ``coupled``: the fresh
    dialogues carry noise seeds, which their continuations will read."""
    fresh, tokens = player.play(team, player.new_episodes(groups, group_size, coupled))
    _, rewards = player.graded(fresh)
    if previous is None or updated_agent is None:
        return HeldOut(tuple(fresh), rewards, group_size, tokens)
    pairs, continued, more = continue_groups(player, team, previous, updated_agent, training_range)
    return HeldOut(tuple(fresh), rewards, group_size, tokens + more, pairs, continued)


def draw_pairs(
    player: Player,
    old: Any,
    new: Any,
    updated_agent: int,
    groups: int,
    group_size: int,
    training_range: tuple[float, float] | None,
    coupled: bool = True,
) -> tuple[PairedDifferences | None, int]:
    """``groups`` fresh groups of ``old``, read by no update, continued by ``new`` from
    ``updated_agent``'s first turn (sequential held-out draws,
    ``teamtr.protocols.SequentialPairingSampler``): their pairs and the tokens generated.
    Drawn after the update, they are independent of it and of the pairs before. ``coupled``:
    the two sides read common random numbers."""
    if training_range is None:
        return None, 0
    fresh, tokens = player.play(old, player.new_episodes(groups, group_size, coupled))
    _, rewards = player.graded(fresh)
    previous = HeldOut(tuple(fresh), rewards, group_size, tokens)
    pairs, _, more = continue_groups(player, new, previous, updated_agent, training_range)
    return pairs, tokens + more


def continue_groups(
    player: Player,
    team: Any,
    previous: HeldOut,
    updated_agent: int,
    training_range: tuple[float, float] | None,
) -> tuple[PairedDifferences | None, tuple[Episode, ...], int]:
    """``previous``'s groups continued by ``team`` from ``updated_agent``'s first turn: their
    pairs (None where the training rewards have no declared range), the continued dialogues
    and the tokens generated."""
    if training_range is None:
        return None, (), 0
    cut, _ = player.cut_before(previous.episodes, updated_agent)
    continued, tokens = player.play(team, cut, replay=Replay(previous.episodes, updated_agent))
    _, new_rewards = player.graded(continued)
    for batch in (previous.rewards, new_rewards):
        check_in_range(batch, training_range)
    differences = group_differences(new_rewards, previous.rewards, previous.group_size)
    width = training_range[1] - training_range[0]
    pairs = PairedDifferences(differences, width, updated_agent=updated_agent)
    return pairs, tuple(continued), tokens
