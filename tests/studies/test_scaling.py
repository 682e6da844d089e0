"""``teamtr scaling`` end to end on n = 2..4 with one seed, checked against recomputations."""

import json
import math
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

import sim
from studies.tabular.families import turn_taking_ring
from studies.tabular.measure import ExactEvaluations, measure_stage, run_recorded_stage
from studies.tabular.scaling import METRICS, SCHEMES, build_parser, parse_agents
from teamtr import StageConfig
from teamtr.cli import main

ROOT = Path(__file__).resolve().parents[2]
AGENTS = [2, 3, 4]
RADIUS = 0.02


@pytest.fixture(scope="module")
def scaling_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("scaling")
    json_path, png_path = folder / "scaling.json", folder / "scaling.png"
    argv = ["scaling", "--agents", "2..4", "--seeds", "1", "--radius", str(RADIUS)]
    argv += ["--bootstrap", "20", "--json", str(json_path), "--plot", str(png_path)]
    assert main(argv) == 0
    return json.loads(json_path.read_text()), json_path, png_path


def _ring(n, seed=0):
    defaults = build_parser("x").parse_args([])
    mdp = turn_taking_ring(
        n,
        states_per_agent=defaults.states_per_agent,
        n_actions=defaults.actions,
        gamma=defaults.gamma,
        successors=defaults.successors,
        seed=seed,
    )
    start = sim.random_team(mdp, np.random.default_rng([seed, n]), defaults.concentration)
    return mdp, start


def test_json_schema_and_finite_drift_exponents(scaling_run):
    result, _, _ = scaling_run
    assert result["n"] == AGENTS
    assert set(result["alpha"]) == set(SCHEMES)
    for scheme in SCHEMES:
        assert math.isfinite(result["alpha"][scheme])
        assert result["alpha_all"][scheme]["drift"]["alpha"] == result["alpha"][scheme]
        for metric in METRICS:
            stats = result["metrics"][scheme][metric]
            assert len(stats["mean"]) == len(stats["std"]) == len(AGENTS)
            assert all(len(values) == 1 for values in stats["values"])
    assert result["papers"] == {"stale": 1.94, "teamtr": 1.07}
    for name in ("drift", "train_true_mismatch", "surrogate_error", "certified_penalty"):
        assert name in result["definitions"]
    assert "finding" in result["aggregate_stale_error"]


def test_teamtr_trains_on_the_true_occupancy_and_stale_does_not(scaling_run):
    result, _, _ = scaling_run
    teamtr = result["metrics"]["teamtr"]["train_true_mismatch"]["values"]
    stale = result["metrics"]["stale"]["drift"]["values"]
    assert all(value == 0.0 for values in teamtr for value in values)
    assert all(
        s >= t
        for s_row, t_row in zip(stale, teamtr, strict=True)
        for s, t in zip(s_row, t_row, strict=True)
    )
    # From three agents on, the later stale updates train under a visibly wrong occupancy.
    assert all(values[0] > 1e-6 for values in stale[1:])


def test_drifts_match_a_recomputation_from_the_kept_teams(scaling_run):
    result, _, _ = scaling_run
    for j, n in enumerate(AGENTS):
        mdp, start = _ring(n)
        for scheme in SCHEMES:
            config = StageConfig(scheme=scheme, radius=RADIUS, order="fixed", seed=0)
            trace = run_recorded_stage(mdp, start, config, ExactEvaluations(mdp))
            # Independent: fresh exact occupancies of pi_hat^0 .. pi_hat^n from the report.
            d = [sim.evaluate(mdp, team.table).d for team in trace.report.teams]
            assert len(d) == n + 1
            if scheme == "teamtr":
                expected = sum(np.abs(d[i + 1] - d[i]).sum() for i in range(n))
            else:
                expected = sum(np.abs(d[i] - d[0]).sum() for i in range(n))
            measured = result["metrics"][scheme]["drift"]["values"][j][0]
            assert measured == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_certified_penalties_and_gains_match_the_stage_report():
    mdp, start = _ring(3)
    evaluations = ExactEvaluations(mdp)
    config = StageConfig(scheme="teamtr", radius=RADIUS)
    trace = run_recorded_stage(mdp, start, config, evaluations)
    measurement = measure_stage(mdp, trace, evaluations)
    report = trace.report
    assert measurement.realised_gain == pytest.approx(report.realised_gain, abs=1e-12)
    # Thm 3.6 penalty with delta_i >= measured KL_i charges at least the loop's penalty.
    assert measurement.certified_penalty >= sum(r.penalty for r in report.records) - 1e-12
    # Thm 3.4 per update: the exact gain is within the penalty of the surrogate.
    for record, error in zip(
        [r for r in report.records if r.kept], measurement.per_update_error, strict=True
    ):
        assert abs(error) <= record.penalty + 1e-9


def test_every_agent_holds_one_nth_of_the_ring_occupancy():
    for n in (2, 5):
        mdp, start = _ring(n, seed=3)
        d = sim.evaluate(mdp, start.table).d
        shares = [d[mdp.agent_of_state == k].sum() for k in range(n)]
        np.testing.assert_allclose(shares, 1.0 / n, atol=1e-10)


def test_png_is_a_valid_image_and_the_figure_script_redraws_it(scaling_run, tmp_path):
    _, json_path, png_path = scaling_run
    assert matplotlib.image.imread(png_path).shape[0] > 100
    redrawn = tmp_path / "again.png"
    subprocess.run(
        [sys.executable, str(ROOT / "figures" / "plot_scaling.py"), str(json_path), str(redrawn)],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    image = matplotlib.image.imread(redrawn)
    assert image.ndim == 3 and image.shape[1] > 100


def test_agents_option_parses_ranges_and_rejects_single_sizes():
    assert parse_agents("2..5") == [2, 3, 4, 5]
    assert parse_agents("8,2,4") == [2, 4, 8]
    with pytest.raises(Exception, match="two distinct"):
        parse_agents("3")


def test_bad_radius_is_rejected_with_exit_code_2(capsys):
    assert main(["scaling", "--radius", "0", "--agents", "2,3"]) == 2
    assert "--radius" in capsys.readouterr().err
