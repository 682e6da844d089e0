"""An environment: the world a team acts in, whose text enters the shared context between turns.

THEORY.md §1's setting is an MDP with any transition kernel P and ``agent(s)`` naming who acts
in a state. Without an environment the language-model team's kernel is concatenation: the next
state is the context plus the message. An environment makes it a real kernel: after each
agent's message it may add text (a tool's result, a game's observation, a checker's feedback)
to the context, shared or private to one agent, give a per-turn reward, end the dialogue, and
name who speaks next.

    class Calculator:
        def reset(self, problem: Problem, seed: int) -> Opening:
            return Opening(problem.question)
        def step(self, speaker: int, message: str) -> Reply:
            return Reply(text=f"= {evaluate(message)}") if speaker == 0 else Reply(done=True)

A task holds a *factory* (``Task.environment``): a function of no arguments returning a fresh
environment, one per dialogue. ``reset`` receives the problem (which game, which question) and
the dialogue's own seed; an environment that draws random numbers draws them from a generator
of its own seeded with it, so that a dialogue replays bit for bit (``llm.conversation.environment_session``
replays one to continue its prefix after an agent's update, and checks that the text is the
same). Environment text is context, never policy: it is never sampled, and it is masked out of
every loss, log-probability, KL and certificate term (``llm.conversation.dialogue``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from llm.problems.tasks import Problem, TaskError


@dataclass(frozen=True)
class Opening:
    """What an environment shows when a dialogue starts."""

    text: str
    """The opening every agent sees: the dialogue's user message (it replaces the problem's
    question)."""
    private: Mapping[int, str] = field(default_factory=dict)
    """Agent -> text shown to that agent only, after the opening (e.g. a spymaster's key)."""
    first_speaker: int | None = None
    """Who speaks first; None: the team's router decides."""


@dataclass(frozen=True)
class Reply:
    """What an environment does after one agent's message."""

    text: str = ""
    """Text every agent sees next, "" for none."""
    private: Mapping[int, str] = field(default_factory=dict)
    """Agent -> text shown to that agent only."""
    reward: float = 0.0
    """This turn's reward (the environment's; a task's reward reads them all)."""
    done: bool = False
    """Whether the dialogue ends after this message."""
    next_speaker: int | None = None
    """Who speaks next (THEORY's agent(s)); None: the team's router decides."""


@runtime_checkable
class Environment(Protocol):
    """One dialogue's world (see the module's docstring)."""

    def reset(self, problem: Problem, seed: int) -> Opening:
        """Start the dialogue about ``problem``; ``seed`` seeds any randomness of its own."""
        ...

    def step(self, speaker: int, message: str) -> Reply:
        """React to ``speaker``'s ``message``."""
        ...


EnvironmentFactory = Callable[[], Environment]
"""A function of no arguments returning a fresh environment (one per dialogue)."""


class EnvironmentFault(TaskError):
    """An environment raised, returned something that is not an ``Opening``/``Reply``, or gave
    other text for the same seed; the message is one line naming the environment and the
    dialogue."""
