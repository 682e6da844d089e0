"""``python -m studies.certified_share`` end to end on a few draws, checked against a
recomputation of the same draws and against the exact mean of its pairs."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from studies.certified_share import METHODS, TRUE_MEAN, draws, main
from teamtr.measured import lower_bound

ROOT = Path(__file__).resolve().parents[2]


def test_the_pairs_have_the_stated_mean() -> None:
    assert TRUE_MEAN == pytest.approx(0.10, abs=1e-12)
    pairs = draws(500, 40, 3)
    # 20,000 pairs of sd 0.436: the mean within 4 standard errors (0.0123).
    assert abs(pairs.mean() - TRUE_MEAN) <= 4 * 0.436 / np.sqrt(pairs.size)


def test_the_study_writes_what_it_recomputes(tmp_path) -> None:
    out = tmp_path / "share.json"
    argv = ["--sizes", "16", "40", "--repeats", "30", "--seed", "5", "--json", str(out)]
    assert main([*argv, "--sequential", "8", "24"]) == 0
    document = json.loads(out.read_text())
    [sequential] = document["sequential"]
    assert (sequential["batch"], sequential["cap"]) == (8, 24)
    assert sum(sequential["stops"].values()) == 30 and 8 <= sequential["mean_pairs"] <= 24
    # A run certifies exactly when it stopped for that reason (the anytime bound cleared 0).
    assert sequential["certified"]["share"] == sequential["stops"]["certified"] / 30
    assert document["true_mean"] == TRUE_MEAN and document["repeats"] == 30
    for n in (16, 40):
        pairs = draws(n, 30, 5)
        for method in METHODS:
            bounds = np.array([lower_bound(d, 1.0, 0.05, method) for d in pairs])
            cells = document["rows"][str(n)][method]
            assert cells["certified"]["share"] == float(np.mean(bounds > 0))
            assert cells["violation"]["share"] == float(np.mean(bounds > TRUE_MEAN))
            assert cells["mean_bound"] == pytest.approx(float(bounds.mean()), abs=1e-12)


def test_bad_options_are_one_line_and_exit_2(capsys) -> None:
    assert main(["--sequential", "16", "8"]) == 2
    assert (
        capsys.readouterr().err
        == "certified_share: --sequential: need 1 <= BATCH <= CAP, got 16 8\n"
    )
    command = [sys.executable, "-m", "studies.certified_share", "--repeats", "0"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
    assert result.returncode == 2
    assert result.stderr.strip() == "certified_share: --repeats must be >= 1, got 0"


def test_futility_rules_run_on_the_same_draws_of_the_distribution_asked_for(tmp_path) -> None:
    """Each --futility rule measures the same runs (so their pairs compare draw for draw), of
    the --probabilities given: on a zero-mean update the trend draws fewer pairs on average than
    the anytime upper bound's rule, and certifies no more."""
    out = tmp_path / "share.json"
    argv = ["--sizes", "16", "--repeats", "24", "--probabilities", "0.04", "0.92", "0.04"]
    rules = ["--futility", "upper_bound", "--futility", "trend"]
    assert main([*argv, "--sequential", "16", "96", *rules, "--json", str(out)]) == 0
    document = json.loads(out.read_text())
    assert document["probabilities"] == [0.04, 0.92, 0.04] and document["true_mean"] == 0.0
    upper, trend = document["sequential"]
    assert (upper["futility"], trend["futility"]) == ("upper_bound", "trend")
    assert trend["mean_pairs"] < upper["mean_pairs"]
    assert trend["certified"]["share"] <= upper["certified"]["share"]
    assert main([*argv, "--probabilities", "0.5", "0.5", "0.5"]) == 2
