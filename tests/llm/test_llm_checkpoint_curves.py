"""Curves from checkpoints (``studies.llm.checkpoint_curves``): every stage checkpoint of a run,
evaluated after the fact, gives what the run's own evaluation gave at that stage."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from llm.interface.cli import main as teamtr_main
from studies.llm.checkpoint_curves import main
from studies.llm.run_records import held_out_drops as regressions

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
    # Training CPU: the stages' own CPU seconds summed, the evaluations between them left out.
    cpu = [point["training_cpu_minutes"] for point in curve["curve"]]
    assert all(s["cpu_seconds"] > 0 for s in logged)
    assert cpu == pytest.approx(
        [logged[0]["cpu_seconds"] / 60, (logged[0]["cpu_seconds"] + logged[1]["cpu_seconds"]) / 60],
        rel=1e-12,
    )
    # The summary reads what the stages cost from the run directory.
    summary_file = tmp_path / "summary.json"
    arguments = ["--summarise-only", "--results", str(results), "--runs", str(runs),
                 "--metric", "accuracy", "--json", str(summary_file)]  # fmt: skip
    assert main(arguments) == 0
    costs = json.loads(summary_file.read_text())["methods"]["r"]["costs"]
    assert costs["stages"] == 2
    assert costs["generated_tokens_per_stage"] == sum(s["generated_tokens"] for s in logged) / 2
    assert costs["agent_updates"] == sum(len(s["updates"]) for s in logged)
    # Rerunning resumes: a run whose file exists is not evaluated again.
    before = (results / "r.json").stat().st_mtime_ns
    assert main(["--runs", str(runs), "--results", str(results), "--no-progress"]) == 0
    assert (results / "r.json").stat().st_mtime_ns == before


def test_a_folder_without_runs_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["--runs", str(tmp_path), "--results", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert main(["--runs", str(tmp_path / "none"), "--results", str(tmp_path / "r")]) == 2


def test_a_seed_studys_file_of_the_runs_name_is_refused_not_taken_for_its_curve(tmp_path, capsys):
    run = tmp_path / "runs" / "teamtr-s0"
    run.mkdir(parents=True)
    (run / "config.json").write_text("{}")
    results = tmp_path / "results"
    results.mkdir()
    (results / "teamtr-s0.json").write_text(json.dumps({"run": "teamtr-s0", "trained": 0.5}))
    assert main(["--runs", str(tmp_path / "runs"), "--results", str(results)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "teamtr-s0.json is not a curve file" in err


def point(credit: float, error: float, accuracy: float = 0.0) -> dict:
    return {"turn_credit": credit, "turn_credit_standard_error": error, "accuracy": accuracy,
            "n": 45.0}  # fmt: skip


def test_a_regression_is_a_drop_beyond_twice_the_error_of_the_difference():
    # 0.30 -> 0.20: the difference's error is hypot(0.03, 0.04) = 0.05, twice that is 0.10.
    assert regressions([point(0.30, 0.03), point(0.20, 0.04)], "turn_credit") == 0
    assert regressions([point(0.30, 0.03), point(0.19, 0.04)], "turn_credit") == 1
    assert regressions([point(0.1, 0.01), point(0.5, 0.01), point(0.2, 0.01)], "turn_credit") == 1
    # Accuracy uses the binomial error of each evaluation: sqrt(p (1 - p) / n).
    drop = [point(0, 0, accuracy=0.5), point(0, 0, accuracy=0.2)]
    assert regressions(drop, "accuracy") == int(0.3 > 2 * math.hypot(0.5 / 45**0.5, 0.4 / 45**0.5))


def test_the_summary_groups_runs_by_method_and_draws_every_curve(tmp_path, capsys):
    results = tmp_path / "curves"
    results.mkdir()
    finals = {"teamtr-s0": 0.4, "teamtr-s1": 0.6, "stale-s0": 0.2, "stale-s1": 0.1}
    for run, final in finals.items():
        curve = [
            {"stages_trained": 1, "budget_minutes": 2.0, "metrics": point(0.3, 0.01)},
            {"stages_trained": 2, "budget_minutes": 4.0, "metrics": point(final, 0.01, final / 2)},
        ]
        (results / f"{run}.json").write_text(json.dumps({"run": run, "curve": curve}))
    untrained = tmp_path / "untrained.json"
    untrained.write_text(json.dumps(point(0.0, 0.0)))
    figure, summary_file = tmp_path / "curves.png", tmp_path / "summary.json"
    arguments = ["--summarise-only", "--results", str(results), "--untrained", str(untrained),
                 "--json", str(summary_file), "--plot", str(figure), "--markdown"]  # fmt: skip
    assert main(arguments) == 0
    summary = json.loads(summary_file.read_text())
    assert set(summary["methods"]) == {"teamtr", "stale"}
    teamtr, stale = summary["methods"]["teamtr"], summary["methods"]["stale"]
    assert teamtr["final"] == pytest.approx(0.5) and teamtr[
        "final_standard_error"
    ] == pytest.approx(0.1)
    assert stale["final_accuracy"] == pytest.approx(0.075)
    assert stale["regressions"] == [1, 1]  # 0.3 -> 0.2 and 0.3 -> 0.1, errors 0.01
    assert teamtr["regressions"] == [0, 0]
    assert "| teamtr | 0.500 ± 0.100 |" in capsys.readouterr().out
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main([*arguments[:-1], "--metric", "nothing"]) == 2
    # Time to a level: the first checkpoint at or above it, on the budget clock here (these
    # curves have no training CPU minutes); the mean only where every run got there.
    assert main([*arguments, "--reach", "0.4"]) == 0
    summary = json.loads(summary_file.read_text())
    assert summary["clock"] == "budget_minutes"
    assert summary["methods"]["teamtr"]["reach"]["minutes"] == [4.0, 4.0]
    assert summary["methods"]["teamtr"]["reach"]["mean"]["mean"] == 4.0
    assert summary["methods"]["stale"]["reach"] == {
        "level": 0.4,
        "minutes": [None, None],
        "mean": None,
    }
    assert "| 4.0, 4.0 |" in capsys.readouterr().out
    # At equal minutes: linear between the checkpoints either side, from the untrained team at
    # 0 (teamtr-s0 at 3 minutes: halfway from 0.3 to 0.4; at 1 minute: halfway from 0 to 0.3).
    assert main([*arguments, "--at", "3"]) == 0
    summary = json.loads(summary_file.read_text())
    at = summary["methods"]["teamtr"]["at"]
    assert at["minutes"] == 3.0 and at["values"] == pytest.approx([0.35, 0.45], abs=1e-12)
    assert at["mean"] == pytest.approx(0.4) and at["standard_error"] == pytest.approx(0.05)
    assert "| 0.400 ± 0.050 | 0.35, 0.45 |" in capsys.readouterr().out
    assert main([*arguments, "--at", "1"]) == 0
    summary = json.loads(summary_file.read_text())
    assert summary["methods"]["stale"]["at"]["values"] == pytest.approx([0.15, 0.15], abs=1e-12)
    # Curves in another folder join the summary (a run made under another name or config).
    other = tmp_path / "other"
    other.mkdir()
    curve = [{"stages_trained": 1, "budget_minutes": 2.0, "metrics": point(0.8, 0.01)}]
    (other / "default-s0.json").write_text(json.dumps({"run": "default-s0", "curve": curve}))
    assert main([*arguments, "--more-results", str(other)]) == 0
    summary = json.loads(summary_file.read_text())
    assert set(summary["methods"]) == {"teamtr", "stale", "default"}
    assert summary["methods"]["default"]["final"] == 0.8
