"""The step-size map's summary, on runs written out here: what it counts is what the records say."""

from __future__ import annotations

import json

import pytest

from studies.llm.run_records import mean_until
from studies.llm.step_size_map import (
    certificate_checks,
    main,
    markdown,
    paired_differences,
    parse_run,
    plot,
    run_record,
    sample_size_by_position,
    summarise,
    team_name,
    update_shares,
    value_at,
)


def evaluation(credit: float, accuracy: float, credit_error: float = 0.01) -> dict[str, float]:
    return {
        "turn_credit": credit,
        "turn_credit_standard_error": credit_error,
        "accuracy": accuracy,
        "n": 50.0,
    }


def stage(certificate: float, first_reward: float, updates: list[tuple[float, int, bool]]):
    return {
        "certificate": certificate,
        "rollout_rewards": [first_reward, first_reward + 0.1],
        "generated_tokens": 100,
        "cpu_seconds": 60.0,
        "updates": [{"kl": kl, "backtracks": b, "kept": kept} for kl, b, kept in updates],
    }


def test_a_run_name_gives_scheme_radius_and_seed():
    assert parse_run("teamtr-d1-s2") == ("teamtr", 1.0, 2)
    assert parse_run("stale-d004-s0") == ("stale", 0.04, 0)
    assert parse_run("teamtr-norad-d1-s1") == ("teamtr-norad", 1.0, 1)  # an ablation
    with pytest.raises(ValueError, match="expected"):
        parse_run("teamtr-d7-s0")


def curve_point(minutes: float, credit: float, accuracy: float) -> dict:
    return {"budget_minutes": minutes, "metrics": evaluation(credit, accuracy)}


def weighted_stage(sizes: list[float]):
    record = stage(-1.0, 0.1, [(0.1, 0, True)] * len(sizes))
    for update, size in zip(record["updates"], sizes, strict=True):
        update["effective_sample_size"] = size
    return record


def test_the_effective_sample_size_is_averaged_per_update_position():
    stages = [weighted_stage([1.0, 0.8, 0.5]), weighted_stage([1.0, 0.6, 0.3])]
    assert sample_size_by_position(stages) == pytest.approx([1.0, 0.7, 0.4])
    # Records from before the field was written: no figure rather than a wrong one.
    assert sample_size_by_position([stage(-1.0, 0.1, [(0.1, 0, True)])]) is None


def test_happo_rows_get_an_effective_sample_size_table_and_panel(tmp_path):
    curve = {"run": "happo-d1-s0", "curve": [curve_point(16.0, 0.5, 0.2)]}
    other = {"run": "happo-d1-s1", "curve": [curve_point(16.0, 0.6, 0.3)]}
    runs = [
        run_record(curve, [weighted_stage([1.0, 0.5])], evaluation(0.25, 0.0)),
        run_record(other, [weighted_stage([1.0, 0.3])], evaluation(0.25, 0.0)),
    ]
    summary = summarise(runs)
    (row,) = summary["rows"]
    assert [c["mean"] for c in row["effective_sample_size_by_position"]] == pytest.approx(
        [1.0, 0.4]
    )
    assert "| 1 | happo | 2 | 1.00 ± 0.00 | 0.40 ± 0.10 |" in markdown(summary)
    figure = plot(summary, tmp_path / "map.png")
    assert figure.stat().st_size > 10_000
    from PIL import Image

    assert Image.open(figure).size[0] > Image.open(figure).size[1] * 4  # four panels in a row


def test_update_shares_count_backtracks_the_radius_and_rejections():
    stages = [
        stage(-1.0, 0.1, [(0.6, 2, True), (0.2, 0, True)]),
        stage(-1.0, 0.2, [(0.0, 4, False), (0.5, 0, True)]),
    ]
    shares = update_shares(stages, radius=1.0)
    assert shares == {"updates": 4.0, "backtracked": 0.5, "near_radius": 0.5, "rejected": 0.25}


def test_a_certificate_holds_where_the_measured_change_reaches_it():
    stages = [stage(-0.5, 0.1, []), stage(0.2, 0.3, []), stage(0.0, 0.35, [])]
    checks = certificate_checks(stages)
    # 0.3 - 0.1 = 0.2 >= -0.5 holds; 0.35 - 0.3 = 0.05 < 0.2 does not.
    assert checks["stages"] == 2.0 and checks["held"] == 0.5
    assert checks["mean_certificate"] == pytest.approx(-0.15)
    assert checks["mean_change"] == pytest.approx(0.125)


def test_the_value_at_equal_cpu_is_linear_between_checkpoints():
    points = [(0.0, 0.0), (4.0, 0.4), (9.0, 0.9)]
    assert value_at(points, 6.0) == pytest.approx(0.6)
    assert value_at(points, 4.0) == pytest.approx(0.4)
    assert value_at(points, 12.0) == 0.9  # beyond the last checkpoint: its value


def test_the_mean_over_the_budget_is_the_area_under_the_curve_over_the_budget():
    points = [(0.0, 0.0), (4.0, 0.4), (9.0, 0.9)]
    # A straight line y = x / 10 up to 9 minutes: its mean over [0, 6] is 0.3.
    assert mean_until(points, 6.0) == pytest.approx(0.3, abs=1e-12)
    # Beyond the last checkpoint the value is held: (9 * 0.45 + 3 * 0.9) / 12 = 0.5625.
    assert mean_until(points, 12.0) == pytest.approx(0.5625, abs=1e-12)
    # Two runs both at 1.0 by the budget: the one that got there sooner has the larger mean.
    sooner, later = [(0.0, 0.0), (2.0, 1.0)], [(0.0, 0.0), (6.0, 1.0)]
    assert mean_until(sooner, 8.0) == pytest.approx(7 / 8, abs=1e-12)
    assert mean_until(later, 8.0) == pytest.approx(5 / 8, abs=1e-12)
    assert value_at(sooner, 8.0) == value_at(later, 8.0) == 1.0
    with pytest.raises(ValueError, match="positive budget"):
        mean_until(points, 0.0)


def test_a_drop_beyond_two_standard_errors_is_a_regression():
    curve = {
        "run": "stale-d1-s0",
        "curve": [
            {"budget_minutes": 2.0, "metrics": evaluation(0.5, 0.2)},
            {
                "budget_minutes": 4.0,
                "metrics": evaluation(0.4, 0.2),
            },  # 0.1 > 2 * hypot(0.01, 0.01): a regression
            {"budget_minutes": 6.0, "metrics": evaluation(0.39, 0.2)},  # 0.01 is not
        ],
    }
    record = run_record(curve, [stage(-1.0, 0.1, [(0.9, 1, True)])], evaluation(0.25, 0.0))
    assert record["regressions_turn_credit"] == 1
    assert record["regressions_accuracy"] == 0
    assert record["turn_credit_curve"] == [(0.0, 0.25), (2.0, 0.5), (4.0, 0.4), (6.0, 0.39)]
    assert (record["scheme"], record["radius"], record["turn_credit"]) == ("stale", 1.0, 0.39)
    assert record["minutes"] == 6.0 and record["turn_credit_at_budget"] == 0.39  # held


def test_the_summary_averages_over_seeds_and_the_command_writes_it(tmp_path, capsys):
    curves, metrics = tmp_path / "curves", tmp_path / "metrics"
    curves.mkdir()
    metrics.mkdir()
    for seed, credit in enumerate((0.6, 0.8)):
        run = f"teamtr-d1-s{seed}"
        curve = {
            "run": run,
            "curve": [{"budget_minutes": 16.0, "metrics": evaluation(credit, credit / 2)}],
        }
        (curves / f"{run}.json").write_text(json.dumps(curve))
        line = json.dumps(stage(-1.0, 0.1, [(0.7, 1, True)]))
        (metrics / f"{run}.jsonl").write_text(line + "\n")
    untrained = tmp_path / "untrained.json"
    untrained.write_text(json.dumps(evaluation(0.25, 0.0)))
    out = tmp_path / "map.json"
    assert (
        main(
            [
                "--curves",
                str(curves),
                "--metrics",
                str(metrics),
                "--untrained",
                str(untrained),
                "--json",
                str(out),
                "--plot",
                str(tmp_path / "map.png"),
                "--markdown",
            ]
        )
        == 0
    )
    assert (tmp_path / "map.png").stat().st_size > 10_000
    row = json.loads(out.read_text())["rows"][0]
    assert row["seeds"] == 2 and row["turn_credit"]["mean"] == pytest.approx(0.7)
    # At 8 of the 16 minutes to the only checkpoint: halfway from the untrained 0.25.
    assert row["turn_credit_at_budget"]["mean"] == pytest.approx(
        (0.25 + 0.6) / 2 / 2 + (0.25 + 0.8) / 2 / 2
    )
    assert row["turn_credit"]["standard_error"] == pytest.approx(0.1)  # sd 0.1414 / sqrt 2
    assert "| 0.700 ± 0.100 | 35.0 ± 5.0% | 16.0 ± 0.0 |" in capsys.readouterr().out
    assert (
        summarise(
            [
                run_record(
                    json.loads((curves / "teamtr-d1-s0.json").read_text()),
                    [stage(-1.0, 0.1, [])],
                    evaluation(0.25, 0.0),
                )
            ]
        )["rows"][0]["seeds"]
        == 1
    )


def test_the_paired_difference_is_taken_seed_by_seed_over_the_seeds_both_have():
    def record(scheme: str, seed: int, credit: float, accuracy: float) -> dict:
        return {
            "scheme": scheme,
            "radius": 0.2,
            "seed": seed,
            "turn_credit_at_budget": credit,
            "turn_credit_mean_to_budget": credit / 2,
            "accuracy": accuracy,
        }

    runs = [
        record("stale", 0, 0.5, 0.25),
        record("stale", 1, 0.125, 0.0),
        record("teamtr", 0, 0.75, 0.25),
        record("teamtr", 1, 0.25, 0.5),
        record("teamtr", 2, 1.0, 1.0),  # no stale run of seed 2: not a pair
        record("happo", 0, 0.25, 0.0),
    ]
    happo, teamtr = paired_differences(runs)
    assert teamtr["seeds"] == [0, 1] and happo["seeds"] == [0]
    # Differences 0.25 and 0.125: mean 0.1875, sd 0.0884, se = sd / sqrt 2 = 0.0625.
    assert teamtr["turn_credit_at_budget"]["mean"] == pytest.approx(0.1875, abs=1e-12)
    assert teamtr["turn_credit_at_budget"]["standard_error"] == pytest.approx(0.0625, abs=1e-12)
    assert teamtr["turn_credit_at_budget_above"] == 2
    assert teamtr["accuracy_differences"] == [0.0, 0.5] and teamtr["accuracy_above"] == 1
    assert teamtr["turn_credit_mean_to_budget_differences"] == [0.125, 0.0625]
    assert happo["turn_credit_at_budget"]["standard_error"] is None  # one pair
    table = markdown({"rows": [], "paired": [happo, teamtr]})
    assert (
        "| 0.2 | teamtr − stale | 2 | 0.188 ± 0.062 | 2 of 2 | 25.0 ± 25.0 points | 1 of 2 |"
        in (table)
    )


def test_the_figure_names_the_team_size_its_runs_recorded():
    """The run record reads the team's size off a stage's speaking order, and the figure's title
    says it, or the sizes where the runs differ."""
    curve = {"run": "stale-d02-s0", "curve": [curve_point(16.0, 0.5, 0.2)]}
    ordered = stage(-1.0, 0.1, [(0.1, 0, True)] * 8) | {"order": [6, 7, 2, 1, 4, 5, 3, 0]}
    eight = run_record(curve, [ordered], evaluation(0.25, 0.0))
    assert eight["agents"] == 8
    assert team_name(summarise([eight])) == "8-agent relay chain"
    unrecorded = run_record(
        curve | {"run": "stale-d02-s1"}, [stage(-1.0, 0.1, [])], evaluation(0.25, 0.0)
    )
    assert unrecorded["agents"] is None
    assert team_name(summarise([eight, unrecorded])) == "relay chain (8 agents)"
    assert team_name(summarise([unrecorded])) == "relay chain (unknown agents)"
