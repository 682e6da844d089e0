"""``teamtr sim-train`` end to end on a small run, and its certified-improvement check."""

import json
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

import sim
from studies.tabular.families import build_family
from studies.tabular.sim_train import SCHEMES, as_single_agent
from studies.tabular.training import CertifiedImprovementViolation, check_certified_improvement
from teamtr.cli import main
from teamtr.reports import AgentUpdate, StageReport, UpdateRecord

ROOT = Path(__file__).resolve().parents[2]
STAGES = 3
FAMILIES = ["coordination", "ring"]


@pytest.fixture(scope="module")
def training_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sim_train")
    json_path, png_path = folder / "sim_train.json", folder / "sim_train.png"
    argv = ["sim-train", "--stages", str(STAGES), "--seeds", "1", "--families", ",".join(FAMILIES)]
    argv += ["--episodes", "40", "--json", str(json_path), "--plot", str(png_path)]
    assert main(argv) == 0
    return json.loads(json_path.read_text()), json_path, png_path


def test_every_scheme_sampler_and_family_is_recorded(training_run):
    result, _, _ = training_run
    assert list(result["families"]) == FAMILIES
    assert result["schemes"] == list(SCHEMES)
    keys = {(r["family"], r["sampler"], r["scheme"]) for r in result["runs"]}
    assert keys == {(f, s, k) for f in FAMILIES for s in ("exact", "sampled") for k in SCHEMES}
    for run in result["runs"]:
        assert len(run["J"]) == STAGES + 1
        assert len(run["stages"]) == STAGES
        for before, after, stage in zip(run["J"], run["J"][1:], run["stages"], strict=False):
            assert stage["realised_gain"] == pytest.approx(after - before, abs=1e-12)
    for row in result["summary"]:
        assert row["stages"] == STAGES
        assert row["J_final_mean"] == pytest.approx(row["J_mean_curve"][-1])


def test_exact_teamtr_never_regresses_after_a_positive_certificate(training_run):
    result, _, _ = training_run
    exact_teamtr = [r for r in result["runs"] if (r["sampler"], r["scheme"]) == ("exact", "teamtr")]
    assert exact_teamtr
    for run in exact_teamtr:
        for stage in run["stages"]:
            assert stage["realised_gain"] >= stage["certificate"] - 1e-9
            if stage["certificate"] > 0:
                assert stage["realised_gain"] >= -1e-9
    for row in result["summary"]:
        if (row["sampler"], row["scheme"]) == ("exact", "teamtr"):
            assert row["certificate_violations"] == 0


def test_the_check_raises_when_an_update_gains_less_than_its_certificate():
    update = AgentUpdate(policy=None, surrogate=0.3, kl=0.01, advantage_bound=0.1)
    record = UpdateRecord(
        position=0,
        agent=0,
        radius=0.01,
        update=update,
        kept=True,
        penalty=0.1,
        certificate=0.2,
        j_before=1.0,
        j_after=1.05,
    )
    report = StageReport("teamtr", (0,), (record,), 0.2, j_start=1.0, j_end=1.05)
    with pytest.raises(CertifiedImprovementViolation, match="gained"):
        check_certified_improvement(report, "fabricated")
    honest = StageReport(
        "teamtr",
        (0,),
        (UpdateRecord(0, 0, 0.01, update, True, 0.1, 0.2, 1.0, 1.25),),
        0.2,
        j_start=1.0,
        j_end=1.25,
    )
    check_certified_improvement(honest, "honest")


def test_single_agent_view_keeps_the_mdp_and_the_value():
    mdp = build_family("ring", seed=1)
    single = as_single_agent(mdp)
    assert single.n_agents == 1 and mdp.n_agents == 4
    team = sim.random_team(mdp, np.random.default_rng(0), 1.0)
    j_team = sim.evaluate(mdp, team.table).J
    j_single = sim.evaluate(single, team.table).J
    assert j_single == pytest.approx(j_team, rel=1e-12)


def test_png_is_a_valid_image_and_the_figure_script_redraws_it(training_run, tmp_path):
    _, json_path, png_path = training_run
    assert matplotlib.image.imread(png_path).shape[0] > 100
    redrawn = tmp_path / "again.png"
    script = ROOT / "figures" / "plot_sim_train.py"
    subprocess.run(
        [sys.executable, str(script), str(json_path), str(redrawn)],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    assert matplotlib.image.imread(redrawn).shape[1] > 100


def test_unknown_family_is_rejected_with_exit_code_2(capsys):
    assert main(["sim-train", "--families", "chess"]) == 2
    assert "--families" in capsys.readouterr().err
