"""The team-size table: one step-size map per n, read at one δ, from runs written out here."""

from __future__ import annotations

import json

import pytest

from studies.llm.step_size_map import run_record, summarise
from studies.llm.team_size import main, parse_map, team_size


def evaluation(credit: float) -> dict[str, float]:
    return {
        "turn_credit": credit,
        "turn_credit_standard_error": 0.01,
        "accuracy": credit,
        "n": 50.0,
    }


def a_map(credits: dict[str, list[float]]) -> dict:
    """A map of runs ``<scheme>-d02-s<seed>`` whose one checkpoint, at the budget, scores
    ``credits[scheme][seed]``."""
    stage = {
        "certificate": -1.0,
        "rollout_rewards": [0.1, 0.2],
        "generated_tokens": 100,
        "cpu_seconds": 60.0,
        "updates": [{"kl": 0.1, "backtracks": 0, "kept": True}],
    }
    runs = [
        run_record(
            {
                "run": f"{scheme}-d02-s{seed}",
                "curve": [{"budget_minutes": 8.0, "metrics": evaluation(credit)}],
            },
            [stage],
            evaluation(0.0),
        )
        for scheme, values in credits.items()
        for seed, credit in enumerate(values)
    ]
    return json.loads(json.dumps(summarise(runs)))


def test_each_n_gives_its_rows_and_paired_differences_at_the_radius():
    maps = {
        2: a_map({"stale": [0.5, 0.5], "teamtr": [0.75, 0.5]}),
        8: a_map({"stale": [0.25, 0.125, 0.0], "teamtr": [0.5, 0.5, 0.5]}),
    }
    summary = team_size(maps, 0.2)
    assert [(row["n"], row["scheme"]) for row in summary["rows"]] == [
        (2, "stale"),
        (2, "teamtr"),
        (8, "stale"),
        (8, "teamtr"),
    ]
    two, eight = summary["paired"]
    assert (two["n"], eight["n"]) == (2, 8)
    # n = 8: differences 0.25, 0.375, 0.5: mean 0.375, se = 0.125 / sqrt 3.
    assert eight["turn_credit_at_budget"]["mean"] == pytest.approx(0.375, abs=1e-12)
    assert eight["standard_errors_from_zero"] == pytest.approx(0.375 / (0.125 / 3**0.5), abs=1e-9)
    assert team_size(maps, 1.0) == {"radius": 1.0, "rows": [], "paired": []}


def test_the_mean_over_the_budget_separates_runs_that_both_end_at_the_ceiling():
    """Two schemes at 1.0 at the budget tie there; the one that got there sooner leads in the
    mean over the budget, seed by seed."""

    def run(scheme: str, seed: int, reached: float) -> dict:
        curve = [
            {"budget_minutes": reached, "metrics": evaluation(1.0)},
            {"budget_minutes": 8.0, "metrics": evaluation(1.0)},
        ]
        stage = {"certificate": -1.0, "rollout_rewards": [0.1], "generated_tokens": 1,
                 "cpu_seconds": 1.0, "updates": [{"kl": 0.1, "backtracks": 0, "kept": True}]}  # fmt: skip
        return run_record(
            {"run": f"{scheme}-d02-s{seed}", "curve": curve}, [stage], evaluation(0.0)
        )

    runs = [
        run("teamtr", 0, 2.0),
        run("stale", 0, 4.0),
        run("teamtr", 1, 2.0),
        run("stale", 1, 6.0),
    ]
    summary = team_size({8: json.loads(json.dumps(summarise(runs)))}, 0.2)
    (paired,) = summary["paired"]
    assert paired["turn_credit_at_budget"]["mean"] == 0.0
    # Means over 8 minutes: teamtr 1 - 1/8 both seeds; stale 1 - 2/8, then 1 - 3/8.
    assert paired["turn_credit_mean_to_budget_differences"] == pytest.approx([0.125, 0.25])
    assert paired["mean_standard_errors_from_zero"] == pytest.approx(0.1875 / 0.0625, abs=1e-9)


def test_the_command_writes_the_tables_and_the_figure_and_refuses_bad_maps(tmp_path, capsys):
    paths = []
    for n, credits in ((2, [0.5, 0.25]), (8, [0.0, 0.125])):
        path = tmp_path / f"map{n}.json"
        path.write_text(json.dumps(a_map({"stale": credits, "teamtr": [1.0, 1.0]})))
        paths += ["--map", f"{n}={path}"]
    out, figure = tmp_path / "team.json", tmp_path / "team.png"
    arguments = [*paths, "--radius", "0.2", "--json", str(out), "--plot", str(figure)]
    assert main([*arguments, "--markdown"]) == 0
    printed = capsys.readouterr().out
    assert "| 8 | teamtr − stale | 2 | 0.938 ± 0.062 | 15.0 | 2 of 2 |" in printed
    assert figure.stat().st_size > 10_000
    assert len(json.loads(out.read_text())["paired"]) == 2
    assert main(["--map", "eight=x.json", "--radius", "0.2"]) == 2
    assert main(["--map", f"8={tmp_path / 'missing.json'}", "--radius", "0.2"]) == 2
    assert main([*paths, "--radius", "0.5"]) == 2
    assert "no map has runs at δ = 0.5" in capsys.readouterr().err
    with pytest.raises(ValueError):
        parse_map("8")
