"""The built-in tasks as ``Task`` objects: the arithmetic suite, a JSONL file of math questions
and the private-notes family (sum, relay, running-sum chain).

Each draws exactly the problems the suites draw (``ArithmeticSuite.sample``,
``PrivateNotesSuite.sample``, a JSONL file's lines uniformly with replacement), so runs of
earlier versions reproduce draw for draw; the chain's dense credit is its per-turn reward
(``running_sum_credits``), not a rule of the sampler.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llm.problems.private_notes import NoteAnswer, PrivateNotesSuite
from llm.problems.rewards import running_sum_turns
from llm.problems.task import Dialogue, Task
from llm.problems.tasks import ArithmeticSuite, Phrasing, Problem, load_jsonl, split_of


def running_sum_credits(dialogue: Dialogue) -> tuple[float, ...]:
    """The chain's per-turn reward: 1 for every turn that states the running sum of the
    numbers of everyone who has spoken so far (``running_sum_turns``); the dialogue's return
    is the share of such turns."""
    return running_sum_turns(dialogue.messages, dialogue.speakers, dialogue.problem.values)


def arithmetic_task(
    difficulty: int | tuple[int, ...] = 1,
    phrasing: Phrasing = "plain",
    eval_size: int = 200,
    eval_seed: int = 1234,
) -> Task:
    """The procedural arithmetic suite (``ArithmeticSuite``), graded by math-verify."""
    suite = ArithmeticSuite(difficulty, phrasing)

    def draw(rng: np.random.Generator, count: int) -> list[Problem]:
        return suite.sample("train", count, rng)

    test = suite.fixed_set("test", eval_size, seed=eval_seed)
    return Task(draw, test, name="arithmetic", split=split_of)


def private_notes_task(
    holders: int,
    note_max: int = 9,
    phrasing: Phrasing = "plain",
    answer: NoteAnswer = "sum",
    eval_size: int = 120,
    eval_seed: int = 1234,
) -> Task:
    """Private numbers, one per holder (``PrivateNotesSuite``): the last speaker states their
    sum (or the first number, a relay); ``answer = "chain"`` rewards every turn that keeps the
    running sum."""
    suite = PrivateNotesSuite(holders, note_max, phrasing, answer)

    def draw(rng: np.random.Generator, count: int) -> list[Problem]:
        return suite.sample("train", count, rng)

    test = suite.fixed_set("test", eval_size, seed=eval_seed)
    if answer == "chain":
        return Task(draw, test, reward=running_sum_credits, name="chain", split=split_of)
    return Task(draw, test, name=f"private_notes ({answer})", split=split_of)


def jsonl_task(train_file: str | Path, test_file: str | Path = "", eval_size: int = 200) -> Task:
    """A GSM8K/MATH-style file of ``{"question", "answer"}`` lines (``load_jsonl``: every line
    checked, answers math-verify can parse), graded by math-verify."""
    train = load_jsonl(train_file)
    test = load_jsonl(test_file)[:eval_size] if test_file else []
    return Task(train, test, name=Path(train_file).name)
