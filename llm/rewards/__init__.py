"""Ready-made rewards over finished dialogues, usable by name in a config (``[task] reward =
"exact_match"``) or from Python: ``exact_match`` and ``contains_answer`` for text answers,
``math_verify`` (every built-in task's default, failing closed), ``FormatRegex`` (a format a
message must follow) and ``LengthPenalty`` (per turn), ``Weighted`` for a weighted list of
rewards, and the graders behind them (``grade``, the chain's ``running_sum_turns``).

Room 2 of 13 in data-flow order: it imports only from ``llm.common`` and the core ``teamtr``,
never from a room after it (tests/test_package_imports.py); a reward reads a dialogue through
``Finished``, the few attributes it needs, so it does not import the dialogue's room.
"""

from llm.rewards.answers import (
    Finished,
    contains_answer,
    exact_match,
    final_answer_reward,
    math_verify,
    normalised,
)
from llm.rewards.grading import Grade, grade, running_sum_reward, running_sum_turns
from llm.rewards.named import GRADING, REWARDS, Weighted, grades_answers, reward_named
from llm.rewards.shape import FormatRegex, LengthPenalty

__all__ = [
    "GRADING",
    "REWARDS",
    "Finished",
    "FormatRegex",
    "Grade",
    "LengthPenalty",
    "Weighted",
    "contains_answer",
    "exact_match",
    "final_answer_reward",
    "grade",
    "grades_answers",
    "math_verify",
    "normalised",
    "reward_named",
    "running_sum_reward",
    "running_sum_turns",
]
