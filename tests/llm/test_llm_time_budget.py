"""`[run] time_budget_minutes`: a run stops after the stage that exhausts its budget, on the
wall clock or on the process's CPU clock, and that stage is evaluated and checkpointed."""

from __future__ import annotations

import json

import pytest
from test_llm_cli import smoke_config

from llm.common.config import ConfigError, load_config
from llm.interface.cli import main


@pytest.mark.parametrize("clock", ["wall", "cpu"])
def test_a_spent_budget_ends_the_run_after_one_stage(tmp_path, clock):
    extra = f'time_budget_minutes = 1e-6\nbudget_clock = "{clock}"\n'
    config = smoke_config(tmp_path, "")
    config.write_text(config.read_text().replace("[run]\n", "[run]\n" + extra))
    assert load_config(config).run.budget_clock == clock
    assert main(["train", "--config", str(config), "--name", "budget", "--no-progress"]) == 0
    run_dir = tmp_path / "runs" / "budget"
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["stage"] for x in lines] == [0]  # the smoke config asks for 2 stages
    assert "eval" in lines[0]
    assert (run_dir / "checkpoints" / "stage_1").is_dir()


def test_unknown_budget_clock_is_rejected(tmp_path):
    config = smoke_config(tmp_path, "")
    config.write_text(config.read_text().replace("[run]\n", '[run]\nbudget_clock = "gpu"\n'))
    with pytest.raises(ConfigError, match="budget_clock"):
        load_config(config)
