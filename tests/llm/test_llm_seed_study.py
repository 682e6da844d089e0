"""The seed study trains real tiny runs side by side, records each at once, and aggregates."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from studies.llm.run_records import held_out_curve, training_cpu_ends
from studies.llm.seed_study import (
    Method,
    eval_only_accuracy,
    main,
    markdown,
    mean_and_error,
    sampling_costs,
    sampling_markdown,
    share_untrained,
)

REPO = Path(__file__).resolve().parents[2]


def test_mean_and_standard_error_over_seeds():
    summary = mean_and_error([0.2, 0.4, 0.9])
    assert summary["mean"] == pytest.approx(0.5, abs=1e-12)
    spread = math.sqrt(((0.2 - 0.5) ** 2 + (0.4 - 0.5) ** 2 + (0.9 - 0.5) ** 2) / 2)
    assert summary["standard_error"] == pytest.approx(spread / math.sqrt(3), abs=1e-12)


def test_a_study_of_two_methods_and_two_seeds(tmp_path):
    smoke = (REPO / "configs" / "smoke.toml").read_text()
    teamtr = tmp_path / "teamtr.toml"
    teamtr.write_text(smoke.replace("stages = 2", "stages = 1"))
    shared = tmp_path / "shared.toml"
    shared.write_text(f'extends = "{teamtr.name}"\n[team]\nshared_adapter = true\n')
    results, runs, figure = tmp_path / "study", tmp_path / "runs", tmp_path / "study.png"
    arguments = [
        "--method", f"teamtr={teamtr}", "--method", f"shared={shared}", "--seeds", "0", "1",
        "--results", str(results), "--runs", str(runs), "--plot", str(figure), "--jobs", "2",
    ]  # fmt: skip
    assert main(arguments) == 0
    for name in ("teamtr-s0", "teamtr-s1", "shared-s0", "shared-s1"):
        record = json.loads((results / f"{name}.json").read_text())
        assert record["stages_trained"] == 1
        assert record["seed"] == int(name[-1])
        config = json.loads((runs / name / "config.json").read_text())
        assert config["run"]["seed"] == config["sampler"]["seed"] == int(name[-1])
    # One untrained evaluation serves both: a shared adapter starts as the same team.
    methods = [Method("teamtr", teamtr), Method("shared", shared)]
    assert share_untrained(methods) == {"teamtr": ["teamtr", "shared"]}
    assert (results / "untrained_shared.json").read_text() == (
        results / "untrained_teamtr.json"
    ).read_text()
    shared_run = json.loads((results / "shared-s0.json").read_text())
    assert len(shared_run["stages"][0]["updates"]) == 1  # one adapter: one update a stage
    summary = json.loads((tmp_path / "study.json").read_text())["methods"]
    accuracies = [
        json.loads((results / f"teamtr-s{s}.json").read_text())["trained"]["accuracy"]
        for s in (0, 1)
    ]
    assert summary["teamtr"]["trained_accuracy"]["mean"] == pytest.approx(
        sum(accuracies) / 2, abs=1e-12
    )
    assert summary["teamtr"]["agent_updates"]["mean"] == 2.0  # smoke: 2 agents, 1 stage
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = markdown(json.loads((tmp_path / "study.json").read_text()))
    assert table.splitlines()[2].startswith("| teamtr | ") and table.count("\n") == 3
    # What sampling cost and found, read from the runs' own stage records.
    logged = json.loads((runs / "teamtr-s0" / "metrics.jsonl").read_text().splitlines()[0])
    costs = sampling_costs(json.loads((results / "teamtr-s0.json").read_text()))
    signal = [groups > 0 for groups in logged["batch_signal_groups"]]
    assert costs["stage_start_signal"] == float(signal[0])
    assert costs["batch_signal"] == pytest.approx(sum(signal) / len(signal), abs=1e-12)
    assert costs["groups_per_batch"] == logged["groups_drawn"] / len(signal)
    assert costs["tokens_per_stage"] == logged["generated_tokens"]
    assert costs["cpu_seconds_per_stage"] == logged["cpu_seconds"] > 0
    assert summary["shared"]["sampling"]["tokens_per_stage"]["seeds"] == 2.0
    rows = sampling_markdown(json.loads((tmp_path / "study.json").read_text())).splitlines()
    assert [row.split(" | ")[0] for row in rows[2:]] == ["| teamtr", "| shared"]
    # Running it again finds everything done and trains nothing.
    before = {p: p.stat().st_mtime_ns for p in results.glob("*-s*.json")}
    assert main(arguments) == 0
    assert {p: p.stat().st_mtime_ns for p in results.glob("*-s*.json")} == before
    # A batch naming one method, run into the same folder, keeps the other's runs in the
    # aggregate (named methods first).
    assert main(arguments[2:]) == 0
    again = json.loads((tmp_path / "study.json").read_text())["methods"]
    assert list(again) == ["shared", "teamtr"]
    assert again["teamtr"] == summary["teamtr"]


@pytest.fixture(scope="module")
def curve_and_quiet(tmp_path_factory) -> Path:
    """One study of two methods on seed 0: ``curve``, the smoke config (2 stages, evaluated
    after each), and ``quiet``, one stage evaluated only afterwards (``eval_every = 0``, as
    the step-size map's runs, which ``studies.llm.checkpoint_curves`` evaluates later). Both
    start as the same team, so one untrained evaluation serves both; its folder."""
    folder = tmp_path_factory.mktemp("seed_study")
    smoke = (REPO / "configs" / "smoke.toml").read_text()
    assert "stages = 2" in smoke and "eval_every = 1" in smoke
    (folder / "curve.toml").write_text(smoke)
    (folder / "quiet.toml").write_text(
        smoke.replace("stages = 2", "stages = 1").replace("eval_every = 1", "eval_every = 0")
    )
    arguments = [
        "--method", f"curve={folder / 'curve.toml'}", "--method", f"quiet={folder / 'quiet.toml'}",
        "--seeds", "0", "--results", str(folder / "study"), "--runs", str(folder / "runs"),
        "--plot", str(folder / "study.png"), "--jobs", "2",
    ]  # fmt: skip
    assert main(arguments) == 0
    return folder


def test_evaluations_during_training_are_kept_and_drawn_as_a_curve(curve_and_quiet):
    results, runs, figure = (curve_and_quiet / name for name in ("study", "runs", "study.png"))
    record = json.loads((results / "curve-s0.json").read_text())
    logged = [json.loads(line) for line in (runs / "curve-s0" / "metrics.jsonl").open()]
    assert held_out_curve(record) == [
        (1, logged[0]["eval"]["accuracy"]),
        (2, logged[1]["eval"]["accuracy"]),
    ]
    assert record["stages"][1]["eval"]["n"] == logged[1]["eval"]["n"]
    # The curve's x axis: training CPU, the stages' own CPU seconds summed.
    first, second = (stage["cpu_seconds"] for stage in logged)
    assert training_cpu_ends(record) == pytest.approx(
        [first / 60, (first + second) / 60], rel=1e-12
    )
    assert training_cpu_ends({"stages": [{"cpu_seconds": None}]}) is None
    # Three panels (training reward, the held-out curve, the bars): a wider PNG (IHDR width).
    width = int.from_bytes(figure.read_bytes()[16:20], "big")
    assert width > 1600


def test_a_method_without_its_config_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--method", f"x={tmp_path / 'none.toml'}", "--results", "r", "--runs", "u"])
    assert "no such config file" in capsys.readouterr().err


def test_eval_only_accuracy_weighs_held_out_templates_by_their_questions():
    evaluation = {
        "template/relay.repeat/accuracy": 0.5,
        "template/relay.repeat/n": 10.0,
        "template/d1.take_away/accuracy": 1.0,
        "template/d1.take_away/n": 30.0,
        "template/d1.what_is/accuracy": 0.0,  # trained on: not counted
        "template/d1.what_is/n": 50.0,
    }
    assert eval_only_accuracy(evaluation) == pytest.approx((5 + 30) / 40, abs=1e-12)
    assert (
        eval_only_accuracy({"template/d1.what_is/accuracy": 1.0, "template/d1.what_is/n": 3})
        is None
    )


def test_a_regression_is_a_drop_of_more_than_two_standard_errors():
    from studies.llm.seed_study import regressions

    def evaluation(accuracy: float, n: int = 100) -> dict:
        return {"accuracy": accuracy, "n": n}

    run = {
        "untrained": evaluation(0.10),
        "stages": [
            {"stage": 0, "eval": evaluation(0.50)},
            {"stage": 1},  # a stage without an evaluation is skipped
            {"stage": 2, "eval": evaluation(0.30)},  # -20 points, 2 s.e. = 13.6: a regression
            {"stage": 3, "eval": evaluation(0.25)},  # -5 points, 2 s.e. = 12.6: noise
            {"stage": 4, "eval": evaluation(0.90)},
        ],
    }
    assert regressions(run) == 1
    # The same drops on 10 questions are within the noise of so few.
    small = {
        "untrained": evaluation(0.10, 10),
        "stages": [
            {"stage": s["stage"], "eval": {**s["eval"], "n": 10}}
            for s in run["stages"]
            if "eval" in s
        ],
    }
    assert regressions(small) == 0


def test_runs_evaluated_only_afterwards_are_recorded_without_a_trained_accuracy(curve_and_quiet):
    """``eval_every = 0`` (the step-size map: every checkpoint is evaluated afterwards by
    ``studies.llm.checkpoint_curves``): the study records the run and aggregates what it has."""
    results = curve_and_quiet / "study"
    record = json.loads((results / "quiet-s0.json").read_text())
    assert record["trained"] is None and record["stages_trained"] == 1
    entry = json.loads((curve_and_quiet / "study.json").read_text())["methods"]["quiet"]
    assert "trained_accuracy" not in entry and entry["per_seed"][0]["trained"] is None
    assert entry["stages"]["mean"] == 1.0
