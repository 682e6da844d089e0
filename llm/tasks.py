"""Tasks: problems with a verifiable final answer.

Two sources: a built-in, seeded, procedurally generated arithmetic suite with several
difficulties and disjoint train/test splits, and a loader for GSM8K/MATH-style JSONL files.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

Split = Literal["train", "test"]
DIFFICULTIES = (1, 2, 3)
TEST_FRACTION_PERCENT = 20


class TaskDataError(ValueError):
    """A problem file is malformed; the message names the file, the line and the field."""


@dataclass(frozen=True)
class Problem:
    """One question and its reference answer (a string math-verify can parse)."""

    question: str
    answer: str
    template: str = ""
    """Id of the phrasing template ("" for JSONL problems)."""
    difficulty: int = 0
    """0 when unknown (JSONL)."""
    notes: tuple[str, ...] = ()
    """Per speaker (agent index): a private note, "" = none; () = no notes."""


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


@dataclass(frozen=True)
class ArithmeticSuite:
    """Seeded procedural arithmetic problems of one difficulty (1: a±b up to 99; 2: three
    operands with + - or a*b+c; 3: (a+b)*c-d)."""

    difficulty: int = 1

    def __post_init__(self) -> None:
        if self.difficulty not in DIFFICULTIES:
            raise ValueError(f"difficulty must be one of {DIFFICULTIES}, got {self.difficulty!r}")

    def stream(self, split: Split, rng: np.random.Generator) -> Iterator[Problem]:
        """An endless stream of problems of ``split`` (repeats are possible)."""
        while True:
            problem = _arithmetic_problem(self.difficulty, rng)
            if split_of(problem.question) == split:
                yield problem

    def sample(self, split: Split, count: int, rng: np.random.Generator) -> list[Problem]:
        stream = self.stream(split, rng)
        return [next(stream) for _ in range(count)]

    def fixed_set(self, split: Split, count: int, seed: int = 0) -> list[Problem]:
        """``count`` distinct problems of ``split``, the same for the same seed (evaluation)."""
        seen: dict[str, Problem] = {}
        stream = self.stream(split, np.random.default_rng(seed))
        for _ in range(count * 1000):
            problem = next(stream)
            seen.setdefault(problem.question, problem)
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
            _text_field(record, "question", where), _text_field(record, "answer", where)
        )
        _check_answer(problem.answer, where)
        problems.append(problem)
    if not problems:
        raise TaskDataError(f"{path}: no problems in file")
    return tuple(problems)
