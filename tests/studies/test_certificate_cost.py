"""studies.llm.certificate.cost: the held-out pairs' cost and floor, from committed run records.

The relay's records (a run with sequential held-out draws and the same run without) and the
play-cost report are real files of the repository; every column is recomputed here from them."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from llm.common.config import ConfigError
from studies.llm.certificate.cost import information_limit, main, run_cost, table

ROOT = Path(__file__).resolve().parents[2]
RECORDS = ROOT / "results" / "measured_certificate" / "run_records"
PLAY_COST = ROOT / "results" / "measured_certificate" / "held_out_play_cost.json"


def stages_of(run: str) -> list[dict]:
    lines = (RECORDS / run / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def test_every_column_is_what_the_records_and_the_play_cost_say() -> None:
    play_cost = json.loads(PLAY_COST.read_text())
    row = run_cost(RECORDS / "amx-relay-g16-s0", RECORDS / "amx-relay-none-s0", play_cost)
    stages, plain = stages_of("amx-relay-g16-s0"), stages_of("amx-relay-none-s0")
    measured = [u["measured"] for s in stages for u in s["updates"] if u["measured"]]
    pairs = [m["n"] for m in measured]
    assert row["pairs"] == pairs and len(pairs) == 4
    assert row["certified"] == [m["bound"] > 0 for m in measured]
    gaining = [m for m in measured if m["mean"] >= 0.10]
    assert row["gaining"] == len(gaining) == 3
    assert row["gaining_certified"] == sum(m["bound"] > 0 for m in gaining)
    cpu = sum(s["cpu_seconds"] for s in stages)
    without = sum(s["cpu_seconds"] for s in plain)
    assert row["ratio"] == pytest.approx(cpu / without, rel=1e-12)
    assert row["per_pair"] == pytest.approx((cpu - without) / sum(pairs), rel=1e-12)
    assert row["bar_budget_per_pair"] == pytest.approx(0.5 * without / sum(pairs), rel=1e-12)
    # The relay's two turns; the first update's old sides are played whole.
    assert row["precision"] == "bfloat16"
    per_turn = play_cost["bfloat16"]["per_dialogue_seconds"] / 2
    assert row["floor_dialogue_turns"] == 2 * pairs[0] + sum(pairs)
    assert row["floor_cpu_seconds"] == pytest.approx(per_turn * (2 * pairs[0] + sum(pairs)))
    assert row["floor_ratio"] == pytest.approx(1 + row["floor_cpu_seconds"] / without)
    assert "| s0 | 48, 80c, 48c, 64c | 3 of 3 |" in table({"s0": row})


def test_runs_that_do_not_compare_are_refused(tmp_path: Path, capsys) -> None:
    play_cost = json.loads(PLAY_COST.read_text())
    with pytest.raises(ConfigError, match="not a run without pairs"):
        run_cost(RECORDS / "amx-relay-g16-s0", RECORDS / "amx-relay-g16-s1", play_cost)
    with pytest.raises(ConfigError, match="measured no update"):
        run_cost(RECORDS / "amx-relay-none-s0", RECORDS / "amx-relay-none-s1", play_cost)
    shorter = tmp_path / "shorter"
    shutil.copytree(RECORDS / "amx-relay-none-s0", shorter)
    first = (shorter / "metrics.jsonl").read_text().splitlines()[0]
    (shorter / "metrics.jsonl").write_text(first + "\n")
    pair = f"s0={RECORDS / 'amx-relay-g16-s0'}:{shorter}"
    assert main(["--run", pair, "--play-cost", str(PLAY_COST)]) == 2
    error = capsys.readouterr().err
    assert "has 2 stages" in error and "shorter 1:" in error and len(error.splitlines()) == 1


def test_the_information_limit_is_the_normal_pairs_for_the_gain_at_the_gaining_spread() -> None:
    """n* = 2 log(1/alpha) sd^2 / gain^2 at the gaining updates' mean spread, and its floor:
    the first update's old sides whole and a turn a pair, for every measured update."""
    play_cost = json.loads(PLAY_COST.read_text())
    rows = {
        f"s{seed}": run_cost(
            RECORDS / f"amx-relay-g16-s{seed}", RECORDS / f"amx-relay-none-s{seed}", play_cost
        )
        for seed in (0, 2)
    }
    spreads = [
        u["measured"]["sd"]
        for seed in (0, 2)
        for s in stages_of(f"amx-relay-g16-s{seed}")
        for u in s["updates"]
        if u["measured"] and u["measured"]["mean"] >= 0.10
    ]
    limit = information_limit(rows)
    assert limit is not None and limit["sd"] == pytest.approx(sum(spreads) / len(spreads))
    pairs = math.ceil(2 * math.log(1 / 0.05) * limit["sd"] ** 2 / 0.10**2)
    assert limit["pairs_per_update"] == pairs
    run = limit["runs"]["s0"]
    assert run["dialogue_turns"] == (2 + 4) * pairs
    per_turn = play_cost["bfloat16"]["per_dialogue_seconds"] / 2
    assert run["ratio"] == pytest.approx(
        1 + per_turn * 6 * pairs / rows["s0"]["cpu_seconds_without"]
    )
    assert (
        information_limit(
            {"s1": run_cost(RECORDS / "amx-relay-g16-s1", RECORDS / "amx-relay-none-s1", play_cost)}
        )
        is None
    )  # seed 1 gained +0.10 nowhere
