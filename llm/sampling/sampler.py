"""Batched dialogue rollouts of a team, with prefix reuse (THEORY.md §2, Lemma 3.1).

``DialogueSampler.sample`` implements ``teamtr.protocols.Sampler``: it plays ``G`` dialogues per
problem (a GRPO group), generating each turn for all episodes at once with the KV cache and
the speaker's policy (by default merged into a generation copy of the base model, see
``llm.models.generation``), rewards each finished dialogue by its task
(``llm.problems.task.Task``: one float, or one per turn, whatever the task), and records every
message's log-probs with the training forward pass (``llm.logprobs.scoring``).

Prefix reuse: when ``team`` differs from ``previous.behaviour`` only in agent k, each previous
episode keeps its turns before agent k's first turn and only the rest is regenerated. Those
turns were produced by agents other than k, routed by a rule that ignores parameters, so their
distribution is the same under both teams; the regenerated suffix is drawn from the new team.
Each episode is therefore an exact sample of the new team (checked in
tests/llm/test_prefix_reuse.py against the exact distribution).

Dynamic sampling (``[sampler] signal_groups``, as in DAPO) and how it reuses the previous
draw's prefixes: ``llm.sampling.dynamic``; what a draw hands on: ``llm.sampling.rollouts``.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
import torch
from peft import PeftModel

from llm.common import profiling
from llm.common.devices import seeded
from llm.common.settings import SamplerSettings
from llm.conversation.dialogue import ChatFormat, Episode, Turn
from llm.conversation.environment_session import observation_text, open_episode, sessions_of
from llm.conversation.router import Router
from llm.engines.factory import make_engine
from llm.engines.protocol import Engine, TurnRequest
from llm.logprobs.losses import group_normalised_advantages
from llm.logprobs.scoring import score_chunks
from llm.models.agents import LoraTeam
from llm.problems.rewards import Grade
from llm.problems.task import Dialogue, ProblemSource, Task, verdict_of
from llm.problems.tasks import Problem
from llm.sampling.dynamic import sample_with_signal
from llm.sampling.held_out_groups import (
    Replay,
    Reserve,
    continue_groups,
    draw_held_out,
    draw_pairs,
    replayed_messages,
    turn_seeds,
)
from llm.sampling.rollouts import (
    BehaviourLogps,
    DialogueRollouts,
    group_signal,
    prefixes_reusable,
)
from teamtr.measured import PairedDifferences

HELD_OUT = "held-out "
"""The profile's prefix for the held-out groups' plays: what the measured certificate costs."""


def dialogue_of(chat: ChatFormat, episode: Episode, environment: bool) -> Dialogue:
    """``episode`` as a reward sees it; ``environment``: with the environment's text, rewards
    and opening."""
    messages = tuple(chat.message_text(turn) for turn in episode.turns)
    speakers = tuple(turn.agent for turn in episode.turns)
    if not environment:
        return Dialogue(episode.problem, messages, speakers)
    return Dialogue(
        episode.problem,
        messages,
        speakers,
        observations=tuple(observation_text(turn) for turn in episode.turns),
        environment_rewards=tuple(turn.reward for turn in episode.turns),
        opening=chat.decode(episode.prompt),
    )


class DialogueSampler:
    """Samples dialogues of a ``LoraTeam``; implements ``teamtr.protocols.Sampler``."""

    def __init__(
        self,
        chat: ChatFormat,
        router: Router,
        task: Task | ProblemSource,
        settings: SamplerSettings,
        *,
        reuse_work: bool = True,
    ) -> None:
        self.chat = chat
        self.router = router
        self.task = task if isinstance(task, Task) else Task(task)
        """Where problems come from and how finished dialogues are rewarded. A bare problem
        source gets the default reward (the final answer, by math-verify): a sampler for a
        task with a reward of its own (the chain's) must be given the task itself."""
        self.settings = settings
        self.reuse_work = reuse_work
        """Score each group's prompt once (``llm.logprobs.scoring.message_logits``; the updater must do
        the same, so that its ratio check compares identical computations), have it drawn once
        where the engine can (``Engine.shares_prompts``) and each agent's behaviour log-probs
        computed only when first asked for (``BehaviourLogps``). False: the straightforward
        path, kept as the reference of the equality tests and the profile."""
        self.engine: Engine = make_engine(chat, settings, reuse_work)
        """What draws the messages (``[sampler] engine``, ``llm.engines``); a server engine is
        started by ``llm.training.builder.build`` and stopped by ``close``."""
        self.rng = np.random.default_rng(settings.seed)
        """The sampler's generator (problems, routes, sampling seeds); checkpoints save and
        restore its state, so a resumed run draws what a straight run would."""
        self.held_out_groups = 0
        """Groups each draw holds out of the update for the measured certificate."""
        self.pair_draw_tokens: list[int] = []
        """Tokens generated for pairs outside a draw (``continue_held_out``, ``draw_pairs``),
        until ``take_pair_draw_tokens``; shared with ``with_held_out``'s copies."""
        self.chained = True
        """Held-out continuations are held out again (``with_held_out``)."""
        self.reserves: list[Reserve] = []
        """Held-out groups that sequential draws continued, of the teams of the update being
        measured (``llm.sampling.held_out_groups.Reserve``): at most two, emptied at each
        stage's first draw (a stage is what a checkpoint holds, so a resumed run draws as a
        straight one)."""

    def with_held_out(self, groups: int, chained: bool = True) -> DialogueSampler:
        """This sampler (its engine, task and generator shared) holding out ``groups`` groups
        per draw (``teamtr.protocols.PairingSampler``; ``llm.sampling.held_out_groups``), each
        draw after an update its predecessor's as the new team continued them (``chained``),
        else fresh ones."""
        if groups < 0:
            raise ValueError(f"held-out groups must be >= 0, got {groups}")
        other = copy.copy(self)
        other.held_out_groups = groups
        other.chained = chained
        other.reserves = []
        return other

    def continue_held_out(
        self, team: LoraTeam, previous: DialogueRollouts, updated_agent: int
    ) -> PairedDifferences | None:
        """The pairs of ``previous``'s held-out groups continued by ``team`` alone, no other
        group drawn (``teamtr.protocols.PairingSampler``: a stage's last update)."""
        if (
            previous.held_out is None
            or self.task.training_range is None  # no pairs without a reward range
            or not prefixes_reusable(team, previous, updated_agent)
        ):
            return None
        with self.engine.drawing(team, continues=True), profiling.prefixed(HELD_OUT):
            pairs, continued = continue_groups(
                self, team, previous.held_out, updated_agent, self.task.training_range
            )
        self.pair_draw_tokens.append(continued.generated_tokens)
        return pairs

    def draw_pairs(
        self, old: LoraTeam, new: LoraTeam, updated_agent: int, count: int
    ) -> PairedDifferences | None:
        """``count`` held-out groups of ``old`` that no pair has read, continued by ``new``
        (``teamtr.protocols.SequentialPairingSampler``;
        ``llm.sampling.held_out_groups.draw_pairs``): first the groups that the previous
        update's sequential draws continued into ``old``, then fresh ones. Their continuations
        wait, in turn, for the next update's draws. Played outside a draw, as an evaluation is:
        the engine's kept contexts stay those of the last draw."""
        with profiling.prefixed(HELD_OUT):
            pairs, continued, tokens = draw_pairs(
                self,
                old,
                new,
                updated_agent,
                count,
                self.settings.held_out_group_size,
                self.task.training_range,
                self.settings.held_out_coupled,
                self.reserve_of(old) if self.chained else None,
            )
        if continued is not None and self.chained:
            self.reserve_of(new).add(continued)
        # Only the teams of the update being measured can be read again.
        self.reserves = [r for r in self.reserves if r.team is old or r.team is new]
        self.pair_draw_tokens.append(tokens)
        return pairs

    def reserve_of(self, team: LoraTeam) -> Reserve:
        """The held-out groups of ``team`` that sequential draws continued and no pair has read
        (``reserves``), made empty where there are none."""
        for reserve in self.reserves:
            if reserve.team is team:
                return reserve
        self.reserves.append(Reserve(team))
        return self.reserves[-1]

    def take_pair_draw_tokens(self) -> int:
        """The tokens of ``pair_draw_tokens`` since the last call (the stage's records add them
        to the held-out groups' own)."""
        total = sum(self.pair_draw_tokens)
        self.pair_draw_tokens.clear()
        return total

    def close(self) -> None:
        """Stop the engine's server, if it has one (idempotent)."""
        self.engine.close()

    # -- generation ---------------------------------------------------------------------------
    def new_episodes(
        self, count: int | None = None, group_size: int | None = None, coupled: bool = False
    ) -> list[Episode]:
        """Fresh problems (``count``, by default ``prompts_per_batch``, each repeated
        ``group_size`` times, by default G, contiguously) and routing seeds; ``coupled``: and a
        noise seed each (``Episode.noise_seed``)."""
        s = self.settings
        problems = self.task.draw(self.rng, s.prompts_per_batch if count is None else count)
        episodes = []
        for problem in problems:
            for _ in range(s.group_size if group_size is None else group_size):
                route_seed = int(self.rng.integers(2**31))
                episode = self.open_episode(problem, route_seed)
                if coupled:
                    episode = replace(episode, noise_seed=int(self.rng.integers(2**62)))
                episodes.append(episode)
        return episodes

    def open_episode(self, problem: Problem, route_seed: int) -> Episode:
        """A new dialogue about ``problem`` with its seed (routing, and the task's environment:
        ``llm.conversation.environment_session.open_episode``)."""
        return open_episode(
            self.chat, problem, route_seed, self.task.environment, len(self.chat.headers)
        )

    def next_speaker(self, episode: Episode) -> int:
        """Who speaks next: the one the environment named, else the router's choice."""
        turn = len(episode.turns)
        last = episode.turns[-1] if episode.turns else None
        named = last.next_speaker if last is not None else episode.first_speaker
        if named is not None:
            return named
        return self.router.speaker(
            turn,
            episode.route_seed,
            self.chat.message_text(last) if last else None,
            last.agent if last else None,
        )

    def play(
        self,
        team: LoraTeam,
        episodes: list[Episode],
        temperature: float | None = None,
        seed: int | None = None,
        on_messages: Callable[[int], None] | None = None,
        replay: Replay | None = None,
    ) -> tuple[list[Episode], int]:
        """Complete every episode to H turns; returns them and the number of generated tokens.

        ``temperature`` overrides the policy's (0 = greedy, for evaluation only). Generation is
        seeded with ``seed``, by default the next draw of the sampler's generator (a sharded
        sampler draws every shard's seed itself, ``llm.training.distributed``). ``on_messages`` hears
        how many messages each generated batch added (for progress). ``replay``: a coupled
        continuation's old dialogues, whose turns it repeats where nothing could differ
        (``llm.sampling.held_out_groups.Replay``).
        """
        temperature = self.settings.temperature if temperature is None else temperature
        episodes = list(episodes)
        seed = int(self.rng.integers(2**31)) if seed is None else seed
        with seeded(seed):
            return self._play(team, episodes, temperature, on_messages, replay)

    def _play(
        self,
        team: LoraTeam,
        episodes: list[Episode],
        temperature: float,
        on_messages: Callable[[int], None] | None,
        replay: Replay | None = None,
    ) -> tuple[list[Episode], int]:
        s = self.settings
        generated = 0
        # Each dialogue's environment, replayed to its last kept turn (prefix reuse).
        sessions = sessions_of(self.task.environment, self.chat, episodes, len(self.chat.headers))
        while True:
            pending: dict[int, list[int]] = {}
            for index, episode in enumerate(episodes):
                # H = s.turns caps every dialogue, an environment's that never ends included.
                if len(episode.turns) < s.turns and not episode.ended:
                    pending.setdefault(self.next_speaker(episode), []).append(index)
            if not pending:
                return episodes, generated
            for agent in sorted(pending):
                indices = pending[agent]
                drawn = replayed_messages(episodes, indices, self.chat.policy(agent), replay)
                fresh = [i for i in indices if i not in drawn]
                if fresh:
                    messages = self._draw_turn(team, episodes, fresh, agent, temperature)
                    drawn.update(zip(fresh, messages, strict=True))
                    generated += sum(len(drawn[i][0]) for i in fresh)
                for index in indices:
                    message, logps = drawn[index]
                    session = sessions[index]
                    turn = (
                        Turn(agent, message, logps)
                        if session is None
                        else session.turn(agent, message, logps)
                    )
                    episodes[index] = episodes[index].with_turns([*episodes[index].turns, turn])
                if on_messages is not None:
                    on_messages(len(indices))

    def _draw_turn(
        self,
        team: LoraTeam,
        episodes: Sequence[Episode],
        indices: Sequence[int],
        agent: int,
        temperature: float,
    ) -> list[tuple[tuple[int, ...], torch.Tensor | None]]:
        """The engine's next message of ``agent`` in each episode of ``indices``, with its
        tokens' recorded log-probs (None where not recorded)."""
        s = self.settings
        contexts = [self.chat.context(episodes[i], agent) for i in indices]
        lengths = [len(episodes[i].prompt) for i in indices]
        shared = self.reuse_work and self.engine.shares_prompts(lengths)
        request = TurnRequest(
            team,
            agent,
            self.chat.policy(agent),
            contexts,
            s.max_tokens_of(agent),
            temperature,
            record=temperature > 0,
            prompt_lengths=lengths if shared else None,
            seeds=turn_seeds([episodes[i] for i in indices]),
        )
        with profiling.section(f"sampling turn {len(episodes[indices[0]].turns) + 1}"):
            drawn = self.engine.draw(request)
        recorded = drawn.logps
        return [
            (message, None if recorded is None else recorded[k])
            for k, message in enumerate(drawn.messages)
        ]

    def scored_logps(self, team: LoraTeam, episodes: tuple[Episode, ...]) -> BehaviourLogps:
        """Every message's token log-probs under its speaker, by the training forward pass:
        each agent's on first use (``BehaviourLogps``), or all of them now on the
        straightforward path (``reuse_work=False``, the reference the equality tests compare
        against)."""
        table = BehaviourLogps(
            episodes, lambda agent: self.agent_logps(team, episodes, agent), self.chat.policy
        )
        if not self.reuse_work:
            for agent in range(team.n_agents):
                table.of_agent(agent)
        return table

    def agent_logps(
        self, team: LoraTeam, episodes: Sequence[Episode], agent: int
    ) -> dict[tuple[int, int], torch.Tensor]:
        """``agent``'s message token log-probs under ``team``, keyed by (episode, turn)."""
        out = {}
        with profiling.section("behaviour log-probs"), torch.no_grad():
            for _, batch in self._score_chunks(team.use(agent), episodes, agent):
                logps = batch.token_logps()
                for row, ref in enumerate(batch.refs):
                    out[ref] = logps[row][batch.mask[row]].clone()
        return out

    def _score_chunks(self, model: PeftModel, episodes: Sequence[Episode], agent: int):
        return score_chunks(
            model,
            self.chat,
            episodes,
            agent,
            self.settings.score_chunk,
            self.settings.temperature,
            share_prompt=self.reuse_work,
        )

    def dialogue(self, episode: Episode) -> Dialogue:
        """A finished episode as its task's reward sees it: the problem and each turn's text."""
        return dialogue_of(self.chat, episode, self.task.environment is not None)

    def graded(self, episodes: Sequence[Episode]) -> tuple[list[Grade], np.ndarray]:
        """Each finished episode's final-answer grade and training reward (the task's
        ``training_reward``)."""
        with profiling.section("grading"):
            dialogues = [self.dialogue(e) for e in episodes]
            grades = [verdict_of(d) for d in dialogues]
            rewards = np.array([self.task.training_reward(d) for d in dialogues], dtype=float)
        return grades, rewards

    def finish(
        self,
        team: LoraTeam,
        episodes: list[Episode],
        generated: int,
        reused: int,
        started: float,
        graded: tuple[list[Grade], np.ndarray] | None = None,
        draws: tuple[int, int] | None = None,
        pool: Sequence[Episode] = (),
    ) -> DialogueRollouts:
        """The rollouts of finished ``episodes``; ``graded``: their grades and rewards when
        known already; ``draws``: groups drawn and those with signal, when more groups were
        played than the batch keeps (dynamic sampling)."""
        grades, rewards = self.graded(episodes) if graded is None else graded
        if draws is None:
            signal = group_signal(rewards, self.settings.group_size)
            draws = (len(signal), int(signal.sum()))
        advantages = group_normalised_advantages(
            torch.tensor(rewards), self.settings.group_size, self.settings.a_max
        ).numpy()
        frozen = tuple(episodes)
        return DialogueRollouts(
            behaviour=team,
            episodes=frozen,
            rewards=rewards,
            parsed=np.array([g.parsed for g in grades]),
            advantages=advantages,
            old_logps=self.scored_logps(team, frozen),
            horizon=self.settings.turns,
            group_size=self.settings.group_size,
            a_max=self.settings.a_max,
            temperature=self.settings.temperature,
            weights=np.ones(len(episodes)),
            generated_tokens=generated,
            reused_turns=reused,
            wall_seconds=time.perf_counter() - started,
            groups_drawn=draws[0],
            groups_with_signal=draws[1],
            pool=tuple(pool),
            drawn_by=self.engine.drawn_by(team),
        )

    # -- the Sampler protocol -----------------------------------------------------------------
    def sample(
        self,
        team: LoraTeam,
        *,
        previous: DialogueRollouts | None = None,
        updated_agent: int | None = None,
    ) -> DialogueRollouts:
        """On-policy rollouts of ``team``, reusing prefixes of ``previous`` where exact; with
        ``signal_groups`` > 0, fresh groups filtered for differing rewards (and no reuse)."""
        started = time.perf_counter()
        reusable = prefixes_reusable(team, previous, updated_agent)
        if previous is None:  # a stage's first draw
            self.reserves.clear()
        with self.engine.drawing(team, continues=reusable):
            rollouts = self._training_draw(team, started, reusable, previous, updated_agent)
            if not self.held_out_groups:
                return rollouts
            with profiling.prefixed(HELD_OUT):
                held_out = draw_held_out(
                    self,
                    team,
                    self.held_out_groups,
                    self.settings.held_out_group_size,
                    self.task.training_range,
                    previous.held_out if reusable and previous is not None else None,
                    updated_agent,
                    self.settings.held_out_coupled,
                    self.chained,
                )
        return replace(rollouts, held_out=held_out)

    def _training_draw(
        self,
        team: LoraTeam,
        started: float,
        reusable: bool,
        previous: DialogueRollouts | None,
        updated_agent: int | None,
    ) -> DialogueRollouts:
        """The groups the updater reads (``sample``'s draw without the held-out groups)."""
        if self.settings.signal_groups:
            pooled = previous if reusable else None
            return sample_with_signal(self, team, started, pooled, updated_agent)
        if not reusable:
            episodes, generated = self.play(team, self.new_episodes())
            return self.finish(team, episodes, generated, 0, started)
        assert previous is not None and updated_agent is not None
        truncated, reused = self.reusable_prefixes(previous, updated_agent)
        episodes, generated = self.play(team, truncated)
        return self.finish(team, episodes, generated, reused, started)

    def reusable_prefixes(
        self, previous: DialogueRollouts, updated_agent: int
    ) -> tuple[list[Episode], int]:
        """``previous``'s episodes cut before the first turn spoken for ``updated_agent``, and
        how many turns they keep (see ``prefixes_reusable`` for when this is exact)."""
        return self.cut_before(previous.episodes, updated_agent)

    def cut_before(
        self, episodes: Sequence[Episode], updated_agent: int
    ) -> tuple[list[Episode], int]:
        """``episodes`` cut before the first turn spoken for ``updated_agent``, and how many
        turns they keep."""
        truncated = []
        reused = 0
        for episode in episodes:
            first = episode.first_turn_of(updated_agent, self.chat.policy_of)
            keep = len(episode.turns) if first is None else first
            truncated.append(episode.with_turns(episode.turns[:keep]))
            reused += keep
        return truncated, reused

    def importance_weighted(self, rollouts: DialogueRollouts, team: LoraTeam) -> DialogueRollouts:
        """HAPPO: weight each episode by the product of the changed agents' message ratios."""
        log_weights = np.zeros(len(rollouts.episodes))
        for agent in team.differing_agents(rollouts.behaviour):
            # Before ``team`` is loaded into the backbone: the behaviour team's pass.
            behaviour = rollouts.behaviour_logps(agent, self.chat.policy, recorded=False)
            with profiling.section("importance weights"), torch.no_grad():
                scored = list(self._score_chunks(team.use(agent), rollouts.episodes, agent))
            for _, batch in scored:
                logps = batch.token_logps()
                for row, (e, t) in enumerate(batch.refs):
                    new = float(logps[row][batch.mask[row]].sum())
                    old = float(behaviour[(e, t)].sum())
                    log_weights[e] += new - old
        return replace(rollouts, weights=np.exp(log_weights))
