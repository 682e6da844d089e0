"""`teamtr train --check` tries the reward on the task's own answers (a tiny random model never
writes them): what reference answers and empty ones score, and a warning where a reference
answer falls short of another answer, or of 1 held out, or where the reward raises on it. And
the task check plays in process whatever engine the run names. Real task files, the real
command line, a tiny random model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llm.interface.cli import main

TINY = """
[model]
source = "tiny"
[lora]
rank = 4
[team]
system_prompt = "Opposite."
role_prompts = []
[sampler]
prompts_per_batch = 2
group_size = 2
max_new_tokens = 6
[stage]
stages = 1
"""
OPPOSITES = [("hot", "cold"), ("up", "down"), ("early", "late"), ("open", "shut")]
HELD_OUT = [("wet", "dry"), ("old", "new")]
ROWS = len(OPPOSITES) + len(HELD_OUT)

EXACT = """
def score(d):
    return float(d.final.strip().lower() == d.problem.answer)
"""
HALVED = """
def score(d):
    # The right word earns 1 ... but the factor meant for a longer answer is applied to all.
    return 0.5 * float(d.final.strip().lower() == d.problem.answer)
"""
SWAPPED = """
def score(d):
    said = d.final.strip().lower()
    if said == d.problem.answer:
        return 0.5  # meant for an answer that only contains the word; swapped by mistake
    return 1.0 if d.problem.answer in said.split(" ") or d.problem.answer + "." in said else 0.0
"""
RAISES = """
KNOWN = {"warm": 0.5}

def score(d):
    said = d.final.strip().lower()
    if said == d.problem.answer:
        return 1.0 + KNOWN[said]  # a bonus table that lacks the right words
    return 0.0
"""


def checked(tmp_path: Path, reward: str, capsys) -> tuple[int, list[str], str]:
    """`teamtr train --check` of an opposites task whose reward is ``reward`` (rewards.py)."""
    for name, pairs in (("train.jsonl", OPPOSITES), ("test.jsonl", HELD_OUT)):
        rows = [{"question": f"The opposite of {a}?", "answer": b} for a, b in pairs]
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "rewards.py").write_text(reward)
    config = tmp_path / "opposites.toml"
    config.write_text(
        TINY
        + f"[run]\noutput_dir = {json.dumps(str(tmp_path / 'runs'))}\n"
        + '[task]\nkind = "dataset"\ntrain_file = "train.jsonl"\ntest_file = "test.jsonl"\n'
        + 'reward = "rewards:score"\neval_size = 2\n'
    )
    code = main(["train", "--config", str(config), "--check"])
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err


def answers_line(out: list[str]) -> str:
    (line,) = [line for line in out if line.startswith("reward tried on the task's own answers")]
    return line


def test_a_right_reward_scores_every_reference_answer_1_and_warns_of_nothing(tmp_path, capsys):
    code, out, _ = checked(tmp_path, EXACT, capsys)
    assert code == 0
    assert answers_line(out) == (
        f"reward tried on the task's own answers of {len(OPPOSITES)} training and "
        f"{len(HELD_OUT)} held-out rows: reference answers score 1 on {ROWS} of {ROWS}, empty "
        f"answers 0 on {ROWS} of {ROWS}; held-out score of the reference answers 1 on {ROWS} "
        f"of {ROWS}"
    )
    assert not [line for line in out if line.startswith("warning:")], out


def test_a_reward_that_halves_right_answers_is_said_and_warned_of(tmp_path, capsys):
    """The task has no metric and its answers are words: the reward is its held-out score,
    on which a team that learns every answer would score 0.5."""
    code, out, _ = checked(tmp_path, HALVED, capsys)
    assert code == 0
    assert f"reference answers score 0.5 on {ROWS} of {ROWS}" in answers_line(out)
    warnings = [line for line in out if line.startswith("warning:")]
    assert len(warnings) == 1, out
    assert (
        f"on {ROWS} of {ROWS} rows tried, the reference answer's held-out score is 0.5"
        in (warnings[0])
    )
    assert "'The opposite of hot?'" in warnings[0] and "does not score 1" in warnings[0]


def test_a_reward_that_pays_less_for_the_right_answer_than_for_a_sentence_is_warned_of(
    tmp_path, capsys
):
    code, out, _ = checked(tmp_path, SWAPPED, capsys)
    assert code == 0
    assert f"reference answers score 0.5 on {ROWS} of {ROWS}" in answers_line(out)
    below = [line for line in out if "scores below another answer" in line]
    assert len(below) == 1 and below[0].startswith("warning: "), out
    assert (
        f"on {ROWS} of {ROWS} rows tried, the reference answer scores below another answer: "
        f"{tmp_path / 'train.jsonl'}:1 'The opposite of hot?': reference 'cold' 0.5, sentence "
        "'The answer is cold.' 1"
    ) in below[0]


def test_a_reward_that_raises_on_right_answers_is_warned_of_naming_the_row(tmp_path, capsys):
    """The tiny model never says "cold": the reward's failing branch runs only on the task's
    own answers."""
    code, out, err = checked(tmp_path, RAISES, capsys)
    assert code == 0, err
    line = answers_line(out)
    assert f"reference answers score nothing on any of {ROWS} (the reward raised)" in line
    raised = [line for line in out if "fails on the reference answer" in line]
    assert len(raised) == 1 and raised[0].startswith("warning: the reward fails on"), out
    assert (
        f"of {ROWS} of {ROWS} rows tried; a run stops the first time its team answers right"
    ) in raised[0]
    assert (
        f"reward rewards:score on problem {tmp_path / 'train.jsonl'}:1 'The opposite of hot?'"
    ) in raised[0]
    assert "raised KeyError: 'cold'" in raised[0]


@pytest.mark.parametrize("reward", ["exact_match", "length_penalty"])
def test_the_task_check_plays_in_process_whatever_engine_the_run_names(tmp_path, capsys, reward):
    """A run with the vLLM engine and a ready-made reward: its task check plays the tiny
    model in process (vLLM cannot serve it), so `--check` needs no vLLM and no server. The
    engine's own checks come when the real model loads."""
    for name, pairs in (("train.jsonl", OPPOSITES), ("test.jsonl", HELD_OUT)):
        rows = [{"question": f"The opposite of {a}?", "answer": b} for a, b in pairs]
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / "served.toml"
    config.write_text(
        TINY.replace("[sampler]\n", '[sampler]\nengine = "vllm"\n')
        + f"[run]\noutput_dir = {json.dumps(str(tmp_path / 'runs'))}\n"
        + '[task]\nkind = "dataset"\ntrain_file = "train.jsonl"\ntest_file = "test.jsonl"\n'
        + f'reward = "{reward}"\neval_size = 2\n'
    )
    assert main(["train", "--config", str(config), "--check"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "8 dialogues played on a tiny random model" in out
    assert not (tmp_path / "runs").exists()
