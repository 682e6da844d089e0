"""The studies check ``--radius`` by the core's one rule (``teamtr.trust_region``).

``studies.options.radius_problem`` reports ``check_radius``'s own message after the option's
name, so a bad radius reads the same on every command line as in a ``StageConfig``.
"""

from __future__ import annotations

import pytest

from studies.llm.drift.scaling import build_parser, run
from teamtr.cli import main
from teamtr.trust_region import RADIUS_RULE


@pytest.mark.parametrize(
    "argv",
    [
        ["scaling", "--radius", "0", "--agents", "2,3"],
        ["sim-train", "--radius", "-0.5"],
        ["sim-train", "--large-radius", "nan"],
        ["swap-sim", "--radius", "inf"],
    ],
    ids=" ".join,
)
def test_tabular_commands_report_a_bad_radius_with_the_core_rule(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    flag = next(a for a in argv if a.endswith("radius"))
    assert f"{flag}: {RADIUS_RULE}, got" in err and err.count("\n") == 1


def test_zero_skips_the_large_radius_run_and_is_no_radius_error(capsys):
    assert main(["sim-train", "--large-radius", "0", "--seeds", "0"]) == 2
    err = capsys.readouterr().err
    assert "--seeds" in err and "radius" not in err


@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_the_drift_study_reports_a_bad_radius_with_the_core_rule(tmp_path, capsys, value):
    args = build_parser("teamtr llm-scaling").parse_args(
        ["--source", "tiny", "--runs", str(tmp_path / "runs"), "--radius", value]
    )
    assert run(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:")
    assert err.endswith(f"--radius: {RADIUS_RULE}, got {float(value)!r}")
