"""``teamtr swap-sim`` end to end on a small run: schema, certificates, figure."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pytest

import sim
from sim.agent_alignment import align_agent
from studies.tabular.swap_sim import SEED_KEYS, optimal_value, replacement_table
from teamtr.cli import main

ROOT = Path(__file__).resolve().parents[2]
SEEDS, FURTHER = 3, 2
SWEEP = "0.01,1"


@pytest.fixture(scope="module", params=["other-team", "other-run"])
def study(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp("swap_sim")
    json_path, png_path = folder / "swap_sim.json", folder / "swap_sim.png"
    argv = ["swap-sim", "--seeds", str(SEEDS), "--train-stages", "2", "--donor-stages", "3"]
    argv += ["--further-stages", str(FURTHER), "--delta0-sweep", SWEEP]
    argv += ["--replacement", request.param, "--json", str(json_path), "--plot", str(png_path)]
    assert main(argv) == 0
    return json.loads(json_path.read_text()), png_path


def test_json_schema(study):
    result, _ = study
    assert set(result) == {
        "family",
        "settings",
        "paper_claims",
        "definitions",
        "summary",
        "runs",
    }
    assert result["settings"]["delta0_sweep"] == [0.01, 0.05, 1.0]  # the default delta0 joins
    assert len(result["runs"]) == SEEDS
    for run in result["runs"]:
        assert set(run) == set(SEED_KEYS)
        for key in ("no_swap", "direct", "aligned"):
            assert len(run[key]["J_further"]) == FURTHER
        assert [row["delta0"] for row in run["sweep"]] == [0.01, 0.05, 1.0]
        assert run["J_uniform"] < run["J_max"]
        assert run["J_trained_curve"][-1] == run["J_trained"]
        for mode in ("direct", "aligned"):
            assert len(run["upgrade"][mode]["J"]) == 3
            assert run["upgrade"][mode]["J"][0] == pytest.approx(run["J_trained"])
    summary = result["summary"]
    for when in ("at_swap", "after_further_stages"):
        assert 0.0 <= summary[when]["aligned_beats_direct_fraction"] <= 1.0
    scores = summary["score"]
    assert scores["aligned_swap"]["mean"] <= 1.0 + 1e-12
    assert len(summary["sweep"]) == 3


def test_certificate_covers_every_aligned_swap(study):
    result, _ = study
    assert result["summary"]["certificate"]["aligned_covers_every_seed"] is True
    assert result["summary"]["certificate"]["sweep_covers_every_seed"] is True
    for run in result["runs"]:
        for row in run["sweep"]:
            certificate = row["certificate"]
            assert row["max_kl_to_cur"] <= row["delta0"] + 1e-9
            assert certificate["realised_gain"] >= certificate["certificate"] - 1e-9
            assert certificate["realised_gain"] >= certificate["certificate_at_radius"] - 1e-9
            assert certificate["realised_gain"] == pytest.approx(
                row["J_swap"] - run["J_trained"], abs=1e-12
            )
        assert run["upgrade"]["aligned"]["covers"] is True


def test_aligned_swap_moves_less_than_the_direct_one(study):
    result, _ = study
    for run in result["runs"]:
        aligned, direct = run["aligned"], run["direct"]
        assert aligned["expected_kl_to_cur"] <= aligned["delta0"] + 1e-12
        if direct["expected_kl_to_cur"] is not None:
            assert aligned["expected_kl_to_cur"] <= direct["expected_kl_to_cur"] + 1e-12


def test_plot_is_a_png(study):
    _, png_path = study
    image = matplotlib.image.imread(png_path)
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 600


def test_figure_script_redraws_from_the_json(study, tmp_path):
    result, _ = study
    json_path = tmp_path / "swap.json"
    json_path.write_text(json.dumps(result))
    out = tmp_path / "redrawn.png"
    completed = subprocess.run(
        [sys.executable, str(ROOT / "figures" / "plot_swap_sim.py"), str(json_path), str(out)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert completed.returncode == 0, completed.stderr
    assert matplotlib.image.imread(out).shape[2] in (3, 4)


def test_optimal_value_bounds_every_team():
    mdp = sim.coordination_game(n_agents=3, seed=4)
    best = optimal_value(mdp)
    for seed in range(5):
        assert sim.evaluate(mdp, sim.random_team(mdp, seed).table).J <= best + 1e-9
    assert math.isfinite(best)


def test_replacement_has_full_support_so_alignment_is_feasible():
    mdp = sim.coordination_game(n_agents=3, seed=1)
    greedy = sim.TabularTeam(sim.uniform_team(mdp).table * 0 + [1.0, 0.0, 0.0], mdp.agent_of_state)
    replacement = replacement_table(greedy)
    assert (replacement > 0).all()
    peaked_current = sim.TabularTeam(
        sim.uniform_team(mdp).table * 0 + [0.0005, 0.0005, 0.999], mdp.agent_of_state
    )
    result = align_agent(mdp, peaked_current, 0, replacement, delta0=0.05)
    assert result.max_kl_to_cur <= 0.05 + 1e-9


@pytest.mark.parametrize(
    "argv",
    [
        ["--seeds", "0"],
        ["--delta0", "-1"],
        ["--family", "nope"],
        ["--delta0-sweep", "0.1,0"],
    ],
)
def test_bad_options_exit_2(argv):
    assert main(["swap-sim", *argv]) == 2
