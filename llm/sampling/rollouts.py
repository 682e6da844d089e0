"""What a draw of dialogues hands on: ``DialogueRollouts`` (episodes of one behaviour team with
their rewards, advantages and behaviour log-probs), the behaviour log-probs computed per agent on
first use (``BehaviourLogps``), which groups carry a signal, and when a draw may lend its prefixes
to the next team's (THEORY.md §2, Lemma 3.1; ``llm.sampling.sampler``'s docstring).
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from llm.conversation.dialogue import Episode, Turn
from llm.models.agents import LoraTeam
from llm.sampling.held_out_groups import HeldOut
from teamtr.measured import PairedDifferences


class BehaviourLogps(Sequence[Sequence[torch.Tensor]]):
    """Per episode, per turn: the message's token log-probs under the behaviour team, each
    agent's computed on first use (``logps[e][t]``, as the tuple of tuples it stands for).

    An update reads only its own agent's log-probs (the ratio check), and TeamTR samples again
    after every update: scoring every agent's messages at every sampling round would cost
    n - 1 training forward passes per round that nothing reads. The values are those the eager
    computation gives, bit for bit: the same forward pass of the same (immutable) behaviour
    team on the same chunks, only later.
    """

    def __init__(
        self,
        episodes: tuple[Episode, ...],
        compute: Callable[[int], dict[tuple[int, int], torch.Tensor]],
        policy: Callable[[int], int] = int,
    ) -> None:
        self._episodes = episodes
        self._compute = compute
        self._policy = policy
        self._per_agent: dict[int, dict[tuple[int, int], torch.Tensor]] = {}

    def of_agent(self, agent: int) -> dict[tuple[int, int], torch.Tensor]:
        """Policy ``agent``'s message log-probs, keyed by (episode, turn); computed on the first
        call, which loads the behaviour team's adapter into the shared backbone."""
        if agent not in self._per_agent:
            self._per_agent[agent] = self._compute(agent)
        return self._per_agent[agent]

    def turn(self, episode: int, turn: int) -> torch.Tensor:
        agent = self._policy(self._episodes[episode].turns[turn].agent)
        return self.of_agent(agent).get((episode, turn), torch.zeros(0))

    def __len__(self) -> int:
        return len(self._episodes)

    def __getitem__(self, episode):  # type: ignore[override]
        if isinstance(episode, slice):
            return tuple(self[e] for e in range(len(self))[episode])
        return _EpisodeLogps(self, episode)


class _EpisodeLogps(Sequence[torch.Tensor]):
    def __init__(self, table: BehaviourLogps, episode: int) -> None:
        self._table = table
        self._episode = episode
        self._turns = len(table._episodes[episode].turns)

    def __len__(self) -> int:
        return self._turns

    def __getitem__(self, turn):  # type: ignore[override]
        if isinstance(turn, slice):
            return tuple(self[t] for t in range(self._turns)[turn])
        if not -self._turns <= turn < self._turns:
            raise IndexError(turn)
        return self._table.turn(self._episode, turn % self._turns)


@dataclass(frozen=True)
class DialogueRollouts:
    """Episodes of one behaviour team with rewards, advantages and behaviour log-probs."""

    behaviour: LoraTeam
    episodes: tuple[Episode, ...]
    rewards: np.ndarray
    parsed: np.ndarray
    """False where the final answer could not be parsed (scored 0: fail-closed)."""
    advantages: np.ndarray
    """Group-normalised, clipped to A_max; one per episode, shared by all its turns."""
    old_logps: Sequence[Sequence[torch.Tensor]]
    """Per episode, per turn: the message's token log-probs under ``behaviour`` (a
    ``BehaviourLogps`` computes each agent's on first use)."""
    horizon: int
    """H: turns per dialogue (the horizon of the turn-level episodic MDP)."""
    group_size: int
    """G: dialogues per problem, contiguous in ``episodes`` (the GRPO groups)."""
    a_max: float
    """A_max: the clip applied to ``advantages``, the certificate's advantage bound."""
    temperature: float
    """T of the policy softmax(logits / T) that sampled them; training scores at the same T."""
    weights: np.ndarray = field(default_factory=lambda: np.ones(0))
    """Per-episode importance weights (HAPPO); ones for on-policy rollouts."""
    generated_tokens: int = 0
    """Tokens generated to produce these rollouts (reused turns cost nothing)."""
    reused_turns: int = 0
    wall_seconds: float = 0.0
    groups_drawn: int = 0
    """GRPO groups played for these rollouts, those dynamic sampling discarded included."""
    groups_with_signal: int = 0
    """Of ``groups_drawn``, those whose dialogues earned differing rewards."""
    pool: tuple[Episode, ...] = ()
    """With dynamic sampling: every group played for these rollouts, kept or not, in the
    order played (G contiguous episodes a group): exact samples of ``behaviour`` whose
    prefixes the next team's resample may reuse (``llm.sampling.dynamic``)."""
    drawn_by: str = ""
    """What drew the messages (``Engine.drawn_by``): engine, precision, LoRA sum."""
    held_out: HeldOut | None = None
    """Groups played beside these that no update reads, and the pairs of this draw's
    continuation of the previous draw's (``llm.sampling.held_out_groups``); None without any."""

    @property
    def pairs(self) -> PairedDifferences | None:
        """The measured certificate's pairs (``teamtr.protocols.PairedRollouts``)."""
        return self.held_out.pairs if self.held_out is not None else None

    @property
    def parse_failure_rate(self) -> float:
        return float(1.0 - self.parsed.mean())

    @property
    def held_signal_groups(self) -> int:
        """Groups of this batch whose dialogues earned differing rewards (the others give the
        updater advantages of 0)."""
        return int(group_signal(self.rewards, self.group_size).sum())

    @property
    def mean_reward(self) -> float:
        return float(self.rewards.mean())

    def episode_weights(self) -> np.ndarray:
        return self.weights if self.weights.size else np.ones(len(self.episodes))

    def _turns_of(self, agent: int, policy: Callable[[int], int]) -> list[tuple[int, int, Turn]]:
        """(episode, turn index, turn) of policy ``agent``'s non-empty messages."""
        return [
            (e, t, turn)
            for e, episode in enumerate(self.episodes)
            for t, turn in enumerate(episode.turns)
            if policy(turn.agent) == agent and turn.message
        ]

    def recorded_logps(
        self, agent: int, policy: Callable[[int], int]
    ) -> dict[tuple[int, int], torch.Tensor] | None:
        """The log-probs the sampler recorded while drawing policy ``agent``'s messages
        (``Turn.sampled_logps``), keyed by (episode, turn); None unless every message has them."""
        sampled = {(e, t): turn.sampled_logps for e, t, turn in self._turns_of(agent, policy)}
        if all(logps is not None for logps in sampled.values()):
            return typing.cast(dict[tuple[int, int], torch.Tensor], sampled)
        return None

    def behaviour_logps(
        self, agent: int, policy: Callable[[int], int], *, recorded: bool = True
    ) -> dict[tuple[int, int], torch.Tensor]:
        """Policy ``agent``'s message token log-probs under the behaviour team, keyed by
        (episode, turn): the one place they are read from, by one rule. With ``recorded``, the
        log-probs the sampler recorded while drawing each message (``Turn.sampled_logps``) where
        every message of the agent has them; otherwise the behaviour team's training forward
        pass (``old_logps``), computed at this call if not before. That pass loads the behaviour
        team into the shared backbone: call this before loading another team into it.
        ``policy`` maps a speaker to its policy."""
        sampled = self.recorded_logps(agent, policy) if recorded else None
        if sampled is not None:
            return sampled
        turns = self._turns_of(agent, policy)
        if isinstance(self.old_logps, BehaviourLogps):
            return self.old_logps.of_agent(agent)
        return {(e, t): self.old_logps[e][t] for e, t, _ in turns}


def group_signal(rewards: np.ndarray, group_size: int) -> np.ndarray:
    """Per GRPO group (``group_size`` contiguous rewards): whether its rewards differ."""
    groups = np.asarray(rewards, dtype=float).reshape(-1, group_size)
    return groups.max(axis=1) > groups.min(axis=1)


def prefixes_reusable(
    team: LoraTeam, previous: DialogueRollouts | None, updated_agent: int | None
) -> bool:
    """Whether ``previous`` rollouts may lend their prefixes to ``team``'s: only when ``team``
    differs from the team that sampled them in ``updated_agent`` alone (or not at all), so the
    turns before that agent's first turn are still exact samples of ``team``."""
    return (
        previous is not None
        and updated_agent is not None
        and team.differing_agents(previous.behaviour) in ((updated_agent,), ())
    )
