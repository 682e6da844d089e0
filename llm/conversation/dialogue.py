"""The shared transcript: episodes as token ids, rendered with the model's chat template.

Every agent speaks into one context. A turn is rendered as ``header(agent) + message +
closing`` where the header comes from the chat template (an optional role prompt as a system
message, then the assistant generation prompt) and ``message`` is exactly the token ids the agent
sampled. Transcripts are kept as token ids, never re-tokenised from text, so the log-probability
the updater computes for a message is that of the tokens that were actually sampled.

Views. A problem may give agent k a private note (``Problem.notes[k]``). It is written into
agent k's own turn headers, and only in agent k's *view* of the transcript: every other agent
sees agent k's turns under its public header. Sampling, scoring and prefix reuse all render a
message in its speaker's own view, so no agent's policy ever conditions on another's note.
Without notes every view is the same transcript.

Environment text. With an environment (``llm.problems.environment``), the text it adds after a
message (``Turn.replies``) and its private opening lines (``Episode.opening``) are rendered as
user messages of the chat template, tokenised once when they arrive (``ChatFormat.environment``)
and kept as those token ids: every engine, the scorer and an exported team's play see the same
tokens. A reply meant for one agent appears in that agent's view only. Environment tokens lie
outside every message span of ``assemble``: no loss, log-probability, KL or certificate term
reads them, and no engine samples them.

Speakers and policies. ``Turn.agent`` is the speaker (its role: header, note, message length).
Which adapter speaks for a speaker is ``ChatFormat.policy_of``: the identity for a team, all
zeros for one shared adapter that plays every role of the same dialogue.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedTokenizerBase

from llm.common.settings import DEFAULT_SYSTEM_PROMPT
from llm.problems.tasks import Problem


@dataclass(frozen=True)
class EnvironmentText:
    """Text an environment added to the context: as written, and as the token ids that render
    it (a user message of the chat template, ``ChatFormat.environment``)."""

    text: str
    tokens: tuple[int, ...]
    audience: int | None = None
    """None: every agent sees it; k: agent k only."""

    def seen_by(self, viewer: int | None) -> bool:
        return self.audience is None or self.audience == viewer


@dataclass(frozen=True)
class Turn:
    """One message: who spoke and the token ids they sampled (with the stop token if any),
    then what the environment, if any, did after it."""

    agent: int
    message: tuple[int, ...]
    sampled_logps: torch.Tensor | None = field(default=None, compare=False, repr=False)
    """The log-probability of each message token under the distribution it was drawn from,
    as the generating model computed it (``[sampler] behaviour_logps = "sampled"``); None when
    not recorded. Not part of the turn's identity: a turn is its speaker and its tokens. It
    travels with the turn, so reused prefixes and kept groups carry their own."""
    replies: tuple[EnvironmentText, ...] = ()
    """The environment's text after this message (shared or private), in order."""
    reward: float = 0.0
    """The environment's reward for this turn (0 without an environment)."""
    ends: bool = False
    """Whether the environment ended the dialogue after this message."""
    next_speaker: int | None = None
    """Who the environment named to speak next (None: the router decides)."""


@dataclass(frozen=True)
class Episode:
    """One dialogue about one problem."""

    problem: Problem
    prompt: tuple[int, ...]
    """The rendered system and user messages (token ids)."""
    route_seed: int
    """The seed the router may use (random order per episode); independent of every policy."""
    turns: tuple[Turn, ...] = ()
    opening: tuple[EnvironmentText, ...] = ()
    """An environment's private opening lines, rendered after the prompt in their audience's
    view (its shared opening is the prompt itself)."""
    first_speaker: int | None = None
    """Who the environment named to speak first (None: the router decides)."""
    noise_seed: int | None = None
    """A coupled dialogue's seed (a held-out pair's, ``llm.sampling.held_out_groups``): every
    token of its turn t is drawn from the numbers of (noise_seed, t) alone, whichever team plays
    it. None: the engine's generator."""

    @property
    def ended(self) -> bool:
        """Whether the environment ended the dialogue (a turn cap ends it too, in the sampler)."""
        return bool(self.turns) and self.turns[-1].ends

    def holds_private_text(self, speaker: int) -> bool:
        """Whether anything of this episode is shown to ``speaker`` alone (then its messages
        are rendered in a view of its own)."""
        return any(text.audience == speaker for text in self.opening) or any(
            reply.audience == speaker for turn in self.turns for reply in turn.replies
        )

    def first_turn_of(self, agent: int, policy_of: Sequence[int] = ()) -> int | None:
        """Index of the first turn spoken for policy ``agent`` (by a speaker that
        ``policy_of`` maps to it; the identity when empty), or None when there is none."""
        return next(
            (
                t
                for t, turn in enumerate(self.turns)
                if (policy_of[turn.agent] if policy_of else turn.agent) == agent
            ),
            None,
        )

    def note_of(self, speaker: int) -> str:
        """The private note of ``speaker`` ("" when it has none)."""
        notes = self.problem.notes
        return notes[speaker] if speaker < len(notes) else ""

    def with_turns(self, turns: Sequence[Turn]) -> Episode:
        return Episode(
            self.problem,
            self.prompt,
            self.route_seed,
            tuple(turns),
            self.opening,
            self.first_speaker,
            self.noise_seed,
        )


class _ChatTemplate:
    """The pieces of a tokenizer's chat template a ``ChatFormat`` is made of, each found by
    rendering a small conversation and cutting the part in question out of it."""

    MARKER = "\x00MESSAGE\x00"

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, system_prompt: str, role_prompts: tuple[str, ...]
    ) -> None:
        self.tokenizer, self.system_prompt, self.role_prompts = (
            tokenizer,
            system_prompt,
            role_prompts,
        )
        base = [{"role": "system", "content": system_prompt}, {"role": "user", "content": "Q"}]
        self.base = base
        self.generation_prompt = self.render(base, True)[len(self.render(base, False)) :]
        # An environment's text is a user message, rendered after a system message and cut
        # from its end, so that a template that opens a conversation without a system message
        # with a default one (SmolLM2's) does not add it to every reply.
        self.system_only = self.render([{"role": "system", "content": system_prompt}], False)

    def render(self, messages: list[dict[str, str]], generation_prompt: bool) -> str:
        return str(
            self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=generation_prompt
            )
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    def closing_ids(self) -> list[int]:
        """What the template writes after an assistant message: its first token is the stop."""
        answered = self.render([*self.base, {"role": "assistant", "content": self.MARKER}], False)
        closing = self.encode(answered.split(self.MARKER, 1)[1])
        if not closing:
            raise ValueError("the chat template writes nothing after a message: no stop token")
        return closing

    def header(self, agent: int, note: str = "") -> tuple[int, ...]:
        role = self.role_prompts[agent] if self.role_prompts else ""
        # The note first, the role last: the instruction the speaker acts on closes its header.
        text = "\n".join(part for part in (note, role) if part)
        role_text = self.render([{"role": "system", "content": text}], False) if text else ""
        return tuple(self.encode(role_text + self.generation_prompt))

    def encode_prompt(self, question: str) -> list[int]:
        messages = [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": question},
        ]
        return self.encode(self.render(messages, False))

    def encode_environment(self, text: str) -> tuple[int, ...]:
        both = self.render(
            [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": text}],
            False,
        )
        if not both.startswith(self.system_only):
            raise ValueError("the chat template renders a user message unlike its prefix")
        return tuple(self.encode(both[len(self.system_only) :]))


@dataclass(frozen=True)
class ChatFormat:
    """How prompts and turns become token ids."""

    headers: tuple[tuple[int, ...], ...]
    """Per agent: the tokens that open its turn (role prompt, generation prompt)."""
    stop_id: int
    """The end-of-turn token a speaker samples to finish its message."""
    closing: tuple[int, ...]
    """Tokens the template writes after the stop token (e.g. a newline)."""
    encode_prompt: Callable[[str], list[int]]
    decode: Callable[[Sequence[int]], str]
    pad_id: int = 0
    encode_note_header: Callable[[int, str], tuple[int, ...]] | None = None
    """Speaker k's header with a private note (the note joins its role prompt); None: the
    format has no notes."""
    policy_of: tuple[int, ...] = ()
    """Speaker -> the policy (adapter) that speaks for it; () = the identity."""
    encode_environment: Callable[[str], tuple[int, ...]] | None = None
    """Environment text -> the token ids of it as a user message; None: the format renders
    none (a format built without a tokenizer)."""
    _note_headers: dict[tuple[int, str], tuple[int, ...]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @classmethod
    def from_tokenizer(
        cls,
        tokenizer: PreTrainedTokenizerBase,
        n_agents: int,
        system_prompt: str = DEFAULT_SYSTEM_PROMPT,
        role_prompts: Sequence[str] = (),
        policy_of: Sequence[int] = (),
    ) -> ChatFormat:
        """Derive headers and closing tokens by rendering the tokenizer's chat template.

        ``n_agents`` counts speakers (roles); ``policy_of`` maps each to its adapter."""
        if role_prompts and len(role_prompts) != n_agents:
            raise ValueError(f"{len(role_prompts)} role prompts for {n_agents} agents")
        if policy_of and len(policy_of) != n_agents:
            raise ValueError(f"policy_of has {len(policy_of)} entries for {n_agents} speakers")
        template = _ChatTemplate(tokenizer, system_prompt, tuple(role_prompts))
        closing_ids = template.closing_ids()
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else closing_ids[0]
        return cls(
            headers=tuple(template.header(agent) for agent in range(n_agents)),
            stop_id=closing_ids[0],
            closing=tuple(closing_ids[1:]),
            encode_prompt=template.encode_prompt,
            decode=template.decode,
            pad_id=int(pad),
            encode_note_header=template.header,
            policy_of=tuple(policy_of),
            encode_environment=template.encode_environment,
        )

    # -- speakers and policies ----------------------------------------------------------------
    def policy(self, speaker: int) -> int:
        """The policy (adapter index) that speaks for ``speaker``."""
        return self.policy_of[speaker] if self.policy_of else speaker

    def speakers_of(self, policy: int) -> tuple[int, ...]:
        """The speakers ``policy`` speaks for."""
        return tuple(k for k in range(len(self.headers)) if self.policy(k) == policy)

    # -- views --------------------------------------------------------------------------------
    def view_of(self, episode: Episode, speaker: int) -> int | None:
        """The view ``speaker``'s messages are rendered in: its own when it holds a note or
        private environment text in this episode, else None (the public transcript, the same
        for every speaker)."""
        private = episode.note_of(speaker) or episode.holds_private_text(speaker)
        return speaker if private else None

    def environment(self, text: str, audience: int | None = None) -> EnvironmentText:
        """``text`` of an environment as it enters the context (tokenised once, here)."""
        if self.encode_environment is None:
            raise ValueError("this chat format cannot render environment text")
        return EnvironmentText(text, self.encode_environment(text), audience)

    def header(self, episode: Episode, speaker: int, viewer: int | None) -> tuple[int, ...]:
        """``speaker``'s turn header as ``viewer`` sees it: with the note only in its own view."""
        note = episode.note_of(speaker)
        if not note or viewer != speaker:
            return self.headers[speaker]
        if self.encode_note_header is None:
            raise ValueError("this chat format cannot render private notes")
        key = (speaker, note)
        if key not in self._note_headers:
            self._note_headers[key] = self.encode_note_header(speaker, note)
        return self._note_headers[key]

    def turn_tokens(self, turn: Turn, episode: Episode, viewer: int | None) -> list[int]:
        """A finished turn as it appears in ``viewer``'s view of ``episode``."""
        ended = bool(turn.message) and turn.message[-1] == self.stop_id
        tail = list(self.closing) if ended else [self.stop_id, *self.closing]
        replies = seen_tokens(turn.replies, viewer)
        return [*self.header(episode, turn.agent, viewer), *turn.message, *tail, *replies]

    def opening(self, episode: Episode, viewer: int | None) -> list[int]:
        """The prompt and the environment's private opening lines ``viewer`` sees."""
        return [*episode.prompt, *seen_tokens(episode.opening, viewer)]

    def context(self, episode: Episode, next_agent: int) -> list[int]:
        """What ``next_agent`` sees when it starts its turn (its own view)."""
        viewer = self.view_of(episode, next_agent)
        ids = self.opening(episode, viewer)
        for turn in episode.turns:
            ids.extend(self.turn_tokens(turn, episode, viewer))
        ids.extend(self.header(episode, next_agent, viewer))
        return ids

    def assemble(
        self, episode: Episode, viewer: int | None = None
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """The whole transcript in ``viewer``'s view (None: the public one) and, per turn, the
        [start, end) span of its message tokens (environment text lies outside every span:
        nothing scores it)."""
        ids = self.opening(episode, viewer)
        spans = []
        for turn in episode.turns:
            ids.extend(self.header(episode, turn.agent, viewer))
            spans.append((len(ids), len(ids) + len(turn.message)))
            ids.extend(turn.message)
            ended = bool(turn.message) and turn.message[-1] == self.stop_id
            ids.extend(self.closing if ended else [self.stop_id, *self.closing])
            ids.extend(seen_tokens(turn.replies, viewer))
        return ids, spans

    def message_text(self, turn: Turn) -> str:
        return self.decode(turn.message)


def seen_tokens(texts: Sequence[EnvironmentText], viewer: int | None) -> list[int]:
    """The tokens of the environment ``texts`` that ``viewer``'s view shows, in order."""
    return [token for text in texts if text.seen_by(viewer) for token in text.tokens]
