"""``teamtr scaling --radius-growth linear``: delta_i grows with n, so one update's occupancy
shift stays about constant in n instead of shrinking like n^(-1/2) (README, scaling section)."""

import json

import numpy as np

from studies.tabular.scaling import build_parser, radius_for
from teamtr.cli import main


def test_radius_for_scales_linearly_from_the_smallest_team():
    args = build_parser("x").parse_args(["--agents", "2..8", "--radius-growth", "linear"])
    assert [radius_for(args, n) for n in (2, 4, 8)] == [0.02, 0.04, 0.08]
    constant = build_parser("x").parse_args(["--agents", "2..8"])
    assert {radius_for(constant, n) for n in (2, 4, 8)} == {0.02}


def _update_shift_slope(tmp_path, growth):
    path = tmp_path / f"{growth}.json"
    argv = ["scaling", "--agents", "2,8", "--seeds", "4", "--bootstrap", "5"]
    argv += ["--radius-growth", growth, "--json", str(path)]
    assert main(argv) == 0
    document = json.loads(path.read_text())
    assert document["setup"]["radius_growth"] == growth
    shift = document["metrics"]["teamtr"]["mean_update_shift"]["mean"]
    return np.log(shift[1] / shift[0]) / np.log(8 / 2)


def test_linear_growth_keeps_one_updates_shift_nearly_constant(tmp_path):
    constant = _update_shift_slope(tmp_path, "constant")
    linear = _update_shift_slope(tmp_path, "linear")
    # An agent owning 1/n of the occupancy moves it by ~ sqrt(delta / 2n): slope -1/2 at a
    # constant radius, ~0 when delta grows like n.
    assert constant < -0.25
    assert abs(linear) < 0.25
