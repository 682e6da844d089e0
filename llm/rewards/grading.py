"""Verifiable reward on the final answer, checked with math-verify and failing closed.

An answer math-verify cannot parse scores 0 and is counted, so the parse-failure rate can be
logged next to the accuracy (a policy that learns to emit unparsable text must not look good).

An answer must also be worked out: when the reference is a number, a final answer that is an
unevaluated expression ("89 + 25", "12 * 3", "3/4") scores 0, although math-verify would
evaluate it and call it equal. Otherwise restating the question is rewarded as solving it: 7 of
the 17 answers graded right in an untrained team's evaluation on mixed phrasings were the
question's own expression (docs/tasks.md). A reference that is itself symbolic ("\\sqrt{2}")
accepts any equal expression.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Grade:
    """The verdict on one final answer."""

    correct: bool
    parsed: bool
    """False when no answer could be extracted (then ``correct`` is False)."""
    extracted: str | None
    """The extracted answer, for majority voting."""
    restated: bool = False
    """True when the reference is a number and the answer an unevaluated expression ("89 +
    25"): parsed, but not worked out (then ``correct`` is False)."""

    @property
    def reward(self) -> float:
        return 1.0 if self.correct else 0.0

    @property
    def well_formed(self) -> bool:
        """Whether the answer is one math-verify parses, and a number wherever the reference
        is one: what ``[task] format_reward`` pays for (an answer that restates the question
        as an expression is not well formed, as it is not correct)."""
        return self.parsed and not self.restated


@functools.lru_cache(maxsize=65536)
def grade(prediction: str, gold: str) -> Grade:
    """Compare the last message of a dialogue with the reference answer.

    Cached: a dialogue's final answer is graded for its reward, its format bonus and its parse
    statistic, and math-verify (sympy) costs far more than the lookup. ``Grade`` is immutable."""
    # math-verify imports sympy (0.35 s): where an answer is graded, not where a command that
    # stops on a bad config merely reads task definitions.
    from math_verify import parse, verify

    try:
        extracted = parse(prediction)
        if not extracted:
            return Grade(correct=False, parsed=False, extracted=None)
        gold_parsed = parse(gold)
        if not gold_parsed:
            raise ValueError(f"reference answer {gold!r} cannot be parsed")
        restated = _is_number(gold_parsed) and not _is_number(extracted)
        correct = not restated and bool(verify(gold_parsed, extracted))
    except ValueError:
        raise
    except Exception:  # math-verify raises assorted errors (timeouts, sympy); fail closed.
        return Grade(correct=False, parsed=False, extracted=None)
    return Grade(correct=correct, parsed=True, extracted=str(extracted[-1]), restated=restated)


def running_sum_turns(
    messages: Sequence[str], speakers: Sequence[int], values: Sequence[int]
) -> tuple[float, ...]:
    """The chain task's per-turn rewards: 1 for each turn that states the running sum.

    Turn t (spoken by ``speakers[t]``) should state the sum of the private numbers ``values``
    of every distinct speaker of turns 0..t: what the previous message said plus its own
    number. Each turn is graded like a final answer (``grade``: an unevaluated expression
    earns nothing).
    """
    if len(messages) != len(speakers) or not messages:
        raise ValueError(f"{len(messages)} messages for {len(speakers)} speakers")
    spoken: set[int] = set()
    credits = []
    for message, speaker in zip(messages, speakers, strict=True):
        spoken.add(speaker)
        total = sum(values[k] for k in spoken if k < len(values))
        credits.append(grade(message, str(total)).reward)
    return tuple(credits)


def running_sum_reward(
    messages: Sequence[str], speakers: Sequence[int], values: Sequence[int]
) -> float:
    """The chain's dialogue reward: the share of turns that state the running sum
    (``running_sum_turns``' mean), in {0, 1/H, ..., 1}: 1 exactly when every speaker kept the
    total right, so the final answer is right too."""
    credits = running_sum_turns(messages, speakers, values)
    return sum(credits) / len(credits)


def _is_number(parsed: list) -> bool:
    """Whether math-verify's parse is a single evaluated number (sympy keeps "89 + 25" as an
    unevaluated sum, "\\frac{1}{2}" and "-21" as numbers)."""
    return bool(getattr(parsed[0], "is_Number", False))
