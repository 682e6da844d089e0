"""Curves from checkpoints (``studies.llm.checkpoint_curves``): every stage checkpoint of a run,
evaluated after the fact, gives what the run's own evaluation gave at that stage."""

from __future__ import annotations

import json
from pathlib import Path

from llm.interface.cli import main as teamtr_main
from studies.llm.checkpoint_curves import main

REPO = Path(__file__).resolve().parents[2]


def test_every_checkpoint_is_evaluated_as_the_run_evaluated_it(tmp_path, capsys):
    config = tmp_path / "smoke.toml"
    config.write_text((REPO / "configs" / "smoke.toml").read_text())  # 2 stages, eval_every 1
    runs, results = tmp_path / "runs", tmp_path / "curves"
    arguments = ["train", "--config", str(config), "--output-dir", str(runs), "--name", "r",
                 "--no-progress"]  # fmt: skip
    assert teamtr_main(arguments) == 0
    assert main(["--runs", str(runs), "--results", str(results), "--no-progress"]) == 0
    curve = json.loads((results / "r.json").read_text())
    logged = [json.loads(line) for line in (runs / "r" / "metrics.jsonl").open()]
    assert curve["run"] == "r" and curve["scheme"] == "teamtr"
    assert [point["stages_trained"] for point in curve["curve"]] == [1, 2]
    for point, stage in zip(curve["curve"], logged, strict=True):
        # Greedy decoding of the same adapters on the same held-out set: the same dialogues.
        for key in ("accuracy", "n", "mean_tokens", "parse_failure_rate"):
            assert point["metrics"][key] == stage["eval"][key], key
        assert point["budget_minutes"] is not None and point["budget_minutes"] > 0
    minutes = [point["budget_minutes"] for point in curve["curve"]]
    assert minutes == sorted(minutes)
    # Rerunning resumes: a run whose file exists is not evaluated again.
    before = (results / "r.json").stat().st_mtime_ns
    assert main(["--runs", str(runs), "--results", str(results), "--no-progress"]) == 0
    assert (results / "r.json").stat().st_mtime_ns == before


def test_a_folder_without_runs_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["--runs", str(tmp_path), "--results", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert main(["--runs", str(tmp_path / "none"), "--results", str(tmp_path / "r")]) == 2
