"""Tasks: problems with a verifiable final answer.

Two sources: a built-in, seeded, procedurally generated arithmetic suite with several
difficulties and disjoint train/test splits, and a loader for GSM8K/MATH-style JSONL files.
"""

from __future__ import annotations

import hashlib
import json
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


def load_jsonl(path: str | Path) -> list[Problem]:
    """Problems from a JSONL file, one ``{"question": ..., "answer": ...}`` object a line."""
    path = Path(path)
    if not path.is_file():
        raise TaskDataError(f"{path}: no such file")
    problems = []
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise TaskDataError(f"{path}:{line_number}: not valid JSON ({error.msg})") from None
            if not isinstance(record, dict):
                raise TaskDataError(f"{path}:{line_number}: expected a JSON object")
            for field_name in ("question", "answer"):
                if field_name not in record:
                    raise TaskDataError(f"{path}:{line_number}: missing field {field_name!r}")
                if not isinstance(record[field_name], str | int | float):
                    raise TaskDataError(
                        f"{path}:{line_number}: field {field_name!r} must be a string or number"
                    )
            question = str(record["question"]).strip()
            answer = _answer_field(record["answer"])
            if not question or not answer:
                empty = "question" if not question else "answer"
                raise TaskDataError(f"{path}:{line_number}: field {empty!r} is empty")
            problems.append(Problem(question, answer))
    if not problems:
        raise TaskDataError(f"{path}: no problems in file")
    return problems
