"""Tasks, grading and routers."""

from __future__ import annotations

import numpy as np
import pytest

from llm.conversation.router import FixedOrder, Handoff, RandomOrder
from llm.problems.rewards import grade
from llm.problems.tasks import ArithmeticSuite, TaskDataError, load_jsonl, split_of


@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_arithmetic_answers_are_right_and_splits_disjoint(difficulty):
    suite = ArithmeticSuite(difficulty)
    test = suite.fixed_set("test", 50, seed=0)
    train = suite.sample("train", 300, np.random.default_rng(0))
    assert len({p.question for p in test}) == 50
    assert not {p.question for p in test} & {p.question for p in train}
    assert all(split_of(p.question) == "train" for p in train)
    for problem in test + train[:50]:
        expression = problem.question.removeprefix("What is ").removesuffix("?")
        assert int(problem.answer) == eval(expression)  # noqa: S307 - our own generated text
    assert suite.fixed_set("test", 50, seed=0) == test


def test_jsonl_loader_names_file_line_and_field(tmp_path):
    path = tmp_path / "gsm.jsonl"
    path.write_text(
        '{"question": "a?", "answer": "so 3 #### 42"}\n\n{"question": "b?", "answer": 7}\n'
    )
    problems = load_jsonl(path)
    assert [p.answer for p in problems] == ["42", "7"]
    for text, message in [
        ('{"question": "a?"}\n', ":1: missing field 'answer'"),
        ('{"question": "a?", "answer": "1"}\nnot json\n', ":2: not valid JSON"),
        ('{"question": "", "answer": "1"}\n', ":1: field 'question' is empty"),
        ("[1, 2]\n", ":1: expected a JSON object"),
    ]:
        path.write_text(text)
        with pytest.raises(TaskDataError, match=str(path) + message):
            load_jsonl(path)


def test_grading_fails_closed():
    assert grade("So the answer is 42.", "42").correct
    # A restated expression is not an answer, however equal; a worked one ending in it is.
    assert not grade("89 + 25", "114").correct and grade("89 + 25", "114").parsed
    assert not grade("12 * 3", "36").correct and not grade("$89+25$", "114").correct
    assert grade("89 + 25 = 114", "114").correct and grade("-21", "-21").correct
    assert grade("\\frac{1}{2}", "0.5").correct
    assert grade("$\\sqrt{2}$", "$\\sqrt{2}$").correct  # a symbolic reference takes an expression
    assert not grade("It is 41", "42").correct and grade("It is 41", "42").parsed
    unparsable = grade("I do not know", "42")
    assert not unparsable.correct and not unparsable.parsed and unparsable.reward == 0.0


def test_routers():
    assert [FixedOrder(3, (2, 0, 1)).speaker(t, 0, None, None) for t in range(4)] == [2, 0, 1, 2]
    random_order = RandomOrder(3)
    first_three = [random_order.speaker(t, 7, None, None) for t in range(3)]
    assert sorted(first_three) == [0, 1, 2]
    assert first_three == [random_order.speaker(t, 7, None, None) for t in range(3)]
    handoff = Handoff(3)
    assert handoff.speaker(0, 0, None, None) == 0
    assert handoff.speaker(1, 0, "over to @agent2", 0) == 2
    assert handoff.speaker(2, 0, "no mention", 2) == 0
    assert handoff.speaker(2, 0, "@agent2 again and @agent9", 2) == 0  # self and unknown ignored
