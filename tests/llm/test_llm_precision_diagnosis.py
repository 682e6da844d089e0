"""``bench/precision_diagnosis.py`` on the tiny model: the mechanics of the diagnosis (one batch,
the same first update per rounding variant from the same weights), end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ("float32", "bfloat16", "bf16-float32-sum")


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("diagnosis") / "diagnosis.json"
    command = [sys.executable, str(ROOT / "bench" / "precision_diagnosis.py"), "--config"]
    command += ["smoke", "--seeds", "0", "--variants", *VARIANTS, "--json", str(out)]
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(command, check=True, cwd=ROOT, env=environment, capture_output=True)
    return json.loads(out.read_text())


def test_every_variant_updates_every_agent_on_the_one_batch(report):
    (seed,) = report["seeds"]
    assert seed["signal_groups"] > 0  # else no update moves and nothing is compared
    assert list(seed["variants"]) == list(VARIANTS)
    sums = {variant: seed["variants"][variant]["lora_sum"] for variant in VARIANTS}
    # float32 has no half-precision layer; the others name the sum they ran with.
    assert sums == {"float32": None, "bfloat16": "peft", "bf16-float32-sum": "float32"}
    for variant in VARIANTS:
        agents = seed["variants"][variant]["agents"]
        assert set(agents) == {"0", "1"}
        # Every variant's reference pass is its own (the batch re-scored), so its ratio check
        # held and its update was kept with a positive KL inside the radius.
        for row in agents.values():
            assert row["kept"] and 0 < row["kl"] <= report["radius"]


def test_the_float32_reference_agrees_with_itself_exactly(report):
    """float32 compared with float32: the same computations, so every ratio and cosine is 1 up
    to float64 rounding of the comparison itself, and its KL measured again in float32 (a fresh
    reference pass, the updater's own measurement) equals the KL its update reported."""
    for row in report["seeds"][0]["variants"]["float32"]["agents"].values():
        assert row["gradient"]["cosine"] == pytest.approx(1, abs=1e-12)
        assert row["step"]["cosine"] == pytest.approx(1, abs=1e-12)
        assert row["step"]["norm_ratio"] == pytest.approx(1, abs=1e-12)
        assert row["signal_kept"] == pytest.approx(1, abs=1e-12)
        assert row["kl_in_float32"] == pytest.approx(row["kl"], rel=1e-9)
        assert row["surrogate_in_float32"] == pytest.approx(row["surrogate"], rel=1e-9)


def test_the_summary_averages_the_rows(report):
    summary = report["summary"]
    assert set(summary) == set(VARIANTS)
    rows = report["seeds"][0]["variants"]
    reference = rows["float32"]["agents"]
    for variant in VARIANTS:
        agents = rows[variant]["agents"]
        ratios = [agents[a]["kl"] / reference[a]["kl"] for a in ("0", "1")]
        assert summary[variant]["kl_ratio"] == pytest.approx(sum(ratios) / 2, rel=1e-12)
        kept = [agents[a]["signal_kept"] for a in ("0", "1")]
        assert summary[variant]["signal_kept"] == pytest.approx(sum(kept) / 2, rel=1e-12)
        assert summary[variant]["updates"] == 2
