"""Arithmetic phrasings: templates, difficulties, eval-only templates and the split."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest
from llm_test_support import SMOKE

from llm.common.config import ConfigError, load_config
from llm.interface.cli import main
from llm.problems.phrasings import TEMPLATES, templates_of
from llm.problems.tasks import ArithmeticSuite, _arithmetic_problem, split_of

# The answer of each word problem, recomputed from the numbers in its question, in order.
WORD_ANSWERS = {
    "d1.shop_sold": lambda a, b: a - b,
    "d1.bus_on": lambda a, b: a + b,
    "d1.birds_land": lambda a, b: a + b,
    "d1.take_away": lambda b, a: a - b,
    "d1.marbles_given": lambda a, b: a - b,
    "d2.pens_in_boxes": lambda a, b, c: a * b + c,
    "d2.train_stop": lambda a, b, c: a + b - c,
    "d2.library_books": lambda a, b, c: a + b - c,
    "d2.garden_rows": lambda a, b, c: a * b + c,
    "d3.marble_bags": lambda a, b, c, d: (a + b) * c - d,
    "d3.class_stickers": lambda a, b, c, d: (a + b) * c - d,
}
EXPRESSION = re.compile(
    r"^(What is |Compute |Evaluate the expression )?(?P<e>[-+*() 0-9]+?)( = )?[?.]?$"
)


def test_plain_phrasing_is_exactly_the_earlier_question_stream():
    """One plain difficulty: the same questions as drawing ``_arithmetic_problem`` directly and
    keeping the first distinct ones of the split (the earlier algorithm)."""
    for difficulty in (1, 2, 3):
        rng = np.random.default_rng(1234)
        earlier: dict[str, str] = {}
        while len(earlier) < 60:
            problem = _arithmetic_problem(difficulty, rng)
            if split_of(problem.question) == "test":
                earlier.setdefault(problem.question, problem.answer)
        suite = ArithmeticSuite(difficulty)
        fixed = suite.fixed_set("test", 60, seed=1234)
        assert [(p.question, p.answer) for p in fixed] == list(earlier.items())
        assert {p.template for p in fixed} == {f"d{difficulty}.what_is"}
        assert {p.difficulty for p in fixed} == {difficulty}
        trained = suite.sample("train", 40, np.random.default_rng(5))
        rng = np.random.default_rng(5)
        direct = []
        while len(direct) < 40:
            problem = _arithmetic_problem(difficulty, rng)
            if split_of(problem.question) == "train":
                direct.append(problem.question)
        assert [p.question for p in trained] == direct


@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_the_what_is_template_draws_the_plain_questions(difficulty):
    (what_is,) = [t for t in templates_of(difficulty) if t.id.endswith("what_is")]
    for seed in range(20):
        question, answer = what_is.draw(np.random.default_rng(seed))
        plain = _arithmetic_problem(difficulty, np.random.default_rng(seed))
        assert (question, str(answer)) == (plain.question, plain.answer)


def test_every_template_answers_right_and_word_problems_never_count_below_zero():
    assert len(templates_of(1)) >= 6 and templates_of(2) and templates_of(3)
    for d in (1, 2, 3):
        assert templates_of(d, eval_only=True) and templates_of(d, eval_only=False)
    assert len({t.id for t in TEMPLATES}) == len(TEMPLATES)
    rng = np.random.default_rng(0)
    for template in TEMPLATES:
        assert template.id.startswith(f"d{template.difficulty}.")
        for _ in range(2000 if template.id in WORD_ANSWERS else 200):
            question, answer = template.draw(rng)
            if template.id in WORD_ANSWERS:
                numbers = [int(n) for n in re.findall(r"-?\d+", question)]
                assert all(n >= 0 for n in numbers), question
                assert answer >= 0, question
                assert answer == WORD_ANSWERS[template.id](*numbers), question
            else:
                match = EXPRESSION.match(question)
                assert match, question
                assert answer == eval(match["e"]), question  # noqa: S307 - our own text
    assert set(WORD_ANSWERS) == {
        t.id for t in TEMPLATES if EXPRESSION.match(t.draw(rng)[0]) is None
    }


@pytest.mark.parametrize("difficulty", [1, 2, 3, (1, 2, 3)])
def test_mixed_training_never_sees_eval_only_templates_or_test_questions(difficulty):
    suite = ArithmeticSuite(difficulty, "mixed")
    train = suite.sample("train", 3000, np.random.default_rng(0))
    test = suite.fixed_set("test", 120, seed=7)
    eval_only = {t.id for t in TEMPLATES if t.eval_only}
    training_templates = {t.id for t in suite.templates("train")}
    assert {p.template for p in train} == training_templates
    assert not training_templates & eval_only
    assert not {p.question for p in train} & {p.question for p in test}
    assert all(split_of(p.question) == "train" for p in train)
    # The held-out set: every template, balanced (counts differ by at most one), distinct,
    # the test half of the hash for training templates, and fixed by the seed.
    counts = Counter(p.template for p in test)
    assert set(counts) == {t.id for t in suite.templates("test")}
    assert set(counts) & eval_only and set(counts) - eval_only
    assert max(counts.values()) - min(counts.values()) <= 1 and len(test) == 120
    assert len({p.question for p in test}) == 120
    assert all(split_of(p.question) == "test" for p in test if p.template not in eval_only)
    assert suite.fixed_set("test", 120, seed=7) == test
    assert suite.fixed_set("test", 120, seed=8) != test
    for problem in test + train[:200]:
        assert problem.template.startswith(f"d{problem.difficulty}.")


def test_a_difficulty_mix_draws_each_difficulty_about_equally():
    suite = ArithmeticSuite((1, 3))
    train = suite.sample("train", 4000, np.random.default_rng(0))
    counts = Counter(p.difficulty for p in train)
    assert set(counts) == {1, 3}
    # Binomial(4000, 1/2) filtered by the hash split (about 80% kept either way): 5 standard
    # errors of the share are 0.04.
    assert abs(counts[1] / len(train) - 0.5) < 0.04
    test = suite.fixed_set("test", 50, seed=0)
    assert Counter(p.difficulty for p in test) == {1: 25, 3: 25}
    assert all(p.question.startswith("What is ") for p in test + train)


def test_config_reads_phrasing_and_a_difficulty_list(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[task]\ndifficulty = [1, 2]\nphrasing = "mixed"\n')
    task = load_config(path).task
    assert task.difficulty == (1, 2) and task.phrasing == "mixed"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('phrasing = "fancy"', "[task] phrasing: expected one of ['plain', 'mixed']"),
        ("difficulty = 4", "[task] difficulty: must be 1, 2 or 3, or a non-empty list"),
        ("difficulty = [1, 4]", "[task] difficulty: must be 1, 2 or 3"),
        ("difficulty = []", "[task] difficulty: must be 1, 2 or 3"),
        ("difficulty = [2, 2]", "list of distinct ones"),
        ('difficulty = "1"', "[task] difficulty: expected an integer"),
    ],
)
def test_bad_task_keys_exit_2_naming_file_line_and_key(tmp_path, capsys, line, expected):
    text = SMOKE.read_text().replace("[task]\n", f"[task]\n{line}\n")
    text = text.replace("[run]\n", f'[run]\noutput_dir = "{tmp_path / "runs"}"\n')
    config = tmp_path / "bad.toml"
    config.write_text(text)
    with pytest.raises(ConfigError):
        load_config(config)
    assert main(["train", "--config", str(config), "--name", "r", "--no-progress"]) == 2
    err = capsys.readouterr().err
    number = next(n for n, text_line in enumerate(text.splitlines(), 1) if text_line == line)
    assert err.startswith(f"error: {config}:{number}: ") and expected in err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_a_run_draws_mixed_training_problems_and_holds_out_the_balanced_set(tmp_path):
    from llm.training.builder import problem_sources

    path = tmp_path / "c.toml"
    path.write_text('[task]\nphrasing = "mixed"\neval_size = 40\neval_seed = 3\n')
    config = load_config(path)
    draw, test, known = problem_sources(config)
    assert test == ArithmeticSuite(1, "mixed").fixed_set("test", 40, seed=3) and known == []
    drawn = draw(np.random.default_rng(0), 500)
    assert {p.template for p in drawn} == {t.id for t in templates_of(1, eval_only=False)}
    assert not {p.question for p in drawn} & {p.question for p in test}
