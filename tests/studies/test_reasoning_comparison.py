"""``studies.llm.reasoning.comparison``: the team / single agent / TRL table of
docs/reasoning_gym.md, read from the files the study's commands write."""

from __future__ import annotations

import json
import math

import pytest

from studies.llm.reasoning.comparison import main, study_table, untrained_accuracy


def write(path, record):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))


def write_teamtr_run(results, tag, accuracy, stage_cpu):
    write(results / "trained" / f"{tag}.json", {"accuracy": accuracy, "n": 50})
    lines = [{"stage": s, "cpu_seconds": c} for s, c in enumerate(stage_cpu)]
    records = results / "run_records" / tag / "metrics.jsonl"
    records.parent.mkdir(parents=True)
    # a line without cpu_seconds (e.g. an evaluation's) is not a stage
    records.write_text("".join(json.dumps(x) + "\n" for x in [*lines, {"eval": {}}]))


@pytest.fixture
def results(tmp_path):
    write(tmp_path / "untrained" / "sum.json", {"accuracy": 0.2})
    write(tmp_path / "untrained" / "sum_single.json", {"accuracy": 0.3})
    references = ["7", "3", "7", "7", "5"]
    (tmp_path / "untrained" / "sum.transcripts.jsonl").write_text(
        "".join(json.dumps({"reference_answer": r}) + "\n" for r in references)
    )
    write_teamtr_run(tmp_path, "sum-team-s0", 0.5, [100.0, 200.0])
    write_teamtr_run(tmp_path, "sum-team-s1", 0.7, [150.0, 150.0, 100.0])
    write_teamtr_run(tmp_path, "sum-single-s2", 0.4, [60.0])
    write(
        tmp_path / "trl" / "sum-trl-s0.json",
        {"trained": {"accuracy": 0.36}, "untrained": None, "cpu_seconds": 480.5, "steps": 7},
    )
    return tmp_path


def test_each_arm_its_own_untrained_format_seeds_cpu_and_mean(results):
    row = study_table(results, ["sum"])["sum"]
    assert row["constant answer"] == {"answer": "7", "accuracy": 0.6}
    team, single, trl = row["team"], row["single"], row["trl"]
    assert team["untrained"] == 0.2 and single["untrained"] == trl["untrained"] == 0.3
    assert [r["seed"] for r in team["runs"]] == [0, 1]
    assert [r["cpu_seconds"] for r in team["runs"]] == [300.0, 400.0]
    assert [r["steps"] for r in team["runs"]] == [2, 3]
    assert team["trained"]["mean"] == pytest.approx(0.6, abs=1e-12)
    assert math.isclose(team["trained"]["standard_error"], 0.1)
    assert single["trained"]["standard_error"] is None  # one seed: no spread
    assert trl["runs"] == [{"seed": 0, "accuracy": 0.36, "cpu_seconds": 480.5, "steps": 7}]


def test_the_table_and_figure(results, tmp_path, capsys):
    figure = tmp_path / "study.png"
    assert main(["--results", str(results), "--datasets", "sum", "--plot", str(figure)]) == 0
    out = capsys.readouterr().out
    assert (
        "| `sum` | team of two | '7': 60% | 20% | 50%, 70% | 60.0% ± 10.0 | +40.0 | 300, 400 | 2, 3 |"
        in out
    )
    assert "| `sum` | TRL GRPOTrainer | '7': 60% | 30% | 36% | 36.0% | +6.0 | 480 | 7 |" in out
    assert figure.stat().st_size > 0


def test_a_dataset_without_its_untrained_evaluation_is_one_line(results, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--results", str(results), "--datasets", "sum", "chain"])
    assert stop.value.code == 2
    assert "no untrained evaluation" in capsys.readouterr().err


def test_the_without_partial_credit_table_is_what_its_records_say():
    """docs/reasoning_gym.md's "Without partial credit" rows: the untrained accuracy, each
    seed's held-out accuracy, mean ± standard error, the gain, CPU-seconds and stages, from the
    committed evaluations and run records of ``<dataset>-<arm>-nopartial-sS``."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    results = root / "results" / "reasoning_gym"
    page = (root / "docs" / "reasoning_gym.md").read_text()
    section = page.split("### Without partial credit")[1].split("###")[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    arms = {"team of two": "team", "teamtr single agent": "single"}
    assert len(rows) >= 4
    for row in rows:
        cells = [cell.strip() for cell in row.split("|")[1:-1]]
        dataset, arm = cells[0].strip("`"), arms[cells[1]]
        name = f"{dataset}-{arm}-nopartial-s"
        untrained = 100 * untrained_accuracy(results, dataset, arm)
        assert cells[2] == f"{untrained:.0f}%"
        accuracies = [
            100 * json.loads((results / "trained" / f"{name}{s}.json").read_text())["accuracy"]
            for s in range(3)
        ]
        assert cells[3] == ", ".join(f"{a:.0f}%" for a in accuracies)
        mean = sum(accuracies) / 3
        spread = math.sqrt(sum((a - mean) ** 2 for a in accuracies) / 2 / 3)
        assert cells[4] == f"{mean:.1f}% ± {spread:.1f}"
        assert cells[5] == f"{mean - untrained:+.1f}"
        stages = [
            [
                json.loads(line)
                for line in (results / "run_records" / f"{name}{s}" / "metrics.jsonl").open()
            ]
            for s in range(3)
        ]
        stages = [[r for r in records if "cpu_seconds" in r] for records in stages]
        assert cells[7] == ", ".join(f"{sum(r['cpu_seconds'] for r in run):.0f}" for run in stages)
        assert cells[8] == ", ".join(str(len(run)) for run in stages)


def test_the_table_beside_trl_without_partial_credit_is_what_its_records_say():
    """docs/reasoning_gym.md's "Without partial credit, beside TRL" rows (float32 on an Intel
    Xeon with AMX, ``<dataset>-<arm>-nopartial-f32amx-sS``): the untrained accuracy in the
    arm's format, each seed's held-out accuracy, mean ± standard error, the gain, and each
    run's training CPU-seconds and stages or steps, from the committed evaluations, TRL
    reports and run records."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    results = root / "results" / "reasoning_gym"
    page = (root / "docs" / "reasoning_gym.md").read_text()
    section = page.split("### Without partial credit, beside TRL")[1].split("###")[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    arms = {"team of two": "team", "TRL GRPOTrainer": "trl"}
    assert len(rows) >= 2
    for row in rows:
        cells = [cell.strip() for cell in row.split("|")[1:-1]]
        dataset, arm = cells[0].strip("`"), arms[cells[1]]
        name = f"{dataset}-{arm}-nopartial-f32amx-s"
        untrained_name = dataset if arm == "team" else f"{dataset}_single"
        untrained_path = results / "untrained" / f"f32amx-{untrained_name}.json"
        untrained = 100 * json.loads(untrained_path.read_text())["accuracy"]
        assert cells[2] == f"{untrained:.0f}%"
        if arm == "trl":
            reports = [
                json.loads((results / "trl" / f"{name}{s}.json").read_text()) for s in range(3)
            ]
            accuracies = [100 * r["trained"]["accuracy"] for r in reports]
            cpu = [r["cpu_seconds"] for r in reports]
            steps = [r["steps"] for r in reports]
        else:
            accuracies = [
                100 * json.loads((results / "trained" / f"{name}{s}.json").read_text())["accuracy"]
                for s in range(3)
            ]
            runs = [
                [
                    record
                    for line in (results / "run_records" / f"{name}{s}" / "metrics.jsonl").open()
                    if "cpu_seconds" in (record := json.loads(line))
                ]
                for s in range(3)
            ]
            cpu = [sum(r["cpu_seconds"] for r in run) for run in runs]
            steps = [len(run) for run in runs]
        assert cells[3] == ", ".join(f"{a:.0f}%" for a in accuracies)
        mean = sum(accuracies) / 3
        spread = math.sqrt(sum((a - mean) ** 2 for a in accuracies) / 2 / 3)
        assert cells[4] == f"{mean:.1f}% ± {spread:.1f}"
        assert cells[5] == f"{mean - untrained:+.1f}"
        assert cells[6] == ", ".join(f"{c:.0f}" for c in cpu)
        assert cells[7] == ", ".join(str(n) for n in steps)
