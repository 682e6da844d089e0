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

Dynamic sampling (``signal_groups`` > 0, as in DAPO): a GRPO group whose dialogues all earn
the same reward gives every one of them advantage 0, and a batch of such groups teaches
nothing. The sampler then draws further groups (new problems, each a full group of G fresh
dialogues of ``team``), a round of up to ``prompts_per_batch`` at a time, until
``signal_groups`` of the groups drawn have differing rewards or ``max_draws`` extra groups
have been drawn. The batch keeps ``prompts_per_batch`` groups, in the order drawn: those with
differing rewards first in the choice (up to the batch's size), then, if too few were found,
groups without (the first drawn) to fill it. Every group is an i.i.d. draw of ``team`` and the
choice looks only at which groups have differing rewards, so each kept group is an exact
sample of ``team`` conditional on its signal, by a rule that is the same for every team and
scheme. The batch keeps its size so that the updater's KL statistic and token means rest on as
many dialogues as without the filter (and every scheme updates on batches of one size); a
filler group costs the gradient nothing (its advantages are 0).

Prefix reuse and the filter do not combine exactly: the prefixes of a filtered batch are
tilted towards those after which the previous team's dialogues had differing rewards, so
continuing them would not sample the new team (nor the new team under the filter). With
dynamic sampling on, a call with ``previous`` therefore draws fresh groups like any other
(``reused_turns`` = 0): TeamTR's resamples of the intermediate teams pay for whole dialogues,
and every batch of every scheme is a filtered fresh draw of its team.
"""

from __future__ import annotations

import time
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from peft import PeftModel
from transformers import GenerationConfig, PreTrainedModel

from llm.common import profiling
from llm.common.devices import model_device
from llm.common.hf_compat import cache_argument, cache_of
from llm.common.settings import SamplerSettings
from llm.conversation.dialogue import ChatFormat, Episode, Turn
from llm.conversation.router import Router
from llm.logprobs.losses import group_normalised_advantages
from llm.logprobs.scoring import score_chunks
from llm.models.agents import LoraTeam
from llm.problems.rewards import Grade
from llm.problems.task import Dialogue, ProblemSource, Task, verdict_of


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


def recorded_logps(
    rollouts: DialogueRollouts, agent: int, policy: Callable[[int], int]
) -> dict[tuple[int, int], torch.Tensor] | None:
    """The log-probs the sampler recorded for policy ``agent``'s messages (``Turn.sampled_logps``),
    keyed by (episode, turn), or None when any of them lacks its own: then the behaviour pass
    (``rollouts.old_logps``) gives them. ``policy`` maps a speaker to its policy."""
    found = {}
    for e, episode in enumerate(rollouts.episodes):
        for t, turn in enumerate(episode.turns):
            if policy(turn.agent) != agent or not turn.message:
                continue
            if turn.sampled_logps is None:
                return None
            found[(e, t)] = turn.sampled_logps
    return found


def prepare_logps(rollouts: DialogueRollouts, agent: int) -> None:
    """Compute ``agent``'s behaviour log-probs now, if they are computed lazily: that loads the
    behaviour team into the backbone, which must happen before the caller loads another team."""
    if isinstance(rollouts.old_logps, BehaviourLogps):
        rollouts.old_logps.of_agent(agent)


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


def generate_messages(
    model: PreTrainedModel | PeftModel,
    contexts: Sequence[Sequence[int]],
    chat: ChatFormat,
    max_new_tokens: int,
    temperature: float,
    prompt_lengths: Sequence[int] | None = None,
    sampled_logps: list[torch.Tensor] | None = None,
) -> list[tuple[int, ...]]:
    """One message per context, sampled with the KV cache (temperature 0 = greedy).

    Pure sampling from softmax(logits / temperature): no top-k/top-p/repetition warpers, so
    the messages follow exactly the policy the updater trains.

    ``prompt_lengths`` (one per context) marks each context's first tokens as its prompt: every
    distinct prompt then runs through the model once, and its rows continue from that key/value
    cache (causal attention: a prompt's keys and values do not depend on what follows it), so a
    group of G dialogues on one problem pays for its prompt once instead of G times.

    ``sampled_logps``, when a list is given (sampling only), receives one tensor per message: the
    log-probability of each of its tokens under the distribution it was drawn from,
    log softmax(logits / T), as the generating model computed it (for measuring its gap from the
    training forward pass, ``bench/behaviour_logp_gap.py``).
    """
    rows = len(contexts)
    if prompt_lengths is None:
        width = max(len(c) for c in contexts)
        input_ids = torch.full((rows, width), chat.pad_id, dtype=torch.long)
        attention = torch.zeros((rows, width), dtype=torch.long)
        for row, context in enumerate(contexts):  # left padding: generation continues right
            input_ids[row, width - len(context) :] = torch.tensor(context)
            attention[row, width - len(context) :] = 1
        cache = None
    else:
        input_ids, attention, cache = _prompt_cache(model, contexts, chat, prompt_lengths)
        width = input_ids.shape[1]
    greedy = temperature == 0
    record = sampled_logps is not None
    if record and greedy:
        raise ValueError("sampled_logps needs sampling (temperature > 0)")
    config = GenerationConfig(
        do_sample=not greedy,
        temperature=None if greedy else temperature,
        top_k=None if greedy else 0,
        top_p=None if greedy else 1.0,
        max_new_tokens=max_new_tokens,
        eos_token_id=chat.stop_id,
        pad_token_id=chat.pad_id,
        output_scores=record,
        return_dict_in_generate=record,
    )
    device = model_device(model)
    # A PeftModel forwards ``generate`` to the model it wraps; its stubs do not declare it.
    generate = typing.cast(Callable[..., typing.Any], model.generate)
    with torch.no_grad():
        output = generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            generation_config=config,
            **cache_argument(cache),
        )
    sequences = output.sequences if record else output
    messages = []
    new_tokens = sequences[:, width:]
    if sampled_logps is not None:
        # ``scores`` are the processed logits each token was drawn from: logits / T here
        # (top-k 0 and top-p 1 add no other processor). (rows, steps) after the gather.
        drawn = torch.stack(
            [
                torch.log_softmax(scores.float(), dim=-1).gather(-1, new_tokens[:, [step]])[:, 0]
                for step, scores in enumerate(output.scores)
            ],
            dim=1,
        ).cpu()
    for row, tokens in enumerate(new_tokens.tolist()):
        cut = tokens.index(chat.stop_id) + 1 if chat.stop_id in tokens else len(tokens)
        messages.append(tuple(tokens[:cut]))
        if sampled_logps is not None:
            sampled_logps.append(drawn[row, :cut])
    profiling.count("generated tokens", sum(len(m) for m in messages))
    profiling.count("generation steps", sequences.shape[1] - width)
    profiling.count("generation rows", rows)
    return messages


def _prompt_cache(
    model: torch.nn.Module,
    contexts: Sequence[Sequence[int]],
    chat: ChatFormat,
    prompt_lengths: Sequence[int],
):
    """Inputs laid out as [left-padded prompt | left-padded rest] and the prompts' cache.

    The padding between prompt and rest is masked; positions follow the attention mask, so
    every real token sits at the position it has in its unpadded context.
    """
    # All but each prompt's last token, so that every row keeps at least one token to process.
    prompts = [tuple(c[: p - 1]) for c, p in zip(contexts, prompt_lengths, strict=True)]
    if min(len(p) for p in prompts) == 0:
        raise ValueError("prompt_lengths must be >= 2 (one-token prompts share nothing)")
    distinct = list(dict.fromkeys(prompts))
    group_of = [distinct.index(p) for p in prompts]
    prompt_width = max(len(p) for p in distinct)
    rest_width = max(len(c) - len(p) for c, p in zip(contexts, prompts, strict=True))
    rows = len(contexts)
    prefix_ids = torch.full((len(distinct), prompt_width), chat.pad_id, dtype=torch.long)
    prefix_mask = torch.zeros((len(distinct), prompt_width), dtype=torch.long)
    for g, prompt in enumerate(distinct):
        prefix_ids[g, prompt_width - len(prompt) :] = torch.tensor(prompt)
        prefix_mask[g, prompt_width - len(prompt) :] = 1
    device = model_device(model)
    with torch.no_grad():
        cache = cache_of(
            model(
                input_ids=prefix_ids.to(device),
                attention_mask=prefix_mask.to(device),
                position_ids=(prefix_mask.cumsum(-1) - 1).clamp(min=0).to(device),
                use_cache=True,
            )
        )
    cache.reorder_cache(torch.tensor(group_of, device=device))  # one cache row per context
    input_ids = torch.full((rows, prompt_width + rest_width), chat.pad_id, dtype=torch.long)
    attention = torch.zeros((rows, prompt_width + rest_width), dtype=torch.long)
    for row, (context, prompt) in enumerate(zip(contexts, prompts, strict=True)):
        input_ids[row, :prompt_width] = prefix_ids[group_of[row]]
        attention[row, :prompt_width] = prefix_mask[group_of[row]]
        rest = context[len(prompt) :]
        input_ids[row, input_ids.shape[1] - len(rest) :] = torch.tensor(rest, dtype=torch.long)
        attention[row, attention.shape[1] - len(rest) :] = 1
    return input_ids, attention, cache


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
        """Where problems come from and how finished dialogues are rewarded (a bare problem
        source gets the default reward: the final answer, by math-verify)."""
        self.settings = settings
        self.reuse_work = reuse_work
        """Score each group's prompt once (``llm.logprobs.scoring.message_logits``; the updater must do
        the same, so that its ratio check compares identical computations) and each agent's
        behaviour log-probs only when first asked for (``BehaviourLogps``). False: the
        straightforward path, kept as the reference of the equality tests and the profile."""
        self.rng = np.random.default_rng(settings.seed)
        """The sampler's generator (problems, routes, sampling seeds); checkpoints save and
        restore its state, so a resumed run draws what a straight run would."""

    # -- generation ---------------------------------------------------------------------------
    def new_episodes(self, count: int | None = None) -> list[Episode]:
        """Fresh problems (``count``, by default ``prompts_per_batch``, each repeated G times,
        contiguously) and routing seeds."""
        s = self.settings
        problems = self.task.draw(self.rng, s.prompts_per_batch if count is None else count)
        episodes = []
        for problem in problems:
            prompt = tuple(self.chat.encode_prompt(problem.question))
            for _ in range(s.group_size):
                route_seed = int(self.rng.integers(2**31))
                episodes.append(Episode(problem, prompt, route_seed))
        return episodes

    def next_speaker(self, episode: Episode) -> int:
        turn = len(episode.turns)
        last = episode.turns[-1] if episode.turns else None
        return self.router.speaker(
            turn,
            episode.route_seed,
            self.chat.message_text(last) if last else None,
            last.agent if last else None,
        )

    def speaker_model(self, team: LoraTeam, speaker: int) -> PreTrainedModel | PeftModel:
        """The model that generates ``speaker``'s messages (see ``merged_generation``): its
        policy's adapter."""
        policy = self.chat.policy(speaker)
        if self.settings.merged_generation:
            return team.generation_model(policy)
        return team.use(policy)

    def play(
        self,
        team: LoraTeam,
        episodes: list[Episode],
        temperature: float | None = None,
        seed: int | None = None,
        on_messages: Callable[[int], None] | None = None,
    ) -> tuple[list[Episode], int]:
        """Complete every episode to H turns; returns them and the number of generated tokens.

        ``temperature`` overrides the policy's (0 = greedy, for evaluation only). Generation is
        seeded with ``seed``, by default the next draw of the sampler's generator (a sharded
        sampler draws every shard's seed itself, ``llm.training.distributed``). ``on_messages`` hears
        how many messages each generated batch added (for progress).
        """
        s = self.settings
        temperature = s.temperature if temperature is None else temperature
        episodes = list(episodes)
        generated = 0
        torch.manual_seed(int(self.rng.integers(2**31)) if seed is None else seed)
        while True:
            pending: dict[int, list[int]] = {}
            for index, episode in enumerate(episodes):
                if len(episode.turns) < s.turns:
                    pending.setdefault(self.next_speaker(episode), []).append(index)
            if not pending:
                return episodes, generated
            for agent in sorted(pending):
                indices = pending[agent]
                model = self.speaker_model(team, agent)
                contexts = [self.chat.context(episodes[i], agent) for i in indices]
                lengths = [len(episodes[i].prompt) for i in indices]
                # Whole contexts when prompts are not shared (a one-token prompt shares nothing).
                prompt_lengths = lengths if self.reuse_work and min(lengths) >= 2 else None
                recorded: list[torch.Tensor] | None = (
                    [] if self.records_logps(model, temperature) else None
                )
                with profiling.section(f"sampling turn {len(episodes[indices[0]].turns) + 1}"):
                    messages = generate_messages(
                        model,
                        contexts,
                        self.chat,
                        s.max_tokens_of(agent),
                        temperature,
                        prompt_lengths,
                        sampled_logps=recorded,
                    )
                for k, (index, message) in enumerate(zip(indices, messages, strict=True)):
                    episode = episodes[index]
                    turn = Turn(agent, message, None if recorded is None else recorded[k])
                    episodes[index] = episode.with_turns([*episode.turns, turn])
                    generated += len(message)
                if on_messages is not None:
                    on_messages(len(messages))

    def records_logps(self, model: torch.nn.Module, temperature: float) -> bool:
        """Whether sampling with ``model`` records each token's log-prob on its turn
        (``[sampler] behaviour_logps``): "sampled", a sampling temperature, a float32 model
        (the check's tolerance is float32 rounding) and the default path (``reuse_work``)."""
        return (
            self.settings.behaviour_logps == "sampled"
            and temperature > 0
            and self.reuse_work
            and all(p.dtype == torch.float32 for p in model.parameters() if p.is_floating_point())
        )

    def behaviour_logps(
        self, team: LoraTeam, episodes: Sequence[Episode]
    ) -> tuple[tuple[torch.Tensor, ...], ...]:
        """Every message's token log-probs under its speaker, by the training forward pass."""
        per_episode: list[list[torch.Tensor]] = [[torch.zeros(0)] * len(e.turns) for e in episodes]
        for agent in range(team.n_agents):
            for (e, t), logps in self.agent_logps(team, episodes, agent).items():
                per_episode[e][t] = logps
        return tuple(tuple(turns) for turns in per_episode)

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
        return Dialogue(
            episode.problem,
            tuple(self.chat.message_text(turn) for turn in episode.turns),
            tuple(turn.agent for turn in episode.turns),
        )

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
            old_logps=BehaviourLogps(
                frozen, lambda agent: self.agent_logps(team, frozen, agent), self.chat.policy
            )
            if self.reuse_work
            else self.behaviour_logps(team, frozen),
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
        if self.settings.signal_groups:
            return self.sample_with_signal(team, started)
        reusable = prefixes_reusable(team, previous, updated_agent)
        if not reusable:
            episodes, generated = self.play(team, self.new_episodes())
            return self.finish(team, episodes, generated, 0, started)
        assert previous is not None and updated_agent is not None
        truncated, reused = self.reusable_prefixes(previous, updated_agent)
        episodes, generated = self.play(team, truncated)
        return self.finish(team, episodes, generated, reused, started)

    def sample_with_signal(self, team: LoraTeam, started: float) -> DialogueRollouts:
        """Dynamic sampling (see the module's docstring): rounds of fresh groups until
        ``signal_groups`` of them have differing rewards or ``max_draws`` extra groups were
        drawn; the batch keeps ``prompts_per_batch`` of them, those with signal first."""
        s = self.settings
        size = s.group_size
        episodes: list[Episode] = []
        grades: list[Grade] = []
        rewards: list[np.ndarray] = []
        generated = 0
        count = s.prompts_per_batch
        while True:
            played, tokens = self.play(team, self.new_episodes(count))
            round_grades, round_rewards = self.graded(played)
            episodes.extend(played)
            grades.extend(round_grades)
            rewards.append(round_rewards)
            generated += tokens
            signal = group_signal(np.concatenate(rewards), size)
            extra_left = s.max_draws - (len(signal) - s.prompts_per_batch)
            if signal.sum() >= s.signal_groups or extra_left <= 0:
                break
            count = min(s.prompts_per_batch, extra_left)
        with_signal = np.flatnonzero(signal)
        without = np.flatnonzero(~signal)
        chosen = sorted([*with_signal[: s.prompts_per_batch], *without][: s.prompts_per_batch])
        keep = [g * size + i for g in chosen for i in range(size)]
        all_rewards = np.concatenate(rewards)
        return self.finish(
            team,
            [episodes[k] for k in keep],
            generated,
            0,
            started,
            graded=([grades[k] for k in keep], all_rewards[keep]),
            draws=(len(signal), int(signal.sum())),
        )

    def reusable_prefixes(
        self, previous: DialogueRollouts, updated_agent: int
    ) -> tuple[list[Episode], int]:
        """``previous``'s episodes cut before the first turn spoken for ``updated_agent``, and
        how many turns they keep (see ``prefixes_reusable`` for when this is exact)."""
        truncated = []
        reused = 0
        for episode in previous.episodes:
            first = episode.first_turn_of(updated_agent, self.chat.policy_of)
            keep = len(episode.turns) if first is None else first
            truncated.append(episode.with_turns(episode.turns[:keep]))
            reused += keep
        return truncated, reused

    def importance_weighted(self, rollouts: DialogueRollouts, team: LoraTeam) -> DialogueRollouts:
        """HAPPO: weight each episode by the product of the changed agents' message ratios."""
        log_weights = np.zeros(len(rollouts.episodes))
        for agent in team.differing_agents(rollouts.behaviour):
            prepare_logps(rollouts, agent)  # before ``team`` is loaded into the backbone
            with profiling.section("importance weights"), torch.no_grad():
                scored = list(self._score_chunks(team.use(agent), rollouts.episodes, agent))
            for _, batch in scored:
                logps = batch.token_logps()
                for row, (e, t) in enumerate(batch.refs):
                    new = float(logps[row][batch.mask[row]].sum())
                    old = float(rollouts.old_logps[e][t].sum())
                    log_weights[e] += new - old
        return replace(rollouts, weights=np.exp(log_weights))
