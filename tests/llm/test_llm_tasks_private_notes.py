"""The private-notes task: notes, answers, the split and the exact random-guess floor."""

from __future__ import annotations

import itertools
import re
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from llm_test_support import SMOKE

from llm.common.config import ConfigError, load_config
from llm.interface.cli import main
from llm.problems.private_notes import (
    NOTES_TEMPLATES,
    PrivateNotesSuite,
    note_text,
    random_guess_floor,
    sum_distribution,
)
from llm.problems.tasks import identity_of, split_of
from llm.training.builder import problem_sources


def enumerated_floor(n_agents: int, note_max: int) -> Fraction:
    """max_s P(sum = s), by listing every one of the note_max ** n_agents draws."""
    totals = Counter(
        sum(draw) for draw in itertools.product(range(1, note_max + 1), repeat=n_agents)
    )
    return Fraction(max(totals.values()), note_max**n_agents)


@pytest.mark.parametrize(
    ("n_agents", "note_max"), [(1, 1), (1, 9), (2, 9), (3, 9), (2, 2), (4, 5), (5, 3), (3, 10)]
)
def test_random_guess_floor_is_the_enumerated_mode_probability(n_agents, note_max):
    assert random_guess_floor(n_agents, note_max) == enumerated_floor(n_agents, note_max)
    counts = sum_distribution(n_agents, note_max)
    assert sum(counts.values()) == note_max**n_agents
    assert min(counts) == n_agents and max(counts) == n_agents * note_max


def test_known_floors():
    # Two numbers in 1..9: the sum 10 has 9 of the 81 draws; one number: any guess is 1/m.
    assert random_guess_floor(2, 9) == Fraction(1, 9)
    assert random_guess_floor(1, 7) == Fraction(1, 7)


@pytest.mark.parametrize("phrasing", ["plain", "mixed"])
def test_each_agent_gets_one_note_and_the_answer_is_their_sum(phrasing):
    suite = PrivateNotesSuite(3, note_max=9, phrasing=phrasing)
    problems = suite.sample("train", 2000, np.random.default_rng(0))
    numbers = []
    for problem in problems:
        assert len(problem.notes) == 3
        drawn = [int(re.fullmatch(r"Your private number is (\d+)\.", n)[1]) for n in problem.notes]
        assert all(1 <= x <= 9 for x in drawn)
        assert problem.answer == str(sum(drawn))
        assert problem.notes == tuple(note_text(x) for x in drawn)
        numbers += drawn
    # The public question carries nothing private: one text per template.
    per_template = {p.template: set() for p in problems}
    for problem in problems:
        per_template[problem.template].add(problem.question)
    assert all(len(questions) == 1 for questions in per_template.values())
    # Uniform on 1..9: each value's share within 5 standard errors of 1/9 (6000 draws; the
    # hash split keeps whole problems, independent of any one number).
    shares = Counter(numbers)
    tolerance = 5 * np.sqrt((1 / 9) * (8 / 9) / len(numbers))
    assert all(abs(shares[x] / len(numbers) - 1 / 9) < tolerance for x in range(1, 10))


@pytest.mark.parametrize("phrasing", ["plain", "mixed"])
def test_train_and_held_out_problems_are_disjoint(phrasing):
    suite = PrivateNotesSuite(3, note_max=9, phrasing=phrasing)
    train = suite.sample("train", 5000, np.random.default_rng(1))
    test = suite.fixed_set("test", 120, seed=4)
    eval_only = {t.id for t in NOTES_TEMPLATES if t.eval_only}
    assert not {identity_of(p) for p in train} & {identity_of(p) for p in test}
    assert all(split_of(identity_of(p)) == "train" for p in train)
    assert not {p.template for p in train} & eval_only
    assert len({identity_of(p) for p in test}) == 120
    counts = Counter(p.template for p in test)
    assert set(counts) == {t.id for t in suite.templates("test")}
    assert max(counts.values()) - min(counts.values()) <= 1
    if phrasing == "mixed":
        assert set(counts) & eval_only
        assert {p.template for p in train} == {t.id for t in NOTES_TEMPLATES if not t.eval_only}
    else:
        assert set(counts) == {p.template for p in train} == {NOTES_TEMPLATES[0].id}
    assert suite.fixed_set("test", 120, seed=4) == test


def test_a_run_passes_the_team_size_and_note_range(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(
        '[team]\nn_agents = 2\n[task]\nkind = "private_notes"\nnote_max = 20\neval_size = 60\n'
    )
    config = load_config(path)
    draw, test, known = problem_sources(config)
    assert known == [] and len(test) == config.task.eval_size
    for problem in draw(np.random.default_rng(0), 300) + test:
        assert len(problem.notes) == 2
        assert all(1 <= int(n.split()[-1].rstrip(".")) <= 20 for n in problem.notes)


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ('kind = "private_notes"\nnote_max = 0', "[task] note_max: must be >= 1"),
        ('kind = "private_notes"\nnote_max = 1.5', "[task] note_max: expected an integer"),
        ('kind = "notes"', "[task] kind: expected one of ['arithmetic', 'jsonl', 'private_"),
    ],
)
def test_bad_private_notes_keys_exit_2_naming_file_line_and_key(tmp_path, capsys, lines, expected):
    text = SMOKE.read_text().replace("[task]\n", f"[task]\n{lines}\n")
    config = tmp_path / "bad.toml"
    config.write_text(text.replace("[run]\n", f'[run]\noutput_dir = "{tmp_path / "runs"}"\n'))
    with pytest.raises(ConfigError):
        load_config(config)
    assert main(["train", "--config", str(config), "--name", "r", "--no-progress"]) == 2
    err = capsys.readouterr().err
    line = lines.splitlines()[-1]
    number = config.read_text().splitlines().index(line) + 1
    assert err.startswith(f"error: {config}:{number}: ") and expected in err


def test_too_large_a_held_out_set_for_few_notes_is_a_config_error(tmp_path, capsys):
    # Two numbers in 1..2: four draws in all, so 50 distinct held-out problems do not exist.
    text = SMOKE.read_text().replace("[task]\n", '[task]\nkind = "private_notes"\nnote_max = 2\n')
    text = text.replace("eval_size = 4", "eval_size = 50")
    config = tmp_path / "small.toml"
    config.write_text(text.replace("[run]\n", f'[run]\noutput_dir = "{tmp_path / "runs"}"\n'))
    assert main(["train", "--config", str(config), "--name", "r", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "[task] eval_size: 50 distinct held-out problems cannot be drawn" in err
    assert "raise [task] note_max" in err


def test_the_held_out_capacity_is_counted_exactly():
    suite = PrivateNotesSuite(3, note_max=9)
    (template,) = suite.templates("test")
    draws = list(itertools.product(range(1, 10), repeat=3))
    held_out = [
        d for d in draws if split_of(identity_of(suite.problem(template, list(d)))) == "test"
    ]
    assert suite.available(template, "test") == len(held_out)
    everything = suite.fixed_set("test", len(held_out), seed=0)
    assert sorted(p.notes for p in everything) == sorted(
        tuple(note_text(x) for x in d) for d in held_out
    )
    with pytest.raises(ValueError, match=f"has only {len(held_out)} for 3 agents"):
        suite.fixed_set("test", len(held_out) + 1, seed=0)


def test_the_relay_answer_is_the_first_speakers_number_and_its_floor_is_exact():
    suite = PrivateNotesSuite(2, note_max=50, phrasing="mixed", answer="first")
    problems = suite.sample("train", 500, np.random.default_rng(0))
    for problem in problems:
        first = int(problem.notes[0].removeprefix("Your private number is ").rstrip("."))
        assert problem.answer == str(first)
        assert problem.template.startswith("relay.") and problem.template != "relay.repeat"
    held_out = suite.fixed_set("test", 60, seed=1)
    assert {p.template for p in held_out} == {"relay.first", "relay.pass_on", "relay.repeat"}
    assert not {p.question for p in held_out if p.template == "relay.repeat"} & {
        p.question for p in problems
    }
    # Best constant guess: the first number is uniform on 1..50, whatever the other one is.
    firsts = Counter(draw[0] for draw in itertools.product(range(1, 51), repeat=2))
    assert random_guess_floor(2, 50, "first") == Fraction(max(firsts.values()), 50**2)
