"""The ready-made rewards of ``llm.rewards``, each on dialogues whose score is known, their
weighted lists, and ``[task] reward = "exact_match"`` training a team on a CSV of text answers
with no file of one's own (the real ``teamtr train`` on the tiny model)."""

from __future__ import annotations

import json
import math

import pytest
from llm_test_support import SMOKE

from llm.common.config import ConfigError, load_config, parse_override
from llm.common.rules import READY_MADE_REWARDS
from llm.interface.cli import main
from llm.problems.configured import build_task
from llm.problems.task import Dialogue
from llm.problems.tasks import Problem
from llm.rewards import (
    REWARDS,
    FormatRegex,
    LengthPenalty,
    Weighted,
    contains_answer,
    exact_match,
    math_verify,
    normalised,
    reward_named,
)
from llm.rewards.named import RANGES


def said(answer: str, *messages: str) -> Dialogue:
    return Dialogue(
        Problem("Q?", answer), tuple(messages), tuple(i % 2 for i in range(len(messages)))
    )


def test_the_names_a_config_checks_are_the_rewards_there_are():
    assert tuple(REWARDS) == READY_MADE_REWARDS
    # Every ready-made reward declares its range, or a measured certificate would lack one.
    assert tuple(RANGES) == READY_MADE_REWARDS


@pytest.mark.parametrize(
    ("answer", "final", "exact", "contains"),
    [
        ("Paris", "Paris", 1.0, 1.0),
        ("Paris", "  paris. ", 1.0, 1.0),  # case, punctuation and spaces do not count
        ("the Nile", "Nile", 1.0, 1.0),  # nor English articles
        ("Paris", "It is Paris.", 0.0, 1.0),
        ("Rome", "Romeo", 0.0, 0.0),  # whole words only
        ("Paris", "London", 0.0, 0.0),
        ("New York", "new  york!", 1.0, 1.0),
    ],
)
def test_exact_match_and_contains_answer(answer, final, exact, contains):
    dialogue = said(answer, "thinking", final)
    assert exact_match(dialogue) == exact and contains_answer(dialogue) == contains


def test_normalised_text():
    assert normalised("The  Nile.") == "nile" and normalised("Ｐａｒｉｓ") == "paris"


def test_math_verify_is_the_default_and_fails_closed():
    assert math_verify(said("114", "x", "114")) == 1.0
    assert math_verify(said("114", "x", "89 + 25")) == 0.0  # not worked out
    assert math_verify(said("114", "x", "no idea")) == 0.0


def test_format_regex_on_the_final_message_or_every_turn():
    answer_line = FormatRegex(pattern=r"Answer: \d+")
    assert answer_line(said("1", "hmm", " Answer: 12 ")) == 1.0
    assert answer_line(said("1", "Answer: 12", "Answer: twelve")) == 0.0
    every = FormatRegex(pattern=r"<think>.*</think>.*", per_turn=True)
    assert every(said("1", "<think>a\nb</think> 3", "4")) == (1.0, 0.0)
    with pytest.raises(ValueError, match="not a regular expression"):
        FormatRegex(pattern="(")


def test_length_penalty_is_soft_and_per_turn():
    penalty = LengthPenalty(max_chars=8, soft_chars=4)  # free up to 4, -1 from 8 on
    assert penalty(said("1", "abcd", "abcdef", "abcdefgh", "abcdefghij")) == (0.0, -0.5, -1.0, -1.0)
    assert LengthPenalty(max_chars=3, soft_chars=0)(said("1", "abc", "abcd")) == (0.0, -1.0)
    assert LengthPenalty(max_chars=400).soft_chars == 100
    with pytest.raises(ValueError, match="soft_chars <= max_chars"):
        LengthPenalty(max_chars=4, soft_chars=5)


def test_a_weighted_list_is_per_turn_where_one_reward_is():
    dialogue = said("Paris", "abcdefgh", "Paris")
    both = Weighted((exact_match, LengthPenalty(max_chars=8, soft_chars=3)), (1.0, 0.5))
    assert both(dialogue) == (1.0 - 0.5, 1.0)  # exact match counts on every turn
    assert math.isclose(sum(both(dialogue)) / 2, 1.0 - 0.25)  # the return: the same sum
    assert Weighted((exact_match, contains_answer), (0.5, 0.25))(dialogue) == 0.75


def test_a_config_names_rewards_their_weights_and_arguments():
    sets = [
        'task.reward=["exact_match", "format_regex"]',
        "task.reward_weights=[1.0, 0.2]",
        'task.reward_args={format_regex = {pattern = "Answer: .+"}}',
    ]
    task = build_task(load_config(SMOKE, [parse_override(s) for s in sets]).task)
    right = said("7", "x", "Answer: 7")
    assert task.returns(right).value == pytest.approx(0.2)  # formatted, not the exact answer
    assert task.returns(said("7", "x", "7")).value == 1.0
    assert task.score(said("7", "x", "7")) == 1.0  # held out: graded by exact_match
    with pytest.raises(ConfigError, match=r"--set task.reward_weights: needs one weight per"):
        load_config(SMOKE, [parse_override('task.reward="exact_match"'), parse_override(sets[1])])
    with pytest.raises(ConfigError, match="reward_args: format_regex: .*pattern"):
        build_task(load_config(SMOKE, [parse_override('task.reward="format_regex"')]).task)
    with pytest.raises(ValueError, match="takes no arguments"):
        reward_named("exact_match", {"x": 1})


CAPITALS = [("France", "Paris"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Peru", "Lima")]


def test_exact_match_trains_a_team_on_a_csv_of_text_answers(tmp_path, capsys):
    rows = "".join(f"Capital of {country}?,{city}\n" for country, city in CAPITALS)
    (tmp_path / "capitals.csv").write_text("question,answer\n" + rows)
    config = tmp_path / "capitals.toml"
    config.write_text(
        f'extends = "{SMOKE}"\n[task]\nkind = "dataset"\ntrain_file = "capitals.csv"\n'
        'test_file = "capitals.csv"\nreward = "exact_match"\n'
        f'[stage]\nstages = 1\n[run]\noutput_dir = "{tmp_path / "runs"}"\nname = "r"\n'
    )
    assert main(["train", "--config", str(config), "--check"]) == 0
    assert "reward called on a dialogue of 4 training problems" in capsys.readouterr().out
    assert main(["train", "--config", str(config), "--no-progress"]) == 0
    (stage,) = [json.loads(line) for line in (tmp_path / "runs/r/metrics.jsonl").open()]
    assert stage["eval"]["n"] == len(CAPITALS)
    # Each held-out problem graded right or wrong by exact_match: the accuracy is k / n for a
    # whole k (a partial score, as contains_answer's or a shaped reward's, would not be).
    right = stage["eval"]["accuracy"] * len(CAPITALS)
    assert right == pytest.approx(round(right), abs=1e-9) and 0 <= round(right) <= len(CAPITALS)
