"""``studies.llm.reasoning.rescore_transcripts``: saved held-out transcripts scored again by a config's
metric as it is now, on the config's own held-out problems."""

from __future__ import annotations

import json

import pytest

from llm.common.config import load_config
from llm.problems.configured import build_task
from studies.llm.reasoning.rescore_transcripts import main, rescore

pytest.importorskip("reasoning_gym")

CONFIG = "reasoning/chain_sum_single"


def row(task, index, text, correct):
    problem = task.test[index]
    turns = [{"agent": 0, "text": text}]
    return {"problem": index, "question": problem.question, "turns": turns, "correct": correct}


@pytest.fixture(scope="module")
def task():
    config = load_config(CONFIG, [])
    return build_task(config.task, config.team.n_agents)


def test_each_dialogue_by_the_metric_now(task, tmp_path, capsys):
    right = task.test[0].answer
    wrong = str(int(right) + 1)
    rows = [
        row(task, 0, f"The answer is {right}.", True),
        # recorded right under a reading that took the list's "2." as the answer
        row(task, 1, f"1. It is {wrong}.\n2. So it", True),
        row(task, 0, "", False),
    ]
    assert rescore(task, rows) == [True, task.test[1].answer == wrong, False]
    path = tmp_path / "x.transcripts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["--config", CONFIG, str(path), "--json", str(tmp_path / "r.json")]) == 0
    result = json.loads((tmp_path / "r.json").read_text())[str(path)]
    assert result["recorded"] == pytest.approx(2 / 3) and result["n"] == 3
    assert result["changed"] == (0 if task.test[1].answer == wrong else 1)
    assert "| x.transcripts.jsonl | 67% |" in capsys.readouterr().out


def test_a_transcript_of_another_evaluation_is_refused(task):
    other = row(task, 0, "7", True) | {"question": "What is 1 + 1?"}
    with pytest.raises(ValueError, match="not this config's evaluation"):
        rescore(task, [other])
