"""One dialogue's environment, run so that the dialogue can be replayed bit for bit.

``open_episode`` starts a dialogue (the environment's opening becomes its prompt and private
opening lines); ``Session.replayed`` rebuilds the environment of a dialogue that already has
turns by resetting it with the dialogue's seed and stepping it through the recorded messages,
and checks on the way that it says what it said then. This is what keeps prefix reuse exact
with an environment (THEORY.md §2, Lemma 3.1): a kept prefix's environment state is a function
of the problem, the dialogue's seed and the kept messages, none of which depends on the updated
agent, so the continuation is a sample of the new team in the same world.

Every call into the environment's code is checked and isolated:

- it runs with Python's ``random`` and numpy's global generator set to the session's own
  state, saved after the call and the caller's restored (environments written against the
  global modules, TextArena's, stay reproducible and disturb nobody's draws);
- an exception, a return that is not an ``Opening``/``Reply``, text that is not a string, a
  reward that is not a finite number, a speaker outside the team: an ``EnvironmentFault`` of
  one line naming the environment, the problem and the dialogue so far.
"""

# ruff: noqa: NPY002 - the legacy global generator is what environments draw from: it is isolated here

from __future__ import annotations

import contextlib
import math
import numbers
import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from llm.conversation.dialogue import ChatFormat, EnvironmentText, Episode, Turn
from llm.problems.environment import (
    Environment,
    EnvironmentFactory,
    EnvironmentFault,
    Opening,
    Reply,
)
from llm.problems.task import first_line, name_of
from llm.problems.tasks import Problem


class _GlobalGenerators:
    """The state of ``random`` and numpy's legacy global generator, one session's own."""

    def __init__(self, seed: int) -> None:
        saved = random.getstate(), np.random.get_state()
        random.seed(seed)
        np.random.seed(seed % 2**32)
        self.state: tuple[Any, Any] = (random.getstate(), np.random.get_state())
        random.setstate(saved[0])
        np.random.set_state(saved[1])

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        saved = random.getstate(), np.random.get_state()
        random.setstate(self.state[0])
        np.random.set_state(self.state[1])
        try:
            yield
        finally:
            self.state = (random.getstate(), np.random.get_state())
            random.setstate(saved[0])
            np.random.set_state(saved[1])


class Session:
    """One dialogue's environment: created by ``opened``, continued by ``replayed``."""

    def __init__(
        self,
        factory: EnvironmentFactory,
        chat: ChatFormat,
        problem: Problem,
        seed: int,
        n_agents: int,
    ) -> None:
        self.chat = chat
        self.problem = problem
        self.seed = seed
        self.n_agents = n_agents
        self.name = name_of(factory)
        self.generators = _GlobalGenerators(seed)
        self.messages: list[str] = []
        with self._calling("the factory"):
            environment = factory()
        if not callable(getattr(environment, "reset", None)) or not callable(
            getattr(environment, "step", None)
        ):
            raise self.fault(
                f"the factory returned {type(environment).__name__}, not an environment "
                "(reset(problem, seed) -> Opening, step(speaker, message) -> Reply)"
            )
        self.environment: Environment = environment

    # -- errors -------------------------------------------------------------------------------
    def fault(self, what: str) -> EnvironmentFault:
        question = self.problem.question
        shown = question if len(question) <= 50 else question[:47] + "..."
        so_far = " | ".join(f"{m[:30]!r}" for m in self.messages[-3:]) or "no message yet"
        return EnvironmentFault(
            f"environment {self.name} on problem {shown!r} (dialogue seed {self.seed}, "
            f"{len(self.messages)} messages: {so_far}): {what}"[:500]
        )

    @contextlib.contextmanager
    def _calling(self, what: str) -> Iterator[None]:
        try:
            with self.generators.installed():
                yield
        except EnvironmentFault:
            raise
        except Exception as error:  # the environment's code: any failure is one line
            raise self.fault(f"{what} raised {type(error).__name__}: {first_line(error)}") from None

    # -- checked calls ------------------------------------------------------------------------
    def reset(self) -> Opening:
        with self._calling("reset"):
            opening = self.environment.reset(self.problem, self.seed)
        if not isinstance(opening, Opening):
            raise self.fault(f"reset returned {type(opening).__name__}, expected an Opening")
        self._check_text(opening.text, "reset's opening text")
        self._check_private(opening.private, "reset")
        self._check_speaker(opening.first_speaker, "reset's first_speaker")
        return opening

    def step(self, speaker: int, message: str) -> Reply:
        self.messages.append(message)
        with self._calling(f"step (agent {speaker})"):
            reply = self.environment.step(speaker, message)
        if not isinstance(reply, Reply):
            raise self.fault(f"step returned {type(reply).__name__}, expected a Reply")
        self._check_text(reply.text, "step's text")
        self._check_private(reply.private, "step")
        self._check_speaker(reply.next_speaker, "step's next_speaker")
        number = reply.reward
        if not isinstance(number, numbers.Real) or not math.isfinite(float(number)):
            raise self.fault(f"step's reward is {number!r}, not a finite number")
        if not isinstance(reply.done, bool | np.bool_):
            raise self.fault(f"step's done is {reply.done!r}, not a bool")
        return reply

    def _check_text(self, text: object, what: str) -> None:
        if not isinstance(text, str):
            raise self.fault(f"{what} is {type(text).__name__} {text!r:.40}, not a string")

    def _check_private(self, private: object, what: str) -> None:
        if not isinstance(private, Mapping):
            raise self.fault(f"{what}'s private text is {type(private).__name__}, not a dict")
        for agent, text in private.items():
            self._check_speaker(agent, f"{what}'s private text's agent")
            self._check_text(text, f"{what}'s private text for agent {agent}")

    def _check_speaker(self, speaker: object, what: str) -> None:
        if speaker is None:
            return
        if not isinstance(speaker, int) or not 0 <= speaker < self.n_agents:
            raise self.fault(f"{what} is {speaker!r}, not an agent 0..{self.n_agents - 1}")

    # -- what enters the context --------------------------------------------------------------
    def texts(self, shared: str, private: Mapping[int, str]) -> tuple[EnvironmentText, ...]:
        """The environment's text as it enters the context: the shared part, then each agent's
        private part (in agent order), each tokenised once."""
        texts = [self.chat.environment(shared)] if shared else []
        texts += [self.chat.environment(private[k], k) for k in sorted(private) if private[k]]
        return tuple(texts)

    def turn(self, speaker: int, message: tuple[int, ...], sampled_logps: Any = None) -> Turn:
        """Agent ``speaker``'s message and what the environment did after it."""
        reply = self.step(speaker, self.chat.decode(message))
        return Turn(
            speaker,
            message,
            sampled_logps,
            replies=self.texts(reply.text, reply.private),
            reward=float(reply.reward),
            ends=bool(reply.done),
            next_speaker=reply.next_speaker,
        )

    @classmethod
    def replayed(
        cls, factory: EnvironmentFactory, chat: ChatFormat, episode: Episode, n_agents: int
    ) -> Session:
        """The environment of ``episode`` after its recorded turns, rebuilt from its seed;
        an ``EnvironmentFault`` where it says anything else than it said then."""
        session = cls(factory, chat, episode.problem, episode.route_seed, n_agents)
        opened = session.reset()
        if opening_tokens(chat, opened)[0] != episode.prompt:
            raise session.fault("reset gave another opening for the same seed (not reproducible)")
        for turn in episode.turns:
            again = session.turn(turn.agent, turn.message)
            if (again.replies, again.reward, again.ends, again.next_speaker) != (
                turn.replies,
                turn.reward,
                turn.ends,
                turn.next_speaker,
            ):
                raise session.fault(
                    "step gave other text, reward or end for the same seed and messages "
                    "(not reproducible: draw random numbers from the seed reset receives)"
                )
        return session


def opening_tokens(
    chat: ChatFormat, opening: Opening
) -> tuple[tuple[int, ...], tuple[EnvironmentText, ...]]:
    """The prompt an opening gives a dialogue, and its private opening lines."""
    private = tuple(
        chat.environment(opening.private[k], k)
        for k in sorted(opening.private)
        if opening.private[k]
    )
    return tuple(chat.encode_prompt(opening.text)), private


def open_episode(
    chat: ChatFormat,
    problem: Problem,
    route_seed: int,
    environment: EnvironmentFactory | None,
    n_agents: int,
) -> Episode:
    """A new dialogue about ``problem``: its question as the prompt, or, with an environment,
    what the environment opens it with (reset with the dialogue's seed, ``route_seed``)."""
    if environment is None:
        return Episode(problem, tuple(chat.encode_prompt(problem.question)), route_seed)
    opening = Session(environment, chat, problem, route_seed, n_agents).reset()
    prompt, private = opening_tokens(chat, opening)
    return Episode(problem, prompt, route_seed, (), private, opening.first_speaker)


def sessions_of(
    environment: EnvironmentFactory | None,
    chat: ChatFormat,
    episodes: Sequence[Episode],
    n_agents: int,
) -> list[Session | None]:
    """Each episode's environment, replayed to its last turn (None without an environment)."""
    if environment is None:
        return [None] * len(episodes)
    return [Session.replayed(environment, chat, episode, n_agents) for episode in episodes]


def environment_record(turn: Turn) -> list[dict[str, Any]]:
    """What the environment said after ``turn``, for transcripts: its text and who saw it
    (``to``: an agent, or None for every agent)."""
    return [{"text": reply.text, "to": reply.audience} for reply in turn.replies]


def observation_text(turn: Turn) -> str:
    """Everything the environment said after ``turn``, shared and private, one line each."""
    return "\n".join(reply.text for reply in turn.replies)


CHECK_MESSAGES = ("", "0", "[5]", "1 + 2", "up", "[A C]", "x" * 300)
"""Messages ``check_environment`` steps with, beside random text: empty, numbers, moves in
brackets, an expression, a word, a long message."""


def check_environment(
    environment: EnvironmentFactory,
    chat: ChatFormat,
    problems: Sequence[Problem],
    n_agents: int,
    turns: int,
    seed: int = 0,
) -> int:
    """Play ``environment`` on each of ``problems`` for up to ``turns`` messages (the check's
    own, then random text), twice from the same seed: an ``EnvironmentFault`` where it raises,
    returns something that is not an ``Opening``/``Reply``, a reward that is not finite, or
    other text, rewards or ends the second time. Returns the steps checked."""
    rng = np.random.default_rng(seed)
    alphabet = list("abcdefghijklmnopqrstuvwxyz0123456789 []+-*/.,")
    steps = 0
    for index, problem in enumerate(problems):
        texts = [
            CHECK_MESSAGES[(t + index) % len(CHECK_MESSAGES)]
            if t < len(CHECK_MESSAGES)
            else "".join(rng.choice(alphabet, size=int(rng.integers(1, 40))))
            for t in range(turns)
        ]
        plays = []
        for _ in range(2):
            session = Session(environment, chat, problem, seed + index, n_agents)
            opening = session.reset()
            speaker = 0 if opening.first_speaker is None else opening.first_speaker
            play: list[object] = [opening]
            for text in texts:
                reply = session.step(speaker, text)
                play.append(reply)
                if reply.done:
                    break
                speaker = (
                    reply.next_speaker
                    if reply.next_speaker is not None
                    else (speaker + 1) % n_agents
                )
            plays.append(play)
        if plays[0] != plays[1]:
            raise session.fault(
                "gave other text, rewards or ends for the same seed and messages (not "
                "reproducible: draw random numbers from the seed reset receives)"
            )
        steps += len(plays[0]) - 1
    return steps
