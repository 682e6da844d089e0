"""Rewards on the shape of the messages rather than their answer: a format a message must
follow, and a penalty on messages that run long (TRL's ``think_format_reward`` and
``get_soft_overlong_punishment``). Both are configured by keyword arguments
(``[task] reward_args``) and usually weighted next to an answer's reward.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from llm.rewards.answers import Finished


@dataclass(frozen=True)
class FormatRegex:
    """1.0 for a message the regular expression ``pattern`` matches whole (``re.fullmatch``,
    ``.`` matching newlines too, the message's outer spaces ignored), else 0.0: of the final
    message, or of every message (``per_turn``: one value per turn, so each speaker is paid
    for its own)."""

    pattern: str
    per_turn: bool = False
    compiled: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.pattern, str) or not self.pattern:
            raise ValueError(f"pattern must be a regular expression, got {self.pattern!r}")
        try:
            object.__setattr__(self, "compiled", re.compile(self.pattern, re.DOTALL))
        except re.error as error:
            raise ValueError(
                f"pattern {self.pattern!r} is not a regular expression: {error}"
            ) from None
        if not isinstance(self.per_turn, bool):
            raise ValueError(f"per_turn must be true or false, got {self.per_turn!r}")

    def matches(self, message: str) -> float:
        return float(self.compiled.fullmatch(message.strip()) is not None)

    def __call__(self, dialogue: Finished) -> float | tuple[float, ...]:
        if self.per_turn:
            return tuple(self.matches(message) for message in dialogue.messages)
        return self.matches(dialogue.final)


@dataclass(frozen=True)
class LengthPenalty:
    """Per turn: 0 for a message of at most ``max_chars - soft_chars`` characters, falling
    linearly to -1 at ``max_chars`` and -1 beyond (the soft overlong punishment of DAPO, in
    characters, as a reward sees text and not tokens). ``soft_chars`` = 0: -1 past
    ``max_chars`` only. One value per turn: a long message costs its own speaker."""

    max_chars: int = 400
    soft_chars: int = 100

    def __post_init__(self) -> None:
        for name in ("max_chars", "soft_chars"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if self.max_chars < 1 or self.soft_chars > self.max_chars:
            raise ValueError(
                f"needs 0 <= soft_chars <= max_chars and max_chars >= 1, got max_chars = "
                f"{self.max_chars}, soft_chars = {self.soft_chars}"
            )

    def penalty(self, message: str) -> float:
        soft = self.soft_chars or 0
        over = len(message) - (self.max_chars - soft)
        if over <= 0:
            return 0.0
        if len(message) > self.max_chars or soft == 0:
            return -1.0
        return -over / soft

    def __call__(self, dialogue: Finished) -> tuple[float, ...]:
        return tuple(self.penalty(message) for message in dialogue.messages)
