"""``teamtr llm-scaling`` on the tiny model: units written one by one and skipped on a rerun,
what each scheme's metrics must be by construction, the exponent fit, bad input."""

from __future__ import annotations

import json
import math

import pytest

from studies.llm.drift import scaling as drift_study
from studies.llm.drift.scaling import (
    SCHEMES,
    StudySettings,
    build_parser,
    read_units,
    run,
    summarise,
    unit_metrics,
)

TINY = ["--source", "tiny", "--message-tokens", "3", "--prompts", "4", "--steps", "2"]
"""Batches of 4 problems x 4 dialogues: the random tiny model then states some running totals
(a digit among its characters), so updates carry a signal and teams move."""


def study(tmp_path, *extra: str) -> int:
    args = build_parser("teamtr llm-scaling").parse_args(
        [*TINY, "--runs", str(tmp_path / "runs"), "--json", str(tmp_path / "s.json"), *extra]
    )
    return run(args)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    where = tmp_path_factory.mktemp("llm_scaling")
    assert study(where, "--agents", "2,3", "--seeds", "1", "--plot", str(where / "s.png")) == 0
    return where


def test_every_unit_is_a_file_and_a_rerun_measures_nothing(finished, capsys):
    runs = finished / "runs"
    assert sorted(p.name for p in runs.iterdir()) == ["n2_seed0.json", "n3_seed0.json"]
    stamps = {p: p.stat().st_mtime_ns for p in runs.iterdir()}
    assert study(finished, "--agents", "2,3", "--seeds", "1") == 0
    assert {p: p.stat().st_mtime_ns for p in runs.iterdir()} == stamps
    assert (finished / "s.png").stat().st_size > 10_000


def test_each_scheme_measures_what_its_definition_says(finished):
    units = read_units(finished / "runs", StudySettings(**_tiny_settings()))
    # Some update moved its team, so the identities below are not all 0 == 0.
    assert any(u["schemes"]["stale"]["metrics"]["drift_kl"] > 0 for u in units)
    assert any(u["schemes"]["teamtr"]["metrics"]["drift_kl"] > 0 for u in units)
    for unit in units:
        n = unit["n"]
        stale, teamtr = (unit["schemes"][s] for s in SCHEMES)
        assert [u["agent"] for u in stale["updates"]] == list(range(n))
        for scheme in (stale, teamtr):
            first = scheme["updates"][0]
            assert first["from_start_kl"] == 0.0  # pi_hat^0 is pi_cur: nothing differs
            assert all(u["step_kl"] == 0.0 for u in scheme["updates"] if not u["kept"])
        # TeamTR trains every update on samples of pi_hat^{i-1}: no mismatch, by identity.
        assert all(u["mismatch_kl"] == 0.0 for u in teamtr["updates"])
        # Stale trains every update on pi_cur's batch: its mismatch is the drift from the start.
        assert all(u["mismatch_kl"] == u["from_start_kl"] for u in stale["updates"])
        # Dynamic sampling: every training batch drew at least its 4 groups.
        assert all(u["groups_drawn"] >= 4 for s in (stale, teamtr) for u in s["updates"])
        # TeamTR's updates are applied where they were trained: no shift gap, by construction.
        assert all(u["shift_gap"] in (None, 0.0) for u in teamtr["updates"])
        # Up to DIRECT_MAX agents every D_stale term is also measured on its own team's batch.
        assert all(u["from_start_kl_direct"] is not None for u in stale["updates"][1:])
        # Same team, same seeds: the two schemes' first updates are the same update.
        assert stale["updates"][0]["update_kl"] == teamtr["updates"][0]["update_kl"]
        assert stale["metrics"]["drift_kl"] == pytest.approx(
            sum(u["from_start_kl"] for u in stale["updates"]), abs=1e-15
        )
        assert teamtr["metrics"]["drift_kl"] == pytest.approx(
            sum(u["step_kl"] for u in teamtr["updates"]), abs=1e-15
        )


def _tiny_settings() -> dict:
    return {"source": "tiny", "message_tokens": 3, "prompts": 4, "steps": 2}


def test_summary_json_holds_every_n_and_scheme(finished):
    summary = json.loads((finished / "s.json").read_text())
    assert summary["agents"] == [2, 3] and summary["seeds"] == [0]
    for scheme in SCHEMES:
        assert set(summary["schemes"][scheme]["per_n"]) == {"2", "3"}
        assert set(summary["schemes"][scheme]["alpha"]) == set(drift_study.FITTED)
    assert set(summary["cost_ratio"]) == {"2", "3"}


def _unit(n: int, seed: int, stale_drift: float, teamtr_drift: float) -> dict:
    def metrics(drift: float) -> dict:
        row = {metric: 1.0 for metric in drift_study.METRICS}
        row.update(drift_kl=drift, drift_l1=math.sqrt(drift), step_kl=drift, stale_drift_kl=drift)
        row.update(mean_update_kl=drift / n)
        return row

    return {
        "n": n,
        "seed": seed,
        "schemes": {
            "stale": {"metrics": metrics(stale_drift)},
            "teamtr": {"metrics": metrics(teamtr_drift)},
        },
    }


def test_exponents_of_exact_power_laws_are_recovered():
    units = [
        _unit(n, seed, 0.01 * n**2 * (1 + 0.1 * seed), 0.01 * n * (1 + 0.1 * seed))
        for n in (2, 3, 4, 6, 8)
        for seed in range(3)
    ]
    summary = summarise(units, StudySettings(), n_bootstrap=50)
    stale = summary["schemes"]["stale"]["alpha"]
    teamtr = summary["schemes"]["teamtr"]["alpha"]
    # Every seed scales the same power law by its own constant: the slope is exact.
    assert stale["drift_kl"]["alpha"] == pytest.approx(2.0, abs=1e-9)
    assert teamtr["drift_kl"]["alpha"] == pytest.approx(1.0, abs=1e-9)
    assert stale["drift_l1"]["alpha"] == pytest.approx(1.0, abs=1e-9)
    assert stale["mean_update_kl"]["alpha"] == pytest.approx(1.0, abs=1e-9)
    assert summary["schemes"]["stale"]["per_n"]["4"]["drift_kl"]["mean"] == pytest.approx(
        0.16 * 1.1, abs=1e-12
    )


def test_prefix_reuse_bound_is_the_sum_of_the_regenerated_turns():
    for n in range(1, 10):
        # After updating agent k < n - 1 (speaking order) the turns from k's on: n - k of n.
        regenerated = sum(n - k for k in range(n - 1)) / n
        assert drift_study.prefix_reuse_token_ratio(n) == pytest.approx(1 + regenerated, abs=1e-12)
    assert [drift_study.prefix_reuse_token_ratio(n) for n in (2, 4, 8)] == [2.0, 3.25, 5.375]
    with pytest.raises(ValueError, match="at least one agent"):
        drift_study.prefix_reuse_token_ratio(0)


def test_tokens_per_group_divides_out_the_groups_each_draw_played():
    def unit(seed: int, stale_tokens: float, teamtr_tokens: float, drawn: list[int]) -> dict:
        row = _unit(4, seed, 1.0, 1.0)
        row["schemes"]["stale"]["metrics"]["stage_generated_tokens"] = stale_tokens
        row["schemes"]["teamtr"]["metrics"]["stage_generated_tokens"] = teamtr_tokens
        # Stale's four updates share the stage-start draw; TeamTR's draw each their own.
        row["schemes"]["stale"]["updates"] = [{"groups_drawn": drawn[0]}] * 4
        row["schemes"]["teamtr"]["updates"] = [{"groups_drawn": d} for d in drawn]
        return row

    # Seed 0 drew 2 groups at the start, then 4 in each resample; seed 1 2 in every draw.
    units = [unit(0, 185.0, 975.0, [2, 4, 4, 4]), unit(1, 190.0, 562.0, [2, 2, 2, 2])]
    ratio = summarise(units, StudySettings(), n_bootstrap=10)["cost_ratio"]["4"]
    assert ratio["tokens"] == pytest.approx(1537 / 375, abs=1e-12)
    assert ratio["groups_per_draw_stale"] == 2.0
    assert ratio["groups_per_draw_teamtr"] == pytest.approx((3.5 + 2.0) / 2, abs=1e-12)
    assert ratio["tokens_per_group"] == pytest.approx(1537 / 375 * 2.0 / 2.75, abs=1e-12)
    assert ratio["prefix_reuse_bound"] == 3.25
    # Units recorded before groups_drawn was: no per-group ratio, the rest as before.
    del units[1]["schemes"]["teamtr"]["updates"][0]["groups_drawn"]
    ratio = summarise(units, StudySettings(), n_bootstrap=10)["cost_ratio"]["4"]
    assert ratio["tokens_per_group"] is None and ratio["tokens"] == pytest.approx(1537 / 375)


def test_unit_metrics_of_a_stage_without_kept_updates():
    updates = [
        {
            "kept": False,
            "signal": False,
            "from_start_kl": 0.0,
            "step_kl": 0.0,
            "mismatch_kl": 0.0,
            "stale_gap": None,
        }
    ] * 3
    metrics = unit_metrics("stale", updates, 1.0, 10)
    assert metrics["drift_kl"] == 0.0 and metrics["kept_updates"] == 0.0
    assert math.isnan(metrics["mean_update_kl"])


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--seeds", "0"], "--seeds"),
        (["--radius", "-1"], "--radius"),
        (["--radius", "nan"], "--radius"),
        (["--group", "1"], "--group"),
    ],
)
def test_bad_options_exit_2_with_one_line(tmp_path, capsys, extra, message):
    assert study(tmp_path, *extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and message in err[0]


def test_units_of_other_settings_are_refused(finished, capsys, tmp_path):
    runs = finished / "runs"
    args = build_parser("teamtr llm-scaling").parse_args(
        [*TINY, "--radius", "0.5", "--runs", str(runs), "--json", str(tmp_path / "x.json")]
    )
    assert run(args) == 2
    assert "other settings" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_markdown_tables_list_every_n_and_exponent(finished):
    from studies.llm.drift.scaling import markdown

    summary = json.loads((finished / "s.json").read_text())
    table = markdown(summary)
    rows = [
        line for line in table.splitlines() if line.startswith("| 2 ") or line.startswith("| 3 ")
    ]
    assert len(rows) == 2 and all(row.count("|") == 11 for row in rows)
    assert all(f"| {metric} |" in table for metric in drift_study.FITTED)


def test_every_sampler_of_a_unit_rewards_the_chain_per_turn(monkeypatch):
    """The study's stages and measurement batches are rewarded by the chain's running sum,
    the task's own reward, not by the final answer alone."""
    from llm.problems.builtin import running_sum_credits
    from llm.sampling import sampler as sampling

    rewards = []
    original = sampling.DialogueSampler.__init__

    def recording(self, *args, **kwargs):
        original(self, *args, **kwargs)
        rewards.append(self.task.reward)

    monkeypatch.setattr(sampling.DialogueSampler, "__init__", recording)
    drift_study.measure_unit(StudySettings(**_tiny_settings()), 2, 0)
    assert len(rewards) >= 3 and all(r is running_sum_credits for r in rewards)
