"""A task: the problems a team trains and is tested on, and how a finished dialogue is scored.

One interface for the built-in tasks (``llm.problems.builtin``) and a user's own:

    def score(dialogue: Dialogue) -> float:          # or one float per turn
        return float(dialogue.final.strip() == dialogue.problem.answer)

    task = Task(train=[Problem("Capital of France?", "Paris"), ...], test=[...], reward=score)

- ``train``: the training problems, a list (drawn uniformly with replacement) or a function
  ``(rng, count) -> list[Problem]`` that draws them (procedural tasks);
- ``test``: the held-out problems of the periodic evaluation;
- ``reward``: a finished ``Dialogue`` -> one float, or one float per turn. Per-turn rewards
  r_1..r_H give the dialogue the return (1/H) sum_t r_t: the episodic return of the turn-level
  MDP (THEORY.md §2) scaled by 1/H, which GRPO's group normalisation makes the same advantage
  as the sum (up to its epsilon), and which keeps a share-of-turns reward in [0, 1]. The
  default is ``final_answer_reward``: 1 when math-verify finds the final message equal to
  ``Problem.answer``;
- ``metric``: the held-out score of one dialogue, in [0, 1]. The default: math-verify
  accuracy of the final message where the problem has a reference answer math-verify can
  parse, else the reward;
- ``grading``: whether the metric grades an answer right (1) or wrong (0). Its mean is then
  reported as ``accuracy``, else as ``score`` (``Task.measure``). None (the default): true for
  math-verify and the ready-made graders (``llm.rewards.GRADING``) and a metric function with
  the attribute ``grading = True`` (what a config's ``[task] metric`` can declare), false for
  any other function of one's own (a partial-credit or per-turn reward);
- ``bonus``: a training-only term added to the return (``[task] format_reward``); evaluation
  never sees it;
- ``roles``: the system prompt, per-agent role prompts and message lengths the task is
  written for (they replace the run's ``[team]`` and ``[sampler]`` values);
- ``environment``: a factory of ``llm.problems.environment.Environment`` (one per dialogue):
  the world whose text enters the context between turns, whose rewards
  ``environment_return`` sums (the reward to give such a task unless it has its own);
- ``split``: declares how problems are split (``identity -> "train" | "test"``), so that
  ``llm.check_task`` can check the training draws are disjoint from the test set.

What a reward returns is checked on every call (``Task.returns``): an exception, None, a
string, NaN or the wrong number of per-turn rewards is a ``RewardError`` of one line naming
the function, the problem and the dialogue.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import numbers
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from llm.problems.environment import EnvironmentFactory
from llm.problems.tasks import Problem, TaskError
from llm.rewards.answers import final_answer_reward
from llm.rewards.grading import Grade, grade
from llm.rewards.named import grades_answers

ProblemSource = Callable[[np.random.Generator, int], list[Problem]]


class RewardError(TaskError):
    """A reward or metric raised, or returned something that is not a reward."""


@dataclass(frozen=True)
class Dialogue:
    """A finished dialogue, as a reward sees it."""

    problem: Problem
    messages: tuple[str, ...]
    """Each turn's text, in order (decoded, the stop token left out)."""
    speakers: tuple[int, ...]
    """Who spoke each turn (agents 0..n-1)."""
    observations: tuple[str, ...] = ()
    """With an environment (``Task.environment``): the text it added after each turn, shared
    and private alike ("" where none); () without one."""
    environment_rewards: tuple[float, ...] = ()
    """With an environment: its reward for each turn; () without one."""
    opening: str = ""
    """With an environment: the opening text it showed (the problem's question otherwise)."""

    @property
    def final(self) -> str:
        """The last message: the team's answer."""
        return self.messages[-1] if self.messages else ""

    def one_line(self, width: int = 60) -> str:
        """The dialogue on one line, each message cut to ``width`` characters (for messages)."""

        def cut(text: str) -> str:
            text = repr(text)[1:-1]  # newlines and tabs written out: one line
            return text if len(text) <= width else text[: width - 3] + "..."

        parts = []
        for t, (speaker, message) in enumerate(zip(self.speakers, self.messages, strict=False)):
            parts.append(f"agent {speaker}: {cut(message)}")
            if t < len(self.observations) and self.observations[t]:
                parts.append(f"environment: {cut(self.observations[t])}")
        return " | ".join(parts)


RewardValue = float | Sequence[float]
Reward = Callable[[Dialogue], RewardValue]
Metric = Callable[[Dialogue], float]


@dataclass(frozen=True)
class FormatBonus:
    """``weight`` when the final answer is well formed (``Grade.well_formed``) against a
    reference math-verify parses: what ``[task] format_reward`` adds to a training dialogue's
    return."""

    weight: float

    def __call__(self, dialogue: Dialogue) -> float:
        if not reference_parses(dialogue.problem.answer):
            return 0.0  # no number to be well formed against
        return self.weight if verdict_of(dialogue).well_formed else 0.0


@functools.lru_cache(maxsize=4096)
def reference_parses(answer: str) -> bool:
    """Whether math-verify can parse ``answer`` (then the default metric is its accuracy)."""
    from math_verify import parse

    try:
        return bool(answer) and bool(parse(answer))
    except Exception:  # math-verify raises assorted errors (timeouts, sympy) on odd input
        return False


def environment_return(dialogue: Dialogue) -> float:
    """The environment's rewards of a dialogue, summed: the episodic return of THEORY.md §1's
    MDP (undiscounted) when the environment's rewards are the task's."""
    return math.fsum(dialogue.environment_rewards)


def verdict_of(dialogue: Dialogue) -> Grade:
    """The final answer's math-verify grade; for a problem without a reference math-verify
    can parse, an answer that is neither right nor unparsable (what the parse-failure
    statistic counts is then meaningless, and says so by never failing)."""
    if not reference_parses(dialogue.problem.answer):
        return Grade(correct=False, parsed=True, extracted=None)
    return grade(dialogue.final, dialogue.problem.answer)


@dataclass(frozen=True)
class Roles:
    """The roles a task is written for; None leaves the run's own value."""

    system_prompt: str | None = None
    role_prompts: tuple[str, ...] | None = None
    """One role prompt per agent, shown before each of its turns."""
    max_new_tokens: int | tuple[int, ...] | None = None
    """The longest message, for every agent or one per agent."""


def first_line(error: BaseException) -> str:
    """The first line of an exception's message ("" when it has none): for one-line reports."""
    text = str(error)
    return text.splitlines()[0] if text else ""


@contextlib.contextmanager
def reported(what: str) -> Iterator[None]:
    """Runs one's own code: a failure other than a ``TaskError`` becomes one ``TaskError``
    line, "<what> raised <type>: <first line of its message>"."""
    try:
        yield
    except TaskError:
        raise
    except Exception as error:  # the user's code: any failure is reported as one line
        raise TaskError(
            f"{what} raised {type(error).__name__}: {first_line(error)}"[:400]
        ) from None


def name_of(function: object) -> str:
    """``module:function`` of a callable, as a config file names it."""
    module = getattr(function, "__module__", None) or "?"
    name = getattr(function, "__qualname__", None) or type(function).__qualname__
    return f"{module}:{name}"


@dataclass(frozen=True)
class Returns:
    """What a dialogue earned: its return (the mean of ``per_turn`` where given)."""

    value: float
    per_turn: tuple[float, ...] | None = None


@dataclass(frozen=True, eq=False)
class Task:
    """Problems and a reward (see the module's docstring for every field)."""

    train: Sequence[Problem] | ProblemSource
    test: Sequence[Problem] = ()
    reward: Reward = final_answer_reward
    metric: Metric | None = None
    bonus: Reward | None = None
    roles: Roles | None = None
    name: str = "task"
    split: Callable[[str], str] | None = None
    """identity (``llm.problems.tasks.identity_of``) -> "train" or "test", where declared."""
    grading: bool | None = None
    """Whether ``metric`` grades answers right or wrong (None: ``measure`` decides)."""
    environment: EnvironmentFactory | None = None
    """A function returning a fresh ``Environment`` per dialogue; None: the team talks to
    itself (the context is the question and the agents' messages)."""
    reward_range: tuple[float, float] | None = (0.0, 1.0)
    """Where every return of ``reward`` lies (one float, or the mean of the per-turn ones):
    the bounds the measured certificate needs (``teamtr.measured``). The default fits the
    final-answer reward, the grading ones of ``llm.rewards`` and the chain's share of turns,
    each in [0, 1]; None: not declared, and the measured certificate says "not measured"."""

    def __post_init__(self) -> None:
        if self.reward_range is not None:
            object.__setattr__(self, "reward_range", checked_range(self.reward_range, self.name))
        if not callable(self.train):
            problems = tuple(self.train)
            if not problems:
                raise TaskError(f"task {self.name!r}: no training problems")
            for where, group in (("train", problems), ("test", self.test)):
                bad = next((p for p in group if not isinstance(p, Problem)), None)
                if bad is not None:
                    raise TaskError(
                        f"task {self.name!r}: {where} holds {type(bad).__name__} {bad!r:.60}; "
                        "expected llm.Problem(question, answer, ...)"
                    )
            object.__setattr__(self, "train", _with_origins(problems, "train"))
        object.__setattr__(self, "test", _with_origins(tuple(self.test), "test"))
        for field_name in ("reward", "metric", "bonus", "split", "environment"):
            value = getattr(self, field_name)
            if value is not None and not callable(value):
                raise TaskError(
                    f"task {self.name!r}: {field_name} must be a function, got {value!r:.60}"
                )

    # -- problems -----------------------------------------------------------------------------
    def draw(self, rng: np.random.Generator, count: int) -> list[Problem]:
        """``count`` training problems: uniformly with replacement from a list, or the
        task's own draw."""
        if callable(self.train):
            return list(self.train(rng, count))
        problems = self.train
        return [problems[int(i)] for i in rng.integers(len(problems), size=count)]

    @property
    def known_train(self) -> tuple[Problem, ...]:
        """The training problems known in advance (a list's; none for a procedural draw)."""
        return () if callable(self.train) else tuple(self.train)

    # -- scoring ------------------------------------------------------------------------------
    def returns(self, dialogue: Dialogue) -> Returns:
        """The reward of ``dialogue``, checked (``RewardError`` on anything but a finite
        float or one finite float per turn)."""
        value = _called(self.reward, dialogue, "reward")
        if isinstance(value, Sequence | np.ndarray) and not isinstance(value, str | bytes):
            if len(value) != len(dialogue.messages):
                raise RewardError(
                    _where(self.reward, dialogue, "reward")
                    + f"returned {len(value)} per-turn rewards for {len(dialogue.messages)} "
                    "turns (expected one float, or one float per turn)"
                )
            per_turn = tuple(_finite(v, self.reward, dialogue, "reward") for v in value)
            return Returns(math.fsum(per_turn) / len(per_turn), per_turn)
        return Returns(_finite(value, self.reward, dialogue, "reward"))

    def training_reward(self, dialogue: Dialogue) -> float:
        """The return the updater's advantages are computed from: the reward, plus the
        training-only ``bonus``."""
        value = self.returns(dialogue).value
        if self.bonus is None:
            return value
        return (
            _finite(_called(self.bonus, dialogue, "bonus"), self.bonus, dialogue, "bonus") + value
        )

    @property
    def training_range(self) -> tuple[float, float] | None:
        """Where every ``training_reward`` lies: ``reward_range`` widened by a format bonus's
        weight; None where the reward's range or a bonus of one's own's is not declared."""
        if self.reward_range is None:
            return None
        low, high = self.reward_range
        if self.bonus is None:
            return low, high
        if isinstance(self.bonus, FormatBonus):
            weight = self.bonus.weight
            return low + min(0.0, weight), high + max(0.0, weight)
        return None

    def measure(self, problems: Sequence[Problem]) -> str:
        """What the mean held-out score over ``problems`` is: ``"accuracy"`` where every
        dialogue is graded right or wrong (math-verify, a ready-made grader, or ``grading``
        declared), else ``"score"`` (a reward of one's own standing in for the metric)."""
        if self.grading is not None:
            grades = self.grading
        elif self.metric is not None:  # a function of one's own may say so: ``f.grading = True``
            grades = grades_answers(self.metric) or getattr(self.metric, "grading", False) is True
        else:  # math-verify where the reference parses, else the reward
            grades = grades_answers(self.reward) or all(
                reference_parses(problem.answer) for problem in problems
            )
        return "accuracy" if grades else "score"

    def score(self, dialogue: Dialogue, returns: Returns | None = None) -> float:
        """The held-out score of ``dialogue`` in [0, 1] (``metric``; by default math-verify
        accuracy where the problem's reference parses, else the reward: ``returns``, when the
        caller has it already, so that a costly reward is not called twice)."""
        if self.metric is None:
            if reference_parses(dialogue.problem.answer):
                return grade(dialogue.final, dialogue.problem.answer).reward
            value = (returns or self.returns(dialogue)).value
            metric: object = self.reward
        else:
            value = _finite(
                _called(self.metric, dialogue, "metric"), self.metric, dialogue, "metric"
            )
            metric = self.metric
        if not 0.0 <= value <= 1.0:
            raise RewardError(
                _where(metric, dialogue, "metric")
                + f"returned {value!r}; a held-out score must lie in [0, 1] (give the task a "
                "metric, or a reward in [0, 1])"
            )
        return value


def checked_range(reward_range: Sequence[float], name: str = "task") -> tuple[float, float]:
    """``reward_range`` as two finite floats low < high, or ``TaskError``."""
    try:
        low, high = (float(v) for v in reward_range)
    except (TypeError, ValueError):
        low = high = math.nan
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise TaskError(
            f"task {name!r}: reward_range must be two finite floats low < high, "
            f"got {reward_range!r}"
        )
    return low, high


def _with_origins(problems: tuple[Problem, ...], split: str) -> tuple[Problem, ...]:
    """``problems`` each with its ``origin``: where it was written, else its index in the
    task's list (``train[12]``), so that a reward's error names the row it failed on."""
    if all(problem.origin for problem in problems if isinstance(problem, Problem)):
        return problems
    return tuple(
        dataclasses.replace(problem, origin=f"{split}[{index}]")
        if isinstance(problem, Problem) and not problem.origin
        else problem
        for index, problem in enumerate(problems)
    )


def _where(function: object, dialogue: Dialogue, role: str) -> str:
    """The reward (or metric) and the row it was called on: its origin (file:line, or its
    index in the task), question, notes and the dialogue."""
    problem = dialogue.problem
    question = problem.question
    shown = question if len(question) <= 60 else question[:57] + "..."
    row = f"{problem.origin} " if problem.origin else ""
    notes = f", notes {list(problem.notes)!r:.120}" if any(problem.notes) else ""
    return (
        f"{role} {name_of(function)} on problem {row}{shown!r}{notes} "
        f"(dialogue: {dialogue.one_line()}): "
    )


def _called(function: Callable[[Dialogue], object], dialogue: Dialogue, role: str) -> object:
    try:
        return function(dialogue)
    except Exception as error:  # the user's code: any failure is reported as one line
        raise RewardError(
            _where(function, dialogue, role)
            + f"raised {type(error).__name__}: {first_line(error)}"[:300]
        ) from error


def _finite(value: object, function: object, dialogue: Dialogue, role: str) -> float:
    if isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_):
        number = float(value)
        if math.isfinite(number):
            return number
        raise RewardError(_where(function, dialogue, role) + f"returned {number} (not finite)")
    if isinstance(value, bool | np.bool_):
        return float(value)
    kind = "None" if value is None else f"{type(value).__name__} {value!r:.40}"
    raise RewardError(
        _where(function, dialogue, role)
        + f"returned {kind} (expected a float, or one float per turn)"
    )
