"""The private-notes task: each agent holds a number the others do not see.

Agent k's note ("Your private number is 7.") goes into ``Problem.notes[k]`` and is shown in
agent k's own turns only (``llm.conversation.dialogue``); the public question says that every teammate
holds a private number and that the last speaker must state the sum of all of them. No agent
can answer alone: the team must pass the numbers on. The numbers are drawn independently and
uniformly from 1..note_max.

The question text is the same for every draw of the numbers, so the train/test split hashes
the question together with the notes (``llm.problems.tasks.identity_of``). With ``phrasing = "mixed"``
the question is asked in one of several templates, one of them eval-only.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

import numpy as np

from llm.problems.tasks import (
    PHRASINGS,
    Phrasing,
    Problem,
    Split,
    first_distinct,
    identity_of,
    split_of,
)


@dataclass(frozen=True)
class NotesTemplate:
    id: str
    eval_only: bool
    text: str
    """The question, with ``{n}`` for the number of agents."""


NOTES_TEMPLATES: tuple[NotesTemplate, ...] = (
    NotesTemplate(
        "notes.sum_all",
        False,
        "Each of the {n} teammates holds a private number that the others cannot see. "
        "The last speaker must state the sum of all {n} numbers as a single number.",
    ),
    NotesTemplate(
        "notes.total",
        False,
        "Every one of the {n} teammates was told a secret number. Tell your teammates yours; "
        "whoever speaks last answers with the total of all {n} numbers.",
    ),
    NotesTemplate(
        "notes.add_up",
        True,
        "A team of {n} each knows one hidden number. Add up all {n} hidden numbers; the final "
        "speaker gives the sum as a number.",
    ),
)
"""The first template is the "plain" phrasing; the eval-only one is never trained on."""

RELAY_TEMPLATES: tuple[NotesTemplate, ...] = (
    NotesTemplate(
        "relay.first",
        False,
        "Each of the {n} teammates holds a private number that the others cannot see. "
        "The last speaker must state the first speaker's number.",
    ),
    NotesTemplate(
        "relay.pass_on",
        False,
        "Every one of the {n} teammates was told a secret number. The first speaker passes "
        "theirs on; whoever speaks last answers with the first speaker's number.",
    ),
    NotesTemplate(
        "relay.repeat",
        True,
        "A team of {n} each knows one hidden number. The final speaker gives the hidden number "
        "of the one who spoke first.",
    ),
)
"""``answer = "first"``: the last speaker must state the first speaker's number (a relay: the
last speaker's own number is a distractor it must not answer with)."""

CHAIN_TEMPLATES: tuple[NotesTemplate, ...] = (
    NotesTemplate(
        "chain.running_total",
        False,
        "Each of the {n} teammates holds a private number that the others cannot see. "
        "Speaking in turn, each adds their number to the total the previous speaker said and "
        "says the new total; the last total is the sum of all {n} numbers.",
    ),
    NotesTemplate(
        "chain.keep_count",
        False,
        "Every one of the {n} teammates was told a secret number. Keep a running total: the "
        "first speaker says theirs, and everyone after adds theirs to the last total said.",
    ),
    NotesTemplate(
        "chain.tally",
        True,
        "A team of {n} each knows one hidden number. One after another, add your hidden number "
        "to the tally so far and say the new tally; the final speaker's tally is the answer.",
    ),
)
"""``answer = "chain"``: a running sum passed along the team. Every speaker's message is graded
(the task's reward is ``llm.problems.rewards.running_sum_credits``): speaker k should state the sum of the numbers of the
first k + 1 speakers, which it can only know from the message before it and its own note. The
reward depends on every agent and is dense (partial credit per turn), so most batches carry a
signal even when no team gets the final sum right."""
NoteAnswer = Literal["sum", "first", "chain"]
NOTE_ANSWERS: tuple[NoteAnswer, ...] = ("sum", "first", "chain")


def chain_role_prompts(n_agents: int) -> tuple[str, ...]:
    """Role prompts for a running-sum chain of ``n_agents`` speakers, one per position."""
    if n_agents < 1:
        raise ValueError(f"n_agents must be >= 1, got {n_agents}")
    if n_agents == 1:
        return ("You are the only speaker. Say only your private number.",)
    first = "You speak first. Say only your private number."
    middle = (
        "Add your private number to the total the previous speaker said. "
        "Say only the new total, as a number."
    )
    last = (
        "You speak last. Add your private number to the total the previous speaker said. "
        "Say only the final total, as a number."
    )
    return (first, *([middle] * (n_agents - 2)), last)


ENUMERABLE = 100_000
"""Most draws of the numbers counted one by one to say how many held-out problems exist."""


def note_text(number: int) -> str:
    return f"Your private number is {number}."


@dataclass(frozen=True)
class PrivateNotesSuite:
    """Problems of ``n_agents`` private numbers in 1..``note_max``, answer their sum."""

    n_agents: int
    note_max: int = 9
    phrasing: Phrasing = "plain"
    answer: NoteAnswer = "sum"
    """"sum": the sum of all the numbers; "first": the first speaker's number."""

    def __post_init__(self) -> None:
        if self.n_agents < 1:
            raise ValueError(f"n_agents must be >= 1, got {self.n_agents}")
        if self.note_max < 1:
            raise ValueError(f"note_max must be >= 1, got {self.note_max}")
        if self.phrasing not in PHRASINGS:
            raise ValueError(f"phrasing must be one of {PHRASINGS}, got {self.phrasing!r}")
        if self.answer not in NOTE_ANSWERS:
            raise ValueError(f"answer must be one of {NOTE_ANSWERS}, got {self.answer!r}")

    def templates(self, split: Split) -> list[NotesTemplate]:
        """The templates of ``split``: "plain" asks the first only; "mixed" trains on the
        training templates and evaluates on all."""
        family = {"sum": NOTES_TEMPLATES, "first": RELAY_TEMPLATES, "chain": CHAIN_TEMPLATES}[
            self.answer
        ]
        if self.phrasing == "plain":
            return [family[0]]
        return [t for t in family if split == "test" or not t.eval_only]

    def problem(self, template: NotesTemplate, numbers: list[int]) -> Problem:
        return Problem(
            template.text.format(n=self.n_agents),
            str(numbers[0] if self.answer == "first" else sum(numbers)),
            template.id,
            0,
            tuple(note_text(x) for x in numbers),
            tuple(numbers),
        )

    def _draw(self, template: NotesTemplate, rng: np.random.Generator) -> Problem:
        numbers = [int(x) for x in rng.integers(1, self.note_max + 1, size=self.n_agents)]
        return self.problem(template, numbers)

    def stream(self, split: Split, rng: np.random.Generator) -> Iterator[Problem]:
        """An endless stream of ``split`` problems in the training templates."""
        training = self.templates("train")
        while True:
            # One template draws nothing extra for it.
            pick = int(rng.integers(len(training))) if len(training) > 1 else 0
            template = training[pick]
            problem = self._draw(template, rng)
            if split_of(identity_of(problem)) == split:
                yield problem

    def sample(self, split: Split, count: int, rng: np.random.Generator) -> list[Problem]:
        stream = self.stream(split, rng)
        return [next(stream) for _ in range(count)]

    def fixed_set(self, split: Split, count: int, seed: int = 0) -> list[Problem]:
        """``count`` distinct problems of ``split``, balanced across ``templates(split)``
        (eval-only templates are taken whatever their hash); the same for the same seed."""
        templates = self.templates(split)
        rng = np.random.default_rng(seed)
        chosen: list[Problem] = []
        for index, template in enumerate(templates):
            quota = count // len(templates) + (index < count % len(templates))
            available = self.available(template, split)
            if available is not None and quota > available:
                raise ValueError(
                    f"{count} distinct {split} problems need {quota} in template {template.id}, "
                    f"which has only {available} for {self.n_agents} agents and note_max = "
                    f"{self.note_max} (at most {available * len(templates)} in all)"
                )
            if quota:
                chosen += first_distinct(self._template_stream(template, split, rng), quota, split)
        return chosen

    def available(self, template: NotesTemplate, split: Split) -> int | None:
        """How many distinct ``split`` problems ``template`` has, counted over every draw of
        the numbers when there are at most ``ENUMERABLE`` (None: more, plenty)."""
        if self.note_max**self.n_agents > ENUMERABLE:
            return None
        draws = itertools.product(range(1, self.note_max + 1), repeat=self.n_agents)
        if template.eval_only:
            return self.note_max**self.n_agents
        return sum(split_of(identity_of(self.problem(template, list(d)))) == split for d in draws)

    def _template_stream(
        self, template: NotesTemplate, split: Split, rng: np.random.Generator
    ) -> Iterator[Problem]:
        while True:
            problem = self._draw(template, rng)
            if template.eval_only or split_of(identity_of(problem)) == split:
                yield problem


def sum_distribution(n_agents: int, note_max: int) -> dict[int, int]:
    """How many of the ``note_max ** n_agents`` equally likely draws give each sum: the
    n-fold convolution of the uniform counts on 1..note_max, in exact integers."""
    counts = {0: 1}
    for _ in range(n_agents):
        following: dict[int, int] = {}
        for total, ways in counts.items():
            for x in range(1, note_max + 1):
                following[total + x] = following.get(total + x, 0) + ways
        counts = following
    return counts


def random_guess_floor(n_agents: int, note_max: int, answer: NoteAnswer = "sum") -> Fraction:
    """The accuracy of the best constant answer, max_s P(answer = s): what a team that ignores
    every note can reach at most (the mode of the sum's distribution; 1 / note_max for the
    first speaker's number, which is uniform). The chain's final answer is the sum."""
    if answer == "first":
        return Fraction(1, note_max)
    counts = sum_distribution(n_agents, note_max)
    return Fraction(max(counts.values()), note_max**n_agents)
