"""Data rows and rewards of one's own, as ``teamtr train --check`` sees them: a row without its
question or answer is named by the file's 1-based line and the key, and the reward is called on
a dialogue of every training problem, so a reward that fails on one row in fifty fails there,
named by that row and its notes.

Every run is the real command line on real files (``llm.interface.cli.main``, the tiny model
of ``configs/smoke.toml``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llm_test_support import SMOKE

from llm.interface.cli import main
from llm.problems.task import Dialogue, RewardError, Task
from llm.problems.tasks import Problem
from llm.training.task_check import check_task


def config(tmp_path: Path, task: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(f'extends = "{SMOKE}"\n[task]\n{task}\n[run]\noutput_dir = "runs"\n')
    return path


def check(tmp_path: Path, task: str, capsys) -> tuple[int, str, str]:
    status = main(["train", "--config", str(config(tmp_path, task)), "--check"])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def rows(count: int, lacking: int | None = None, key: str = "answer") -> str:
    """``count`` JSONL rows; row ``lacking`` (0-based) has no ``key``."""
    lines = []
    for index in range(count):
        row = {"question": f"Capital number {index}?", "answer": f"City {index}", "id": index}
        if index == lacking:
            del row[key]
        lines.append(json.dumps(row))
    return "\n".join(lines) + "\n"


def write_reward(tmp_path: Path, body: str) -> None:
    (tmp_path / "mine.py").write_text(f"def score(d):\n{body}")


EXACT = "    return float(d.final.strip() == d.problem.answer)\n"


@pytest.mark.parametrize("key", ["answer", "question"])
def test_a_row_without_its_answer_or_question_names_line_3_and_the_key(tmp_path, capsys, key):
    (tmp_path / "rows.jsonl").write_text(rows(5, lacking=2, key=key))
    write_reward(tmp_path, EXACT)
    task = 'kind = "dataset"\ntrain_file = "rows.jsonl"\nreward = "mine:score"'
    status, _, err = check(tmp_path, task, capsys)
    assert status == 2, err
    assert f"rows.jsonl:3: no {key!r} in this row" in err
    assert not (tmp_path / "runs").exists()


def test_a_blank_line_and_a_csv_header_count_as_lines(tmp_path, capsys):
    (tmp_path / "rows.jsonl").write_text("\n" + rows(3, lacking=1))  # the row is on line 3
    write_reward(tmp_path, EXACT)
    task = 'kind = "dataset"\ntrain_file = "rows.jsonl"\nreward = "mine:score"'
    assert "rows.jsonl:3: no 'answer'" in check(tmp_path, task, capsys)[2]
    (tmp_path / "rows.csv").write_text('question,answer\nA?,1\n"B,\nb?",\nC?,3\n')
    task = 'kind = "dataset"\ntrain_file = "rows.csv"\nreward = "mine:score"'
    status, _, err = check(tmp_path, task, capsys)  # the quoted question spans lines 3-4
    assert status == 2 and "rows.csv:3: no 'answer' in this row" in err, err


def test_without_a_reward_an_answer_math_verify_cannot_parse_names_its_line(tmp_path, capsys):
    (tmp_path / "rows.jsonl").write_text(
        "\n".join(json.dumps({"question": f"{i} + 1?", "answer": str(i + 1)}) for i in range(4))
        + '\n{"question": "Capital?", "answer": "Paris"}\n'
    )
    status, _, err = check(tmp_path, 'kind = "dataset"\ntrain_file = "rows.jsonl"', capsys)
    assert status == 2 and "rows.jsonl:5: answer 'Paris' is not a number" in err, err
    assert 'reward = "exact_match"' in err


def test_a_task_without_answers_says_so_with_an_empty_answer_column(tmp_path, capsys):
    (tmp_path / "rows.jsonl").write_text(rows(4, lacking=1))
    write_reward(tmp_path, "    return float(len(d.final) > 2)\n")
    task = 'kind = "dataset"\ntrain_file = "rows.jsonl"\nanswer_column = ""\nreward = "mine:score"'
    status, out, err = check(tmp_path, task, capsys)
    assert status == 0, err
    assert "reward called on a dialogue of 4 training problems" in out


def test_a_reward_that_raises_on_one_row_in_fifty_fails_at_check_naming_it(tmp_path, capsys):
    (tmp_path / "rows.jsonl").write_text(rows(50))
    write_reward(
        tmp_path,
        "    if d.problem.metadata['id'] == 37:\n"
        "        raise KeyError('no judge for this one')\n" + EXACT,
    )
    task = 'kind = "dataset"\ntrain_file = "rows.jsonl"\nreward = "mine:score"'
    status, _, err = check(tmp_path, task, capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert "reward mine:score on problem" in err and "rows.jsonl:38 'Capital number 37?'" in err
    assert "raised KeyError" in err
    write_reward(tmp_path, EXACT)  # fixed, the same check passes and says how many it called
    status, out, err = check(tmp_path, task, capsys)
    assert status == 0, err
    assert "reward called on a dialogue of 50 training problems" in out


def test_a_python_tasks_reward_error_names_the_problems_index_and_notes():
    problems = [Problem(f"Sum? {i}", str(i), notes=(f"n{i}", "")) for i in range(20)]

    def score(dialogue: Dialogue) -> float:
        if dialogue.problem.answer == "13":
            raise ValueError("bad row")
        return 0.0

    with pytest.raises(
        RewardError, match=r"on problem train\[13\] 'Sum\? 13', notes \['n13', ''\]"
    ):
        check_task(Task(train=problems, reward=score))
