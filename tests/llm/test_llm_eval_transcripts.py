"""`teamtr eval` transcripts and accuracy per template and difficulty, on the tiny model."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from llm_test_support import SMOKE

from llm.common.config import load_config
from llm.evaluation.held_out_problems import EVAL_ONLY_TEMPLATES, group_metrics
from llm.interface.cli import main
from llm.problems.rewards import grade
from llm.problems.tasks import Problem
from llm.training.builder import problem_sources


def config_with(tmp_path: Path, task_lines: str) -> Path:
    text = SMOKE.read_text().replace("[task]\neval_size = 4\n", f"[task]\n{task_lines}\n")
    text = text.replace("[run]\n", f'[run]\noutput_dir = "{tmp_path / "runs"}"\n')
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def test_group_metrics_summarise_each_template_difficulty_and_held_out_kind():
    problems = [
        Problem("q1", "1", "d1.what_is", 1),
        Problem("q2", "2", "d1.what_is", 1),
        Problem("q3", "3", "d1.take_away", 1),
        Problem("q4", "4", "d2.compute", 2),
        Problem("q5", "5"),  # from a file: in no group
    ]
    scores = np.array([1.0, 0.0, 1.0, 0.5, 1.0])
    table = group_metrics(problems, scores)
    assert "d1.take_away" in EVAL_ONLY_TEMPLATES and "d1.what_is" not in EVAL_ONLY_TEMPLATES
    assert "relay.repeat" in EVAL_ONLY_TEMPLATES and "relay.first" not in EVAL_ONLY_TEMPLATES
    assert "notes.add_up" in EVAL_ONLY_TEMPLATES
    expected = {
        "template/d1.what_is": [1.0, 0.0],
        "template/d1.take_away": [1.0],
        "template/d2.compute": [0.5],
        "difficulty/1": [1.0, 0.0, 1.0],
        "difficulty/2": [0.5],
        "seen_templates": [1.0, 0.0, 0.5],
        "eval_only_templates": [1.0],
    }
    assert {key.rsplit("/", 1)[0] for key in table} == set(expected)
    for group, values in expected.items():
        mean = sum(values) / len(values)
        variance = sum((v - mean) ** 2 for v in values) / len(values)
        assert table[f"{group}/accuracy"] == pytest.approx(mean, abs=1e-12)
        assert table[f"{group}/n"] == len(values)
        assert table[f"{group}/standard_error"] == pytest.approx(
            (variance / len(values)) ** 0.5, abs=1e-12
        )


def test_eval_writes_every_transcript_and_the_per_template_table(tmp_path, capsys):
    config = config_with(tmp_path, 'phrasing = "mixed"\neval_size = 16')
    out = tmp_path / "eval" / "untrained.json"
    assert main(["eval", "--config", str(config), "--json", str(out), "--no-progress"]) == 0
    result = json.loads(out.read_text())
    transcripts = out.with_name("untrained.transcripts.jsonl")
    assert result["transcripts"] == str(transcripts)
    records = [json.loads(line) for line in transcripts.read_text().splitlines()]
    problems = problem_sources(load_config(config))[1]
    assert [(r["question"], r["reference_answer"]) for r in records] == [
        (p.question, p.answer) for p in problems
    ]
    assert [(r["template"], r["difficulty"]) for r in records] == [
        (p.template, p.difficulty) for p in problems
    ]
    for record in records:
        assert [t["agent"] for t in record["turns"]] == [0, 1]  # fixed order, 2 turns
        verdict = grade(record["turns"][-1]["text"], record["reference_answer"])
        assert record["correct"] == verdict.correct and record["parsed"] == verdict.parsed
        assert record["parsed_answer"] == verdict.extracted
        assert record["reward"] == (1.0 if record["correct"] else 0.0)
        assert record["notes"] == [] and record["sample"] == 0
    # The table agrees with the transcripts, template by template.
    for template, count in Counter(r["template"] for r in records).items():
        right = [r["correct"] for r in records if r["template"] == template]
        assert result[f"template/{template}/n"] == count
        assert result[f"template/{template}/accuracy"] == pytest.approx(np.mean(right), abs=1e-12)
    held_out = sum(r["template"] in EVAL_ONLY_TEMPLATES for r in records)
    assert 0 < held_out < len(records)
    assert result["eval_only_templates/n"] == held_out
    assert result["seen_templates/n"] + held_out == result["n"] == 16
    assert result["difficulty/1/n"] == 16

    chosen = tmp_path / "mine.jsonl"
    samples = ["--samples", "2", "--transcripts", str(chosen)]
    assert (
        main(["eval", "--config", str(config), "--json", str(out), "--no-progress", *samples]) == 0
    )
    sampled = [json.loads(line) for line in chosen.read_text().splitlines()]
    assert [(r["problem"], r["sample"]) for r in sampled] == [(i // 2, i % 2) for i in range(32)]
    assert json.loads(out.read_text())["transcripts"] == str(chosen)


def test_private_notes_transcripts_carry_each_agents_note(tmp_path, capsys):
    config = config_with(tmp_path, 'kind = "private_notes"\nphrasing = "mixed"\neval_size = 6')
    out = tmp_path / "notes.json"
    transcripts = tmp_path / "notes.jsonl"
    argv = ["eval", "--config", str(config), "--json", str(out), "--transcripts", str(transcripts)]
    assert main([*argv, "--no-progress"]) == 0
    records = [json.loads(line) for line in transcripts.read_text().splitlines()]
    assert len(records) == 6
    for record in records:
        numbers = [int(note.split()[-1].rstrip(".")) for note in record["notes"]]
        assert len(numbers) == 2 and record["reference_answer"] == str(sum(numbers))
    result = json.loads(out.read_text())
    assert result["eval_only_templates/n"] == 2 and result["seen_templates/n"] == 4


def test_bad_transcripts_path_exits_2_before_evaluating(tmp_path, capsys):
    config = config_with(tmp_path, "eval_size = 2")
    out = tmp_path / "eval.json"
    for bad, message in [
        (tmp_path, "is a directory"),
        (out, "is the --json file"),
    ]:
        argv = ["eval", "--config", str(config), "--json", str(out), "--transcripts", str(bad)]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --transcripts: ") and message in err
    assert not out.exists()


def test_periodic_evaluations_in_training_carry_the_per_template_table(tmp_path, capsys):
    config = config_with(tmp_path, 'phrasing = "mixed"\ndifficulty = [1, 2]\neval_size = 30')
    assert main(["train", "--config", str(config), "--name", "mixed", "--no-progress"]) == 0
    lines = (tmp_path / "runs" / "mixed" / "metrics.jsonl").read_text().splitlines()
    for record in map(json.loads, lines):
        evaluation = record["eval"]
        assert evaluation["difficulty/1/n"] + evaluation["difficulty/2/n"] == 30
        templates = [k for k in evaluation if k.startswith("template/") and k.endswith("/n")]
        assert sum(evaluation[k] for k in templates) == 30


def test_transcripts_that_cannot_be_written_exit_1_after_the_results_are(
    tmp_path, capsys, monkeypatch
):
    """A full disk for the transcripts alone: the results are written, naming no transcripts,
    and the run exits 1 with one line naming --transcripts."""
    import errno
    import os

    import llm.training.checkpoint

    write_durably = llm.training.checkpoint._write_durably

    def full_for_transcripts(path: Path, data: bytes) -> None:
        if "transcripts" in path.name:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        write_durably(path, data)

    monkeypatch.setattr(llm.training.checkpoint, "_write_durably", full_for_transcripts)
    config = config_with(tmp_path, "eval_size = 2")
    out = tmp_path / "eval.json"
    assert main(["eval", "--config", str(config), "--json", str(out), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert (
        f"--transcripts {tmp_path / 'eval.transcripts.jsonl'}: cannot write the transcripts" in err
    )
    result = json.loads(out.read_text())
    assert result["transcripts"] is None and result["n"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml", "eval.json"]
