"""``studies.llm.environments.held_out_at_stage``: the held-out table of docs/environments.md, from run
directories' records, with runs that have not reached the stage left out of the mean."""

from __future__ import annotations

import json
import math

from studies.llm.environments.held_out_at_stage import main, method_rows


def write_run(directory, accuracies):
    directory.mkdir()
    lines = [
        {"stage": s, "cpu_seconds": 10.0, **({"eval": {"accuracy": a}} if a is not None else {})}
        for s, a in enumerate(accuracies)
    ]
    (directory / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return directory


def test_the_mean_and_standard_error_over_the_runs_that_reached_the_stage(tmp_path, capsys):
    untrained = tmp_path / "untrained.json"
    untrained.write_text(json.dumps({"accuracy": 0.1}))
    runs = [
        write_run(tmp_path / "a", [None, 0.2, None, 0.5]),
        write_run(tmp_path / "b", [None, 0.3, None, 0.7]),
        write_run(tmp_path / "c", [None, 0.4]),
    ]
    row = method_rows(untrained, runs, 4)
    assert [r["accuracy"] for r in row["runs"]] == [0.5, 0.7, None]
    assert row["mean"] == 0.6 and math.isclose(row["standard_error"], 0.1)
    assert row["runs"][0]["cpu_seconds"] == 40.0 and row["runs"][2]["cpu_seconds"] is None
    assert row["runs"][1]["curve"] == [(2, 0.3), (4, 0.7)]
    spec = f"m={untrained}:{','.join(map(str, runs))}"
    assert main(["--stage", "4", "--method", spec, "--plot", str(tmp_path / "f.png")]) == 0
    out = capsys.readouterr().out
    assert "| m | 10% | 50%, 70%, not yet | 60.0% ± 10.0 | 40, 40 |" in out
    assert (tmp_path / "f.png").stat().st_size > 0
