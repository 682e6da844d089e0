"""Tasks: problems with a verifiable final answer.

Two sources: a built-in, seeded, procedurally generated arithmetic suite with several
difficulties and phrasings (``llm.problems.phrasings``) and disjoint train/test splits, and a loader
for GSM8K/MATH-style JSONL files.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from llm.problems.phrasings import Template, templates_of

Split = Literal["train", "test"]
Phrasing = Literal["plain", "mixed"]
DIFFICULTIES = (1, 2, 3)
PHRASINGS = ("plain", "mixed")
TEST_FRACTION_PERCENT = 20


class TaskError(ValueError):
    """A task's code or data is unusable; the message is one line that says where."""


class TaskDataError(TaskError):
    """A problem file is malformed; the message names the file, the line and the field."""


@dataclass(frozen=True)
class Problem:
    """One question and its reference answer (a string math-verify can parse)."""

    question: str
    answer: str
    template: str = ""
    """Id of the phrasing template that asked it ("" for problems read from a file)."""
    difficulty: int = 0
    """Its difficulty (0: unknown, as for problems read from a file)."""
    notes: tuple[str, ...] = ()
    """One private note per agent (index k is shown to agent k only; "" = none); () = none."""
    values: tuple[int, ...] = ()
    """The private numbers behind ``notes`` (the private-notes task; () otherwise)."""
    metadata: Mapping[str, Any] = field(default_factory=dict, hash=False)
    """Anything else a task's reward needs to know about the problem (its own keys; a
    dataset's extra columns). Read by rewards only: no other part of a run looks at it."""
    origin: str = field(default="", compare=False)
    """Where the problem was written, for messages: ``train.csv:3`` (a data file's 1-based
    line), ``train[12]`` (the index in a Python task's list); "" for a drawn one. A reward
    that fails on one row is named by it: questions alone may share their first words."""


def split_of(question: str) -> Split:
    """The split a question belongs to, by a hash of its text: the splits are disjoint by
    construction, however many problems are drawn from each."""
    digest = hashlib.sha256(question.encode()).digest()
    return "test" if digest[0] * 100 < TEST_FRACTION_PERCENT * 256 else "train"


def _arithmetic_problem(difficulty: int, rng: np.random.Generator) -> Problem:
    if difficulty == 1:
        a, b = (int(x) for x in rng.integers(0, 100, size=2))
        if rng.random() < 0.5:
            return Problem(f"What is {a} + {b}?", str(a + b))
        return Problem(f"What is {a} - {b}?", str(a - b))
    if difficulty == 2:
        a, b, c = (int(x) for x in rng.integers(1, 50, size=3))
        if rng.random() < 0.5:
            return Problem(f"What is {a} + {b} - {c}?", str(a + b - c))
        a, b = (int(x) for x in rng.integers(2, 13, size=2))
        return Problem(f"What is {a} * {b} + {c}?", str(a * b + c))
    if difficulty == 3:
        a, b, c, d = (int(x) for x in rng.integers(1, 20, size=4))
        return Problem(f"What is ({a} + {b}) * {c} - {d}?", str((a + b) * c - d))
    raise ValueError(f"difficulty must be one of {DIFFICULTIES}, got {difficulty!r}")


def _plain_problem(difficulty: int, rng: np.random.Generator) -> Problem:
    """A plain question ("What is ...?"), labelled with its template and difficulty."""
    problem = _arithmetic_problem(difficulty, rng)
    return dataclasses.replace(problem, template=f"d{difficulty}.what_is", difficulty=difficulty)


def _from_template(template: Template, rng: np.random.Generator) -> Problem:
    question, answer = template.draw(rng)
    return Problem(question, str(answer), template.id, template.difficulty)


@dataclass(frozen=True)
class ArithmeticSuite:
    """Seeded procedural arithmetic problems (1: a±b up to 99; 2: three operands with + - or
    a*b+c; 3: (a+b)*c-d), of one difficulty or a mix (each problem draws its difficulty
    uniformly from ``difficulty``).

    ``phrasing = "plain"`` asks every question as "What is <expression>?" (one difficulty
    gives exactly the questions of earlier versions, draw for draw). ``"mixed"`` draws a
    template uniformly among the training templates of the difficulty (``llm.problems.phrasings``):
    plain expressions and word problems. Training problems come from training templates and
    the train half of the question hash; the held-out set (``fixed_set("test", ...)``) holds
    test-half questions of the training templates and questions of the eval-only templates,
    balanced across templates.
    """

    difficulty: int | tuple[int, ...] = 1
    phrasing: Phrasing = "plain"

    def __post_init__(self) -> None:
        levels = self.difficulties
        if (
            not levels
            or any(d not in DIFFICULTIES for d in levels)
            or len(set(levels)) < len(levels)
        ):
            raise ValueError(
                f"difficulty must be one of {DIFFICULTIES} or a list of distinct ones, "
                f"got {self.difficulty!r}"
            )
        if self.phrasing not in PHRASINGS:
            raise ValueError(f"phrasing must be one of {PHRASINGS}, got {self.phrasing!r}")

    @property
    def difficulties(self) -> tuple[int, ...]:
        return (self.difficulty,) if isinstance(self.difficulty, int) else tuple(self.difficulty)

    def templates(self, split: Split) -> list[Template]:
        """The templates questions of ``split`` are asked in: the training templates for
        "train"; for "test" the eval-only templates too. Plain phrasing: "What is" only."""
        if self.phrasing == "plain":
            return [
                t for d in self.difficulties for t in templates_of(d) if t.id.endswith("what_is")
            ]
        chosen = []
        for d in self.difficulties:
            chosen += templates_of(d, eval_only=False if split == "train" else None)
        return chosen

    def _draw(self, rng: np.random.Generator) -> Problem:
        levels = self.difficulties
        # A single difficulty draws nothing extra, so that old runs reproduce draw for draw.
        difficulty = levels[0] if len(levels) == 1 else levels[int(rng.integers(len(levels)))]
        if self.phrasing == "plain":
            return _plain_problem(difficulty, rng)
        training = templates_of(difficulty, eval_only=False)
        return _from_template(training[int(rng.integers(len(training)))], rng)

    def stream(self, split: Split, rng: np.random.Generator) -> Iterator[Problem]:
        """An endless stream of problems of ``split`` in training templates (repeats are
        possible)."""
        while True:
            problem = self._draw(rng)
            if split_of(problem.question) == split:
                yield problem

    def sample(self, split: Split, count: int, rng: np.random.Generator) -> list[Problem]:
        stream = self.stream(split, rng)
        return [next(stream) for _ in range(count)]

    def fixed_set(self, split: Split, count: int, seed: int = 0) -> list[Problem]:
        """``count`` distinct problems of ``split``, the same for the same seed (evaluation).

        One plain difficulty: the first distinct questions of the stream, as in earlier
        versions. Otherwise balanced: ``count`` split as evenly as possible across
        ``templates(split)`` in their order; questions of eval-only templates are never
        trained on, so they are taken whatever their hash.
        """
        if self.phrasing == "plain" and len(self.difficulties) == 1:
            return first_distinct(self.stream(split, np.random.default_rng(seed)), count, split)
        templates = self.templates(split)
        rng = np.random.default_rng(seed)
        chosen: list[Problem] = []
        for index, template in enumerate(templates):
            quota = count // len(templates) + (index < count % len(templates))
            if quota:
                chosen += first_distinct(_template_stream(template, split, rng), quota, split)
        return chosen


def _template_stream(
    template: Template, split: Split, rng: np.random.Generator
) -> Iterator[Problem]:
    while True:
        problem = _from_template(template, rng)
        if template.eval_only or split_of(problem.question) == split:
            yield problem


def identity_of(problem: Problem) -> str:
    """The text that tells problems apart: the question, and the private notes if any (the
    questions of the private-notes task are the same for every draw of the numbers)."""
    return "\n".join((problem.question, *problem.notes))


def first_distinct(stream: Iterator[Problem], count: int, split: Split) -> list[Problem]:
    """The first ``count`` problems of ``stream`` that differ (by ``identity_of``)."""
    seen: dict[str, Problem] = {}
    for _ in range(count * 1000):
        problem = next(stream)
        seen.setdefault(identity_of(problem), problem)
        if len(seen) == count:
            return list(seen.values())
    raise ValueError(f"could not draw {count} distinct {split} problems")


def _answer_field(value: object) -> str:
    text = str(value)
    # GSM8K writes the reasoning, then "#### <final answer>".
    return text.split("####")[-1].strip() if "####" in text else text.strip()


def _text_field(record: dict, name: str, where: str) -> str:
    value = record.get(name)
    if name not in record:
        raise TaskDataError(f"{where}: missing field {name!r} (expected a string or number)")
    # bool is an int subclass, and NaN/Infinity are accepted by Python's JSON parser: neither
    # is a usable question or answer.
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise TaskDataError(
            f"{where}: field {name!r} must be a string or number, got {type(value).__name__}"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise TaskDataError(f"{where}: field {name!r} must be a finite number, got {value}")
    text = str(value).strip() if name == "question" else _answer_field(value)
    if not text:
        raise TaskDataError(f"{where}: field {name!r} is empty (expected non-empty text)")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise TaskDataError(f"{where}: field {name!r} holds an unpaired surrogate") from None
    return text


MAX_LINE_BYTES = 2**20
"""Longest JSONL line read (1 MiB, far above any GSM8K/MATH record): a longer one is refused
after reading this much of it, so a malformed file cannot fill the memory."""


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """Numbered lines of ``path``, each read with a size cap."""
    try:
        with path.open("rb") as handle:
            for number in itertools.count(1):
                data = handle.readline(MAX_LINE_BYTES + 1)
                if not data:
                    return
                if len(data) > MAX_LINE_BYTES:
                    raise TaskDataError(
                        f"{path}:{number}: line longer than {MAX_LINE_BYTES} bytes (one "
                        '{"question", "answer"} record a line; a question must fit the model\'s '
                        "context anyway)"
                    )
                yield number, data
    except OSError as error:
        raise TaskDataError(f"{path}: cannot read: {error.strerror or error}") from None


def _check_answer(answer: str, where: str) -> None:
    """The reward compares a reply with the answer by math-verify: an answer it cannot parse
    would fail every reply, so it is refused here, at load time."""
    from math_verify import parse

    try:
        parsed = parse(answer)
    except Exception:  # math-verify raises assorted errors (timeouts, sympy) on odd input
        parsed = []
    if not parsed:
        shown = answer if len(answer) <= 40 else answer[:37] + "..."
        raise TaskDataError(
            f"{where}: field 'answer' {shown!r} is not a number or expression math-verify can "
            'parse (expected e.g. "42", "-3.5", "\\frac{1}{2}" or GSM8K\'s "... #### 42")'
        )


def load_jsonl(path: str | Path) -> list[Problem]:
    """Problems from a JSONL file, one ``{"question": ..., "answer": ...}`` object a line.

    Any malformed input raises ``TaskDataError`` naming the file, the line and the field:
    a line over ``MAX_LINE_BYTES``, invalid UTF-8 or JSON, a missing or empty field, or an
    answer math-verify cannot parse. A file is parsed once per process and content (keyed by
    its path and SHA-256), since a run checks its data before loading its model and again when
    it builds.
    """
    path = Path(path)
    if not path.is_file():
        raise TaskDataError(f"{path}: no such file")
    digest = hashlib.sha256()
    try:
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(2**20), b""):
                digest.update(block)
    except OSError as error:
        raise TaskDataError(f"{path}: cannot read: {error.strerror or error}") from None
    return list(_load_jsonl(str(path), digest.hexdigest()))


@functools.lru_cache(maxsize=8)
def _load_jsonl(name: str, _content_digest: str) -> tuple[Problem, ...]:
    path = Path(name)
    problems = []
    for line_number, data in _lines(path):
        where = f"{path}:{line_number}"
        try:
            line = data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise TaskDataError(f"{where}: not UTF-8 text (byte {error.start})") from None
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise TaskDataError(
                f"{where}: not valid JSON ({error.msg} at column {error.colno}); expected "
                '{"question": ..., "answer": ...}'
            ) from None
        except RecursionError:
            raise TaskDataError(f"{where}: not valid JSON (nested too deeply)") from None
        if not isinstance(record, dict):
            raise TaskDataError(
                f'{where}: expected a JSON object {{"question": ..., "answer": ...}}, '
                f"got {type(record).__name__}"
            )
        problem = Problem(
            _text_field(record, "question", where),
            _text_field(record, "answer", where),
            origin=where,
        )
        _check_answer(problem.answer, where)
        problems.append(problem)
    if not problems:
        raise TaskDataError(f"{path}: no problems in file")
    return tuple(problems)
