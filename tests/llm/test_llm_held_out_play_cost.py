"""``bench/held_out_play_cost.py --quick``: the plays it times are the sizes asked for, and its
line is the one through their medians."""

import json

import pytest
from llm_test_support import load_bench


def test_the_bench_reports_each_size_and_the_line_through_their_medians(tmp_path):
    bench = load_bench("held_out_play_cost")
    out = tmp_path / "cost.json"
    argv = ["--quick", "--dtypes", "float32", "--rows", "2", "5", "--repeats", "2"]
    assert bench.main([*argv, "--json", str(out)]) == 0
    report = json.loads(out.read_text())["float32"]
    assert set(report["plays"]) == {"2", "5"} and all(len(p) == 2 for p in report["plays"].values())
    for size, plays in report["plays"].items():
        assert report["median"][size] == pytest.approx(sum(plays) / 2, rel=1e-12)
        assert min(plays) > 0
    # Two sizes: the line passes through both medians.
    for size in (2, 5):
        fitted = report["fixed_seconds"] + report["per_dialogue_seconds"] * size
        assert fitted == pytest.approx(report["median"][str(size)], rel=1e-9, abs=1e-9)
    with pytest.raises(SystemExit):
        bench.main(["--quick", "--rows", "4", "4"])
