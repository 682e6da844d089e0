"""studies.llm.certificate.measured_table: the measured certificate's table, from real run records.

A tiny-model run with held-out groups writes the metrics.jsonl the table reads; every column is
checked against the records it summarises."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from studies.llm.certificate.measured_table import checkpoint_rows, main, read_stages, summary
from teamtr.measured import pairs_to_certify

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def measured_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    command = [sys.executable, "-m", "teamtr", "train", "--config", "smoke.toml", "--name", "m"]
    command += ["--output-dir", str(out), "--no-progress", "--set", "stage.certificate_groups=6"]
    command += ["--set", "stage.stages=3", "--set", "run.eval_every=2"]
    subprocess.run(command, check=True, cwd=ROOT, capture_output=True, timeout=600)
    return out / "m"


def test_every_column_is_what_the_records_say(measured_run: Path) -> None:
    stages = read_stages(measured_run)
    row = summary("smoke", stages, untrained=0.0)
    updates = [u for s in stages for u in s["updates"]]
    measured = [u["measured"] for u in updates if u["measured"]]
    assert row["updates"] == len(updates) and row["measured"] == len(measured) > 0
    assert row["pairs_per_update"] == 6
    assert row["certified_measured"] == sum(m["bound"] > 0 for m in measured)
    assert row["mean_bound"] == pytest.approx(statistics.fmean(m["bound"] for m in measured))
    assert row["mean_sd"] == pytest.approx(statistics.fmean(m["sd"] for m in measured))
    gains = [m for m in measured if m["mean"] > 0]
    expected = (
        pairs_to_certify(
            statistics.fmean(m["mean"] for m in gains),
            statistics.fmean(m["sd"] for m in gains),
            1.0,
        )
        if gains
        else None
    )
    assert row["pairs_to_certify_typical_gain"] == expected
    assert row["held_out_tokens"] == sum(s["held_out_tokens"] for s in stages) > 0


def test_a_checkpoint_sums_the_stages_since_the_evaluation_before_it() -> None:
    def stage(index: int, mean: float, bound: float, accuracy: float | None = None) -> dict:
        record = {"stage": index, "measured": {"mean": mean, "bound": bound, "level": 0.95}}
        return record | ({"eval": {"accuracy": accuracy}} if accuracy is not None else {})

    stages = [stage(0, 0.1, -0.2), stage(1, 0.3, 0.05, 0.5), stage(2, 0.2, -0.1, 0.4)]
    first, second = checkpoint_rows(stages, untrained=0.25)
    assert first["stages"] == [1, 2] and first["held_out_change"] == pytest.approx(0.25)
    assert first["measured_mean"] == pytest.approx(0.4)
    assert first["measured_bound"] == pytest.approx(-0.15) and first["level"] == pytest.approx(0.9)
    assert second["stages"] == [3] and second["held_out_change"] == pytest.approx(-0.1)
    assert checkpoint_rows(stages, untrained=None)[0]["held_out_change"] is None


def test_a_run_that_measured_nothing_is_refused_in_one_line(tmp_path, capsys) -> None:
    run = tmp_path / "plain"
    run.mkdir()
    record = {"stage": 0, "updates": [{"measured": None, "certificate": -1.0}]}
    (run / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    with pytest.raises(SystemExit) as stopped:
        main(["--run", f"plain={run}"])
    assert stopped.value.code == 2
    assert "no update measured" in capsys.readouterr().err
