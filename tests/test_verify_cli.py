"""``teamtr verify`` through the real console entry point: schema, coverage, exit codes."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios

import numpy as np
import pytest

from proofs_check import checks, oracle, verify
from proofs_check.instances import draw_tabular_mdp
from proofs_check.tolerances import IDENTITY_TOL
from proofs_check.traces import draw_policy_pair
from teamtr import bounds
from teamtr.cli import main

REQUIRED_KEYS = {"name", "instances", "violations", "min_slack", "median_slack"}


def _read_checks(path):
    payload = json.loads(path.read_text())
    assert set(payload) == {"checks"}
    return payload["checks"]


def test_verify_three_seeds_writes_schema_and_finds_no_violation(tmp_path, capsys):
    out = tmp_path / "verify.json"
    code = main(["verify", "--seeds", "3", "--json", str(out), "--no-progress"])
    rows = _read_checks(out)

    assert code == 0
    assert len(rows) >= 12
    assert len({row["name"] for row in rows}) == len(rows)
    for row in rows:
        assert REQUIRED_KEYS <= set(row)
        assert row["instances"] == 3
        assert row["violations"] == 0
        assert row["min_slack"] >= 0
        assert row["median_slack"] >= row["min_slack"]
    printed = capsys.readouterr().out
    for row in rows:
        assert row["name"] in printed


def _overstated_performance_difference(instance_seed: int) -> float:
    """The performance-difference identity with a deliberately wrong constant: the right-hand
    side doubled (2/(1-gamma) instead of 1/(1-gamma)). It must be reported as violated."""
    rng = np.random.default_rng(instance_seed)
    mdp = draw_tabular_mdp(rng)
    pi, pi_new = draw_policy_pair(rng, mdp)
    old, new = oracle.discounted(mdp, pi), oracle.discounted(mdp, pi_new)
    wrong_rhs = 2.0 * bounds.performance_difference_rhs(pi_new, old.A, new.d, mdp.gamma)
    return IDENTITY_TOL * max(1.0, abs(wrong_rhs)) - abs(new.J - old.J - wrong_rhs)


def test_verify_exits_nonzero_when_a_check_is_violated(tmp_path, monkeypatch, capsys):
    wrong = checks.Check(
        "performance_difference_doubled",
        "deliberately wrong constant",
        _overstated_performance_difference,
    )
    monkeypatch.setattr(verify, "CHECKS", (*checks.CHECKS, wrong))
    out = tmp_path / "verify.json"
    code = main(
        [
            "verify",
            "--seeds",
            "3",
            "--json",
            str(out),
            "--check",
            "performance_difference",
            "--check",
            wrong.name,
            "--no-progress",
        ]
    )
    rows = {row["name"]: row for row in _read_checks(out)}

    assert code == 1
    assert rows["performance_difference"]["violations"] == 0
    assert rows[wrong.name]["violations"] == 3
    assert rows[wrong.name]["min_slack"] < 0
    assert "VIOLATED: performance_difference_doubled" in capsys.readouterr().err


def test_a_check_that_raises_counts_as_violated():
    def broken(instance_seed: int) -> float:
        raise FloatingPointError(f"instance {instance_seed}")

    summary = verify.run_check(checks.Check("broken", "none", broken), range(2), lambda: None)
    assert summary.violations == 2
    assert verify.report([summary], None) == 1


@pytest.mark.parametrize("seeds", ["0", "-1"])
def test_verify_rejects_a_non_positive_seed_count(seeds):
    assert main(["verify", "--seeds", seeds, "--no-progress"]) == 2


VERIFY_ONE = [sys.executable, "-m", "teamtr.cli", "verify", "--seeds", "1", "--check", "pinsker"]


def test_console_script_prints_the_table_on_stdout_and_no_bar_into_a_log():
    result = subprocess.run(VERIFY_ONE, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "pinsker" in result.stdout and "min slack" in result.stdout
    # stderr is a pipe here, as in CI or `2> log`: no carriage-return frames of a bar.
    assert "teamtr verify" not in result.stderr and "\r" not in result.stderr
    assert "teamtr verify" not in result.stdout


def test_console_script_draws_its_bar_on_a_terminal_stderr():
    leader, follower = pty.openpty()
    # A new pseudo-terminal is 0 columns wide, in which tqdm draws nothing: give it 120.
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    try:
        result = subprocess.run(
            VERIFY_ONE, stdout=subprocess.PIPE, stderr=follower, text=True, check=False
        )
        os.close(follower)
        drawn = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal closed: everything has been read
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        os.close(leader)
    assert result.returncode == 0
    assert "teamtr verify" in drawn.decode(errors="replace")  # the tqdm bar
    assert "teamtr verify" not in result.stdout
