"""Held-out groups: dialogues no update sees, continued by the next team to measure an update.

A stage's first draw of a sampler with held-out groups (``DialogueSampler.with_held_out``) also
plays ``groups`` fresh problems of the same team, ``[sampler] held_out_group_size`` dialogues
each (by default 1), that the updater never reads (they are not in
``DialogueRollouts.episodes``: not in the gradient, nor in the KL). The next draw, after agent
k's update, cuts each of them before the first turn spoken for k (the same cut as prefix reuse:
the kept turns were drawn by agents the update did not change, so they are distributed alike
under both teams, Lemma 3.1's setting) and plays the rest with the new team. Per group, the
mean new training reward minus the mean old has expectation J(new) - J(old); the groups were
held out and their problems drawn independently, so the differences of one update are i.i.d.
given it: the pairs of ``teamtr.measured`` (one per group, so n = groups). One dialogue a
problem gives the most pairs for the tokens: the finite-n bounds pay for the reward's range
as 1/n, and a group's mean narrows only the variance.

**A chain**: the continued dialogues are exact draws of the new team on problems no update
read, so they are that draw's held-out groups, which the next update's draw continues in turn;
after a stage's first draw no fresh held-out group is played. Pairs drawn on for an update
(sequential draws, ``draw_pairs``) leave their continuations to the next update's sequential
draws (``Reserve``). A pair then costs its continuation alone; its old side was paid for by
the update before.

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
from dataclasses import dataclass, replace
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
    chained: bool = True,
) -> HeldOut:
    """The held-out groups of a draw of ``team``: where ``previous`` and ``updated_agent`` are
    given (and ``team`` differs from ``previous``'s team in that agent alone, which the caller
    checks), ``previous``'s groups continued by ``team``, with their pairs; else ``groups``
    fresh groups (``coupled``: with noise seeds, which their continuations will read). The
    continued dialogues are exact draws of ``team`` on problems no update read (``continue_groups``),
    so they are the groups the next update's pairs continue (a chain): no fresh group is played
    after a stage's first draw. ``chained`` False: fresh groups after every draw, the
    continuations used for the pairs only. No pairs where the task's training rewards have no
    declared range (``training_range`` None): then fresh groups, as without ``previous``."""
    if previous is None or updated_agent is None or training_range is None:
        return played_groups(player, team, groups, group_size, coupled)
    if chained:
        pairs, continued = continue_groups(player, team, previous, updated_agent, training_range)
        return replace(continued, pairs=pairs, continued=continued.episodes)
    fresh = played_groups(player, team, groups, group_size, coupled)
    pairs, continued = continue_groups(player, team, previous, updated_agent, training_range)
    tokens = fresh.generated_tokens + continued.generated_tokens
    return replace(fresh, generated_tokens=tokens, pairs=pairs, continued=continued.episodes)


def played_groups(
    player: Player, team: Any, groups: int, group_size: int, coupled: bool
) -> HeldOut:
    """``groups`` fresh groups of ``team``, played now (``coupled``: with noise seeds)."""
    fresh, tokens = player.play(team, player.new_episodes(groups, group_size, coupled))
    _, rewards = player.graded(fresh)
    return HeldOut(tuple(fresh), rewards, group_size, tokens)


@dataclass
class Reserve:
    """Held-out dialogues of one team that no pair has read yet, in the order they were drawn:
    the continuations of the pairs that sequential draws added to an update
    (``DialogueSampler.draw_pairs``). The next update's sequential draws take them as their old
    sides before they play fresh groups: each is an exact draw of that update's starting team
    on a problem no update read, as a fresh group is. Which of them an update's draws took
    depended on the pairs before (a stopping rule); the ones left are the rest of an i.i.d.
    sequence after a stopping time, independent of what was read, and fresh groups after them
    continue the same i.i.d. sequence, so the pairs stay i.i.d. given the update."""

    team: Any
    held_out: HeldOut | None = None

    def take(self, groups: int) -> HeldOut | None:
        """Up to ``groups`` of its groups, first drawn first, removed from the reserve."""
        if self.held_out is None or groups <= 0:
            return None
        taken, self.held_out = split_groups(self.held_out, groups)
        return taken

    def add(self, held_out: HeldOut) -> None:
        """``held_out``'s groups after those it holds."""
        self.held_out = held_out if self.held_out is None else joined(self.held_out, held_out)


def group_count(held_out: HeldOut) -> int:
    """How many groups ``held_out`` holds."""
    return len(held_out.episodes) // held_out.group_size


def split_groups(held_out: HeldOut, groups: int) -> tuple[HeldOut, HeldOut | None]:
    """``held_out``'s first ``groups`` groups and the rest (None where none is left), without
    pairs or tokens (those were counted when they were drawn)."""
    cut = min(groups, group_count(held_out)) * held_out.group_size
    first = HeldOut(held_out.episodes[:cut], held_out.rewards[:cut], held_out.group_size, 0)
    if cut == len(held_out.episodes):
        return first, None
    rest = HeldOut(held_out.episodes[cut:], held_out.rewards[cut:], held_out.group_size, 0)
    return first, rest


def joined(first: HeldOut, second: HeldOut) -> HeldOut:
    """The groups of ``first`` then ``second`` (of one team, one group size), without pairs."""
    if first.group_size != second.group_size:
        raise ValueError("held-out groups of different sizes cannot be joined")
    return HeldOut(
        first.episodes + second.episodes,
        np.concatenate([first.rewards, second.rewards]),
        first.group_size,
        first.generated_tokens + second.generated_tokens,
    )


def draw_pairs(
    player: Player,
    old: Any,
    new: Any,
    updated_agent: int,
    groups: int,
    group_size: int,
    training_range: tuple[float, float] | None,
    coupled: bool = True,
    reserve: Reserve | None = None,
) -> tuple[PairedDifferences | None, HeldOut | None, int]:
    """``groups`` held-out groups of ``old`` that no pair has read, continued by ``new`` from
    ``updated_agent``'s first turn (sequential held-out draws,
    ``teamtr.protocols.SequentialPairingSampler``): first those of ``reserve`` (of ``old``;
    ``Reserve``), then fresh ones played now. Their pairs, the continued groups (of ``new``)
    and the tokens generated. Drawn after the update, they are independent of it and of the
    pairs before. ``coupled``: the fresh groups' two sides read common random numbers."""
    if training_range is None:
        return None, None, 0
    taken = reserve.take(groups) if reserve is not None else None
    missing = groups - (group_count(taken) if taken is not None else 0)
    tokens = 0
    if missing > 0:
        played = played_groups(player, old, missing, group_size, coupled)
        tokens = played.generated_tokens
        taken = played if taken is None else joined(taken, played)
    assert taken is not None  # groups >= 1: taken from the reserve or played
    pairs, continued = continue_groups(player, new, taken, updated_agent, training_range)
    return pairs, continued, tokens + continued.generated_tokens


def continue_groups(
    player: Player,
    team: Any,
    previous: HeldOut,
    updated_agent: int,
    training_range: tuple[float, float],
) -> tuple[PairedDifferences, HeldOut]:
    """``previous``'s groups continued by ``team`` from ``updated_agent``'s first turn: their
    pairs, and the continued dialogues as held-out groups of ``team`` (their training rewards,
    the tokens generated for them, no pairs). Where ``team`` differs from ``previous``'s team
    in ``updated_agent`` alone, each continued dialogue is an exact draw of ``team`` (the kept
    turns are distributed alike under both teams, Lemma 3.1's setting)."""
    cut, _ = player.cut_before(previous.episodes, updated_agent)
    continued, tokens = player.play(team, cut, replay=Replay(previous.episodes, updated_agent))
    _, new_rewards = player.graded(continued)
    for batch in (previous.rewards, new_rewards):
        check_in_range(batch, training_range)
    differences = group_differences(new_rewards, previous.rewards, previous.group_size)
    width = training_range[1] - training_range[0]
    pairs = PairedDifferences(differences, width, updated_agent=updated_agent)
    return pairs, HeldOut(tuple(continued), new_rewards, previous.group_size, tokens)
