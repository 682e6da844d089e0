"""The reward tried on the task's own answers, which a tiny random model never writes.

``check_task`` plays dialogues on a tiny random model, whose text seldom earns more than a
reward's lowest, so a reward's other branches never run there: a reward whose right answer scores 0.5
by mistake, or that raises on a right answer, would pass. Here, for a sample of training and
held-out rows (``SAMPLED_ROWS`` of each, spread evenly over the rows), the reward is called on
dialogues that differ only in their final message: the row's reference answer, an empty
message, the reference answer in a sentence, another row's reference answer (a wrong one) and
the tiny model's own message. The earlier messages are those the tiny model played, so every
answer of a row is scored after the same turns. It reports what the reference answers and the
empty ones score, and warns where

- the reward raises on (or returns no number for) an answer tried: a run stops there the
  first time its team gives such an answer (a right one, an empty one);
- a reference answer scores below another answer of its row, or no more than an empty
  message: a team that learns the reference answers would not earn the reward's best;
- a reference answer's held-out score (the metric, in [0, 1]; the reward itself where the task
  has no metric and math-verify cannot read its answers) is below 1: a team that learns every
  answer would not score 1 held out.

Rows without a reference answer (answer "") are not tried.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from llm.problems.task import Dialogue, RewardError, Task
from llm.problems.tasks import Problem

SAMPLED_ROWS = 16
"""At most this many training rows, and as many held-out rows, have their answers tried."""
ANSWER_SECONDS = 30.0
"""...or for at most this long (a reward that asks a judge model must not make a check slow)."""


@dataclass(frozen=True)
class RowAnswers:
    """The rewards of one row's answers (None where the reward raised on it)."""

    problem: Problem
    finals: dict[str, str]
    """Each answer tried, by what it is: "reference", "empty", "sentence", "wrong", "played"."""
    rewards: dict[str, float | None]
    score: float | None
    """The held-out score (metric) of the reference answer (None where it raised)."""
    errors: dict[str, str]
    """The one line of each answer the reward raised on ("metric": the metric on the
    reference answer)."""


@dataclass(frozen=True)
class AnswerScores:
    """What the reward gave the task's own answers (see the module's docstring)."""

    train_rows: int
    test_rows: int
    reference: tuple[float, ...]
    """The reward of each row's reference answer (rows where it raised left out)."""
    empty: tuple[float, ...]
    held_out: tuple[float, ...]
    """The held-out score (metric) of each row's reference answer."""
    warnings: tuple[str, ...] = field(default=())

    def line(self) -> str:
        rows = self.train_rows + self.test_rows
        if not rows:
            return "no reference answers (every answer is empty): the reward was not tried on any"
        return (
            f"reward tried on the task's own answers of {self.train_rows} training and "
            f"{self.test_rows} held-out rows: reference answers score "
            f"{_summary(self.reference, rows)}, empty answers {_summary(self.empty, rows)}; "
            f"held-out score of the reference answers {_summary(self.held_out, rows)}"
        )


def try_answers(
    task: Task, played: Sequence[Dialogue], train: Sequence[Problem], test: Sequence[Problem]
) -> AnswerScores:
    """The reward of a sample of rows' reference answers and of other answers of those rows,
    and the metric of the reference answers, after the turns of ``played`` (see the module's
    docstring)."""
    started = time.monotonic()
    counts: list[int] = []
    rows: list[RowAnswers] = []
    for problems in (train, test):
        answered = [p for p in problems if p.answer.strip()]
        before = len(rows)
        for index in _spread(len(answered), SAMPLED_ROWS):
            if time.monotonic() - started > ANSWER_SECONDS:
                break
            rows.append(_row_answers(task, answered, index, played[len(rows) % len(played)]))
        counts.append(len(rows) - before)
    return AnswerScores(
        train_rows=counts[0],
        test_rows=counts[1],
        reference=_known([row.rewards["reference"] for row in rows]),
        empty=_known([row.rewards["empty"] for row in rows]),
        held_out=_known([row.score for row in rows]),
        warnings=tuple(_warnings(rows)),
    )


def _row_answers(task: Task, rows: Sequence[Problem], index: int, text: Dialogue) -> RowAnswers:
    """Row ``index``'s answers, each the final message after ``text``'s earlier turns."""
    problem = rows[index]
    finals = {
        "reference": problem.answer,
        "empty": "",
        "sentence": f"The answer is {problem.answer.strip()}.",
    }
    others = [*rows[index + 1 :], *rows[:index]]
    wrong = next((p.answer for p in others if p.answer != problem.answer), None)
    if wrong is not None:
        finals["wrong"] = wrong
    finals["played"] = text.final
    errors: dict[str, str] = {}
    rewards: dict[str, float | None] = {}
    for kind, final in finals.items():
        try:
            rewards[kind] = task.returns(_ending(text, problem, final)).value
        except RewardError as error:
            rewards[kind] = None
            errors[kind] = str(error)
    score = None
    try:
        score = task.score(_ending(text, problem, problem.answer))
    except RewardError as error:
        errors["metric"] = str(error)
    return RowAnswers(problem, finals, rewards, score, errors)


def _ending(text: Dialogue, problem: Problem, final: str) -> Dialogue:
    """``text``'s turns for ``problem``, its final message replaced by ``final``."""
    return Dialogue(problem, (*text.messages[:-1], final), text.speakers)


def _spread(count: int, most: int) -> list[int]:
    """Up to ``most`` indices of ``count`` rows, evenly spread from the first to the last."""
    if count <= most:
        return list(range(count))
    return sorted({int(i) for i in np.linspace(0, count - 1, most).round()})


def _known(values: Sequence[float | None]) -> tuple[float, ...]:
    return tuple(v for v in values if v is not None)


def _summary(values: Sequence[float], rows: int) -> str:
    """ "1 on 12 of 12": the most common value and on how many rows; the range where they differ."""
    if not values:
        return f"nothing on any of {rows} (the reward raised)"
    common, count = Counter(values).most_common(1)[0]
    spread = f" ({min(values):g} to {max(values):g})" if len(set(values)) > 1 else ""
    return f"{common:g} on {count} of {rows}{spread}"


def _warnings(rows: Sequence[RowAnswers]) -> list[str]:
    kinds = ("reference", "empty", "sentence", "wrong", "metric")
    warnings = [_raised(rows, kind) for kind in kinds]
    warnings += [_below_another(rows), _not_above_empty(rows), _held_out_below_one(rows)]
    return [w for w in warnings if w]


RAISED = {
    "reference": ("the reference answer", "; a run stops the first time its team answers right"),
    "empty": ("an empty final message", "; a run stops the first time a final message is empty"),
    "sentence": ("the reference answer said in a sentence", ""),
    "wrong": ("another row's answer (a wrong one)", ""),
    "metric": ("the reference answer", "; an evaluation stops there"),
}
"""What each answer tried is, and what a failure on it does to a run."""


def _raised(rows: Sequence[RowAnswers], kind: str) -> str:
    """The first failure of the reward (the metric) on answers of ``kind``, and how many."""
    failed = [
        row.errors[kind]
        for row in rows
        # The default metric of an answer math-verify cannot read is the reward: said once.
        if kind in row.errors and not (kind == "metric" and "reference" in row.errors)
    ]
    if not failed:
        return ""
    what, stops = RAISED[kind]
    judge = "metric" if kind == "metric" else "reward"
    return f"the {judge} fails on {what} of {len(failed)} of {len(rows)} rows tried{stops}: {failed[0]}"


def _below_another(rows: Sequence[RowAnswers]) -> str:
    """Rows whose reference answer scores below another answer tried on them."""
    below = []
    for row in rows:
        reference = row.rewards["reference"]
        others = {k: v for k, v in row.rewards.items() if k != "reference" and v is not None}
        if reference is None or not others:
            continue
        best = max(others, key=lambda k: others[k])
        if others[best] > reference:
            below.append((row, best))
    if not below:
        return ""
    row, best = below[0]
    return (
        f"on {len(below)} of {len(rows)} rows tried, the reference answer scores below another "
        f"answer: {_named(row)}: reference {row.finals['reference']!r:.40} "
        f"{row.rewards['reference']:g}, {best} {row.finals[best]!r:.40} {row.rewards[best]:g}; "
        "a team that learns the reference answers does not earn the reward's best"
    )


def _not_above_empty(rows: Sequence[RowAnswers]) -> str:
    """Rows whose reference answer scores as much as an empty message (and no more)."""
    tied = [
        row
        for row in rows
        if row.rewards["reference"] is not None and row.rewards["reference"] == row.rewards["empty"]
    ]
    if not tied:
        return ""
    return (
        f"on {len(tied)} of {len(rows)} rows tried, the reward gives the reference answer what "
        f"it gives an empty message ({_named(tied[0])}: {tied[0].rewards['empty']:g}): it does "
        "not tell a right answer from none there"
    )


def _held_out_below_one(rows: Sequence[RowAnswers]) -> str:
    """Rows whose reference answer's held-out score (in [0, 1]) is below 1."""
    scores = [(row, row.score) for row in rows if row.score is not None and row.score < 1.0]
    if not scores:
        return ""
    values = [score for _, score in scores]
    spread = f"{min(values):g}" + (f" to {max(values):g}" if len(set(values)) > 1 else "")
    return (
        f"on {len(scores)} of {len(rows)} rows tried, the reference answer's held-out score "
        f"is {spread}, below 1 ({_named(scores[0][0])}): a team that learns every answer "
        "does not score 1 held out"
    )


def _named(row: RowAnswers) -> str:
    problem = row.problem
    where = f"{problem.origin} " if problem.origin else ""
    question = problem.question if len(problem.question) <= 60 else problem.question[:57] + "..."
    return f"{where}{question!r}"
