"""The ready-made rewards by the names a config gives them, and a weighted list of rewards.

``[task] reward = "exact_match"`` needs no file of one's own; ``reward = ["exact_match",
"format_regex"]`` with ``reward_weights = [1.0, 0.2]`` and ``[task.reward_args.format_regex]
pattern = "Answer: .+"`` is their weighted sum (TRL's ``reward_funcs`` with
``reward_weights``). ``llm.problems.configured`` builds a task's reward through
``reward_named`` and ``Weighted``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llm.rewards.answers import Finished, contains_answer, exact_match, math_verify
from llm.rewards.shape import FormatRegex, LengthPenalty

RewardValue = float | Sequence[float]
RewardFunction = Callable[[Any], RewardValue]

REWARDS: dict[str, RewardFunction | type] = {
    "exact_match": exact_match,
    "contains_answer": contains_answer,
    "math_verify": math_verify,
    "format_regex": FormatRegex,
    "length_penalty": LengthPenalty,
}
"""Name -> the reward, or the class whose instance is the reward (built with the name's
``[task] reward_args``)."""
RANGES: dict[str, tuple[float, float]] = {
    "exact_match": (0.0, 1.0),
    "contains_answer": (0.0, 1.0),
    "math_verify": (0.0, 1.0),
    "format_regex": (0.0, 1.0),
    "length_penalty": (-1.0, 0.0),
}
"""Where each ready-made reward lies, per turn and so also as a dialogue's mean over turns."""
GRADING = frozenset({"exact_match", "contains_answer", "math_verify"})
"""The rewards that grade an answer right (1) or wrong (0): their mean is an accuracy, so a
task scored by one reports ``accuracy``; any other reward's mean is a ``score``."""


def grades_answers(function: object) -> bool:
    """Whether ``function`` is one of the ready-made rewards that grade an answer right or
    wrong (``GRADING``; ``math_verify`` is ``final_answer_reward``, every built-in task's)."""
    return any(function is REWARDS[name] for name in GRADING)


def reward_named(name: str, arguments: Mapping[str, Any] | None = None) -> RewardFunction:
    """The ready-made reward ``name`` (``REWARDS``), given its keyword ``arguments``; a
    ``ValueError`` saying what is wrong with them, or which names there are."""
    if name not in REWARDS:
        raise ValueError(f"no ready-made reward {name!r} (there are: {', '.join(REWARDS)})")
    reward = REWARDS[name]
    if isinstance(reward, type):
        try:
            built: RewardFunction = reward(**dict(arguments or {}))
        except TypeError as error:  # an argument the class does not take, or a missing one
            raise ValueError(f"{name}: {error}".replace("__init__() ", "")) from None
        return built
    if arguments:
        raise ValueError(f"{name} takes no arguments, got {dict(arguments)!r}")
    return reward


def weighted_range(
    names: Sequence[str], weights: Sequence[float] = ()
) -> tuple[float, float] | None:
    """Where the weighted sum of the rewards ``names`` lies (``weights`` () = 1 each): each
    weight times its reward's range, summed; None if any of them is a function of one's own,
    whose range nobody declared."""
    if any(name not in RANGES for name in names):
        return None
    low = high = 0.0
    for name, weight in zip(names, weights or (1.0,) * len(names), strict=True):
        ends = (weight * RANGES[name][0], weight * RANGES[name][1])
        low, high = low + min(ends), high + max(ends)
    return low, high


@dataclass(frozen=True)
class Weighted:
    """The weighted sum of several rewards: one float where every reward gives one, else one
    per turn, a reward of one float counting on every turn (the return, the turns' mean, is
    then the same weighted sum)."""

    rewards: tuple[RewardFunction, ...]
    weights: tuple[float, ...]
    names: tuple[str, ...] = ()
    """How the config names each reward (for messages)."""

    def __post_init__(self) -> None:
        if not self.rewards or len(self.weights) != len(self.rewards):
            raise ValueError(f"{len(self.weights)} weights for {len(self.rewards)} rewards")

    def __call__(self, dialogue: Finished) -> float | tuple[float, ...]:
        turns = len(dialogue.messages)
        values = [self._value(index, dialogue, turns) for index in range(len(self.rewards))]
        if all(isinstance(value, float) for value in values):
            return math.fsum(w * v for w, v in zip(self.weights, values, strict=True))  # type: ignore[operator]
        per_turn = [v if isinstance(v, tuple) else (v,) * turns for v in values]
        return tuple(
            math.fsum(w * v[t] for w, v in zip(self.weights, per_turn, strict=True))
            for t in range(turns)
        )

    def _value(self, index: int, dialogue: Finished, turns: int) -> float | tuple[float, ...]:
        """One reward's value, a float or one float per turn; a ``ValueError`` naming that
        reward for anything else (the task reports it with the row it was called on)."""
        reward = self.rewards[index]
        name = self.names[index] if index < len(self.names) else getattr(reward, "__name__", "")
        try:
            value = reward(dialogue)
        except Exception as error:  # one's own reward: named, then reported by the task
            raise ValueError(f"{name} raised {type(error).__name__}: {error}") from error
        if isinstance(value, numbers.Real):
            return float(value)
        if isinstance(value, Sequence) and not isinstance(value, str):
            if len(value) == turns and all(isinstance(v, numbers.Real) for v in value):
                return tuple(float(v) for v in value)
        raise ValueError(
            f"{name} returned {value!r:.60}; expected a float or one float per turn ({turns})"
        )
