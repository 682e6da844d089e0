"""``bench/held_out_profile.py --quick``: a real tiny-model run measured by held-out pairs, its
held-out plays told apart from its training draws, and its pairs those of its records."""

import json

import pytest
from llm_test_support import load_bench


def test_the_held_out_plays_are_counted_apart_from_the_training_draws(tmp_path):
    bench = load_bench("held_out_profile")
    out = tmp_path / "profile.json"
    runs = tmp_path / "runs"
    train = ["--name", "p", "--output-dir", str(runs), "--set", "stage.certificate_batch=4"]
    assert bench.main(["--quick", "--json", str(out), "--", *train]) == 0
    report = json.loads(out.read_text())
    # The smoke config's two turns, played by both the training draws and the held-out groups.
    assert set(report["held_out_turns"]) == set(report["training_turns"]) == {"1", "2"}
    held_out = report["held_out_turns"].values()
    assert report["held_out_plays"] == sum(p["plays"] for p in held_out) > 0
    assert report["held_out_cpu_seconds"] == pytest.approx(sum(p["cpu_seconds"] for p in held_out))
    training = sum(p["cpu_seconds"] for p in report["training_turns"].values())
    assert 0 < report["held_out_cpu_seconds"] + training <= report["total_cpu_seconds"]
    lines = (runs / "p" / "metrics.jsonl").read_text().splitlines()
    measured = [u["measured"]["n"] for line in lines for u in json.loads(line)["updates"]]
    assert report["pairs"] == measured and min(measured) >= 4
    with pytest.raises(SystemExit):
        bench.main(["--", "--config", "smoke.toml"])  # no --name or --output-dir to read
