"""``studies.llm.reasoning.comparison``: the team / single agent / TRL table of
docs/reasoning_gym.md, read from the files the study's commands write."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from studies.llm.reasoning.comparison import (
    Arm,
    main,
    markdown,
    study_table,
    trained_runs,
    untrained_accuracy,
)
from studies.llm.run_records import mean_and_error

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results" / "reasoning_gym"


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


def documented_rows(heading: str) -> list[list[str]]:
    """The cells of each dataset row of docs/reasoning_gym.md's section ``heading``."""
    page = (ROOT / "docs" / "reasoning_gym.md").read_text()
    section = page.split(f"### {heading}\n")[1].split("###")[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [[cell.strip() for cell in row.split("|")[1:-1]] for row in rows]


def check_row(cells: list[str], runs: list[dict], untrained: float, cpu_cell: int) -> None:
    """A documented row against its records: the untrained accuracy (cell 2), the per-seed
    accuracies, mean ± standard error and gain (cells 3-5) of the seeds 0-2 that
    ``trained_runs`` read, and each run's CPU-seconds and stages or steps (cells ``cpu_cell``
    and the next)."""
    assert cells[2] == f"{untrained:.0f}%"
    assert [r["seed"] for r in runs] == [0, 1, 2]
    accuracies = [100 * r["accuracy"] for r in runs]
    assert cells[3] == ", ".join(f"{a:.0f}%" for a in accuracies)
    summary = mean_and_error(accuracies)
    assert cells[4] == f"{summary['mean']:.1f}% ± {summary['standard_error']:.1f}"
    assert cells[5] == f"{summary['mean'] - untrained:+.1f}"
    assert cells[cpu_cell] == ", ".join(f"{r['cpu_seconds']:.0f}" for r in runs)
    assert cells[cpu_cell + 1] == ", ".join(str(r["steps"]) for r in runs)


def test_the_without_partial_credit_table_is_what_its_records_say():
    """docs/reasoning_gym.md's "Without partial credit" rows: the untrained accuracy, each
    seed's held-out accuracy, mean ± standard error, the gain, CPU-seconds and stages, from the
    committed evaluations and run records of ``<dataset>-<arm>-nopartial-sS``."""
    rows = documented_rows("Without partial credit")
    arms = {"team of two": "team", "teamtr single agent": "single"}
    assert len(rows) >= 4
    for cells in rows:
        dataset, arm = cells[0].strip("`"), arms[cells[1]]
        untrained = 100 * untrained_accuracy(RESULTS, dataset, arm)
        runs = trained_runs(RESULTS, dataset, arm, "-nopartial")
        check_row(cells, runs, untrained, cpu_cell=7)  # cell 6: the partial-credit mean


def test_the_table_beside_trl_without_partial_credit_is_what_its_records_say():
    """docs/reasoning_gym.md's "Without partial credit, beside TRL" rows (float32 on an Intel
    Xeon with AMX, ``<dataset>-<arm>-nopartial-f32amx-sS``): the untrained accuracy in the
    arm's format (scored again on that machine), each seed's held-out accuracy, mean ± standard
    error, the gain, and each run's training CPU-seconds and stages or steps, from the
    committed evaluations, TRL reports and run records."""
    rows = documented_rows("Without partial credit, beside TRL")
    arms = {
        "team of two": Arm("team", "-nopartial-f32amx", "", "f32amx-{dataset}"),
        "TRL GRPOTrainer": Arm("trl", "-nopartial-f32amx", "", "f32amx-{dataset}_single"),
    }
    assert len(rows) >= 2
    for cells in rows:
        dataset, arm = cells[0].strip("`"), arms[cells[1]]
        untrained = 100 * untrained_accuracy(RESULTS, dataset, arm)
        runs = trained_runs(RESULTS, dataset, arm.arm, arm.variant)
        check_row(cells, runs, untrained, cpu_cell=6)


def test_the_table_with_a_tool_is_the_study_of_its_records():
    """docs/reasoning_gym.md's "A team with a tool" rows are, cell for cell, the rows the
    study prints from the committed evaluations, TRL reports and run records of its three arms
    (``--study tool``: the team and the single agent with the calculator, TRL without)."""
    documented = documented_rows("A team with a tool")
    datasets = list(dict.fromkeys(cells[0].strip("`") for cells in documented))
    printed = markdown(study_table(RESULTS, datasets, "tool")).splitlines()[2:]
    assert len(documented) == 3 * len(datasets) >= 6
    assert documented == [[c.strip() for c in row.split("|")[1:-1]] for row in printed]


def test_the_tool_study_reads_each_arm_under_its_own_tag(results, tmp_path, capsys):
    """``--study tool``: the team's runs ``<dataset>-tool-f32amx-sS``, the single agent's
    ``-single-tool-f32amx-sS``, TRL's ``-trl-f32amx-sS``, each arm its own untrained format;
    the main study's runs are not read."""
    write(results / "untrained" / "f32amx-sum_tool.json", {"accuracy": 0.1})
    write(results / "untrained" / "f32amx-sum_tool_single.json", {"accuracy": 0.04})
    write(results / "untrained" / "f32amx-sum_single.json", {"accuracy": 0.26})
    write_teamtr_run(results, "sum-tool-f32amx-s0", 0.9, [250.0, 240.0])
    write_teamtr_run(results, "sum-single-tool-f32amx-s1", 0.8, [480.0])
    write(
        results / "trl" / "sum-trl-f32amx-s2.json",
        {"trained": {"accuracy": 0.3}, "cpu_seconds": 500.0, "steps": 9},
    )
    assert main(["--results", str(results), "--datasets", "sum", "--study", "tool"]) == 0
    out = capsys.readouterr().out
    assert (
        "| `sum` | team of two, calculator | '7': 60% | 10% | 90% | 90.0% | +80.0 | 490 | 2 |"
        in out
    )
    assert (
        "| `sum` | teamtr single agent, calculator | '7': 60% | 4% | 80% | 80.0% | +76.0 | 480 | 1 |"
        in out
    )
    assert (
        "| `sum` | TRL GRPOTrainer, no tool | '7': 60% | 26% | 30% | 30.0% | +4.0 | 500 | 9 |"
        in out
    )
    (results / "untrained" / "f32amx-sum_tool.json").unlink()
    with pytest.raises(SystemExit) as stop:
        main(["--results", str(results), "--datasets", "sum", "--study", "tool"])
    assert stop.value.code == 2 and "f32amx-sum_tool.json" in capsys.readouterr().err
