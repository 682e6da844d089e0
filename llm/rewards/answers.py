"""Rewards that grade a team's final answer right or wrong against the problem's reference.

- ``exact_match``: the final message equals the answer once both are normalised (SQuAD's
  normalisation: case, punctuation, English articles and spacing ignored), for text answers
  ("Paris", "the Nile") where math-verify has nothing to parse;
- ``contains_answer``: the normalised answer appears in the normalised final message as whole
  words ("I think it is Paris." holds "Paris"): for teams that answer in a sentence;
- ``math_verify`` (``final_answer_reward``, every built-in task's default): math-verify finds
  the final message equal to the answer, failing closed (``llm.rewards.grading``).

Each returns 1.0 or 0.0, so the mean over a held-out set is an accuracy (``GRADING``).
"""

from __future__ import annotations

import re
import string
import unicodedata
from typing import Protocol

from llm.rewards.grading import grade


class Answered(Protocol):
    """What a reward reads of a problem (``llm.Problem`` is one)."""

    @property
    def answer(self) -> str: ...


class Finished(Protocol):
    """What a reward reads of a finished dialogue (``llm.Dialogue`` is one): this room comes
    before the one that defines dialogues, so rewards name only what they read."""

    @property
    def problem(self) -> Answered: ...

    @property
    def messages(self) -> tuple[str, ...]: ...

    @property
    def final(self) -> str: ...


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalised(text: str) -> str:
    """``text`` as answers are compared: Unicode-folded (NFKC, casefold), without punctuation
    or the English articles, its spaces collapsed ("The  Nile." -> "nile")."""
    text = unicodedata.normalize("NFKC", text).casefold().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(dialogue: Finished) -> float:
    """1.0 when the final message is the reference answer, up to ``normalised``, else 0.0."""
    answer = normalised(dialogue.problem.answer)
    return float(bool(answer) and normalised(dialogue.final) == answer)


def contains_answer(dialogue: Finished) -> float:
    """1.0 when the normalised reference answer appears in the normalised final message as
    whole words ("Rome" in "it is rome", not in "romeo"), else 0.0."""
    answer = normalised(dialogue.problem.answer)
    return float(bool(answer) and f" {answer} " in f" {normalised(dialogue.final)} ")


def final_answer_reward(dialogue: Finished) -> float:
    """1 when math-verify finds the final message equal to the reference answer, else 0
    (``llm.rewards.grading.grade``: fail-closed, an unevaluated expression earns nothing)."""
    return grade(dialogue.final, dialogue.problem.answer).reward


math_verify = final_answer_reward
"""The name a config gives it: ``[task] reward = "math_verify"``."""
