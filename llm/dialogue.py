"""The shared transcript: episodes as token ids, rendered with the model's chat template.

Every agent speaks into one context. A turn is rendered as ``header(agent) + message +
closing`` where the header comes from the chat template (an optional role prompt as a system
message, then the assistant generation prompt) and ``message`` is exactly the token ids the agent
sampled. Transcripts are kept as token ids, never re-tokenised from text, so the log-probability
the updater computes for a message is that of the tokens that were actually sampled.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from llm.tasks import Problem

DEFAULT_SYSTEM_PROMPT = (
    "You are one of several assistants who take turns in one conversation to solve a math "
    "problem. Build on what was said before. Whoever speaks last must state the final answer "
    "as a number."
)


@dataclass(frozen=True)
class Turn:
    """One message: who spoke and the token ids they sampled (with the stop token if any)."""

    agent: int
    message: tuple[int, ...]


@dataclass(frozen=True)
class Episode:
    """One dialogue about one problem."""

    problem: Problem
    prompt: tuple[int, ...]
    """The rendered system and user messages (token ids)."""
    route_seed: int
    """The seed the router may use (random order per episode); independent of every policy."""
    turns: tuple[Turn, ...] = ()

    def first_turn_of(self, agent: int) -> int | None:
        """Index of ``agent``'s first turn, or None when it never speaks in this episode."""
        return next((t for t, turn in enumerate(self.turns) if turn.agent == agent), None)

    def with_turns(self, turns: Sequence[Turn]) -> Episode:
        return Episode(self.problem, self.prompt, self.route_seed, tuple(turns))


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

    @classmethod
    def from_tokenizer(
        cls,
        tokenizer: PreTrainedTokenizerBase,
        n_agents: int,
        system_prompt: str = DEFAULT_SYSTEM_PROMPT,
        role_prompts: Sequence[str] = (),
    ) -> ChatFormat:
        """Derive headers and closing tokens by rendering the tokenizer's chat template."""
        if role_prompts and len(role_prompts) != n_agents:
            raise ValueError(f"{len(role_prompts)} role prompts for {n_agents} agents")

        def render(messages: list[dict[str, str]], generation_prompt: bool) -> str:
            return str(
                tokenizer.apply_chat_template(
                    messages, tokenize=False, add_generation_prompt=generation_prompt
                )
            )

        def encode(text: str) -> list[int]:
            return list(tokenizer.encode(text, add_special_tokens=False))

        base = [{"role": "system", "content": system_prompt}, {"role": "user", "content": "Q"}]
        rendered_base = render(base, False)
        generation_prompt = render(base, True)[len(rendered_base) :]
        marker = "\x00MESSAGE\x00"
        with_answer = render([*base, {"role": "assistant", "content": marker}], False)
        after = with_answer.split(marker, 1)[1]
        closing_ids = encode(after)
        if not closing_ids:
            raise ValueError("the chat template writes nothing after a message: no stop token")
        headers = []
        for agent in range(n_agents):
            role_text = ""
            if role_prompts and role_prompts[agent]:
                role_message = [{"role": "system", "content": role_prompts[agent]}]
                role_text = render(role_message, False)
            headers.append(tuple(encode(role_text + generation_prompt)))

        def encode_prompt(question: str) -> list[int]:
            messages = [
                {"role": "system", "content": system_prompt},
                {"role": "user", "content": question},
            ]
            return encode(render(messages, False))

        def decode(ids: Sequence[int]) -> str:
            return str(tokenizer.decode(list(ids), skip_special_tokens=True))

        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else closing_ids[0]
        return cls(
            headers=tuple(headers),
            stop_id=closing_ids[0],
            closing=tuple(closing_ids[1:]),
            encode_prompt=encode_prompt,
            decode=decode,
            pad_id=int(pad),
        )

    def turn_tokens(self, turn: Turn) -> list[int]:
        """A finished turn as it appears in the transcript."""
        ended = bool(turn.message) and turn.message[-1] == self.stop_id
        tail = list(self.closing) if ended else [self.stop_id, *self.closing]
        return [*self.headers[turn.agent], *turn.message, *tail]

    def context(self, episode: Episode, next_agent: int) -> list[int]:
        """What ``next_agent`` sees when it starts its turn."""
        ids = list(episode.prompt)
        for turn in episode.turns:
            ids.extend(self.turn_tokens(turn))
        ids.extend(self.headers[next_agent])
        return ids

    def assemble(self, episode: Episode) -> tuple[list[int], list[tuple[int, int]]]:
        """The whole transcript and, per turn, the [start, end) span of its message tokens."""
        ids = list(episode.prompt)
        spans = []
        for turn in episode.turns:
            ids.extend(self.headers[turn.agent])
            spans.append((len(ids), len(ids) + len(turn.message)))
            ids.extend(turn.message)
            ended = bool(turn.message) and turn.message[-1] == self.stop_id
            ids.extend(self.closing if ended else [self.stop_id, *self.closing])
        return ids, spans

    def message_text(self, turn: Turn) -> str:
        return self.decode(turn.message)
