"""HAPPO's effective sample size per update position, read from stage records written here."""

from __future__ import annotations

import json

import pytest

from studies.llm.weight_collapse import collapse, main


def stage(*sizes: float) -> dict:
    return {"updates": [{"effective_sample_size": size, "kept": True} for size in sizes]}


def test_each_position_is_averaged_over_the_stages_with_its_standard_error():
    rows = collapse([stage(1.0, 0.5, 0.25), stage(1.0, 0.75, 0.125)])
    assert [row["mean"] for row in rows] == pytest.approx([1.0, 0.625, 0.1875], abs=1e-12)
    # Two stages: s.e. = |a - b| / 2 (sample sd |a - b| / sqrt 2, over sqrt 2).
    assert [row["standard_error"] for row in rows] == pytest.approx([0.0, 0.125, 0.0625], abs=1e-12)
    assert [row["smallest"] for row in rows] == [1.0, 0.5, 0.125]
    assert [row["stages"] for row in rows] == [2.0, 2.0, 2.0]
    # One stage: no spread to speak of.
    assert collapse([stage(1.0, 0.5)])[1]["standard_error"] is None


def test_records_without_the_size_are_refused():
    with pytest.raises(ValueError, match="stage 1, update 0"):
        collapse([stage(1.0), {"updates": [{"kept": True}]}])
    with pytest.raises(ValueError, match="no stage"):
        collapse([{"updates": []}])


def test_the_command_reads_metrics_files_and_exits_2_on_bad_ones(tmp_path, capsys):
    metrics = tmp_path / "happo-d02-s0.jsonl"
    metrics.write_text("\n".join(json.dumps(s) for s in (stage(1.0, 0.5), stage(1.0, 0.25))) + "\n")
    out = tmp_path / "collapse.json"
    assert main(["--metrics", str(metrics), "--json", str(out), "--markdown"]) == 0
    assert "| happo-d02-s0 | 2 | 1.00 ± 0.00 (min 1.00) | 0.38 ± 0.12 (min 0.25) |" in (
        capsys.readouterr().out
    )
    assert json.loads(out.read_text())["by_position"][1]["mean"] == pytest.approx(0.375)
    assert main(["--metrics", str(tmp_path / "missing.jsonl")]) == 2
    (tmp_path / "old.jsonl").write_text(json.dumps({"updates": [{"kept": True}]}) + "\n")
    assert main(["--metrics", str(tmp_path / "old.jsonl")]) == 2
