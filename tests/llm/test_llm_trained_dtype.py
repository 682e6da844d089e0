"""A team is played, evaluated and exported in the precision it trained in: ``dtype = "auto"``
resolves by the machine (bfloat16 on a CPU with AMX, float32 on others), so a run trained
where it chose bfloat16 and loaded where it chooses float32 (or the reverse) must keep its own
(``llm.export.trained_team.with_trained_dtype``, from the run's ``started`` event)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from llm.common.devices import CPU_AUTO_DTYPE_VARIABLE
from llm.export.trained_team import load_team, locate_team
from llm.interface.cli import main


@pytest.fixture(scope="module")
def bfloat16_auto_run(tmp_path_factory) -> Path:
    """The smoke team trained one stage where ``auto`` picks bfloat16 (as on a CPU with AMX):
    in the test's process with the variable that pins the choice set for the run alone (read
    when ``auto`` is resolved), so that every test after it loads where ``auto`` is float32."""
    runs = tmp_path_factory.mktemp("auto-dtype")
    command = ["train", "--config", "smoke", "--output-dir", str(runs), "--name", "run"]
    command += ["--no-progress", "--set", "stage.stages=1", "--set", "run.eval_every=0"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CPU_AUTO_DTYPE_VARIABLE, "bfloat16")
        assert main(command) == 0
    return runs / "run"


def test_a_run_trained_in_bfloat16_under_auto_loads_in_bfloat16_where_auto_is_float32(
    bfloat16_auto_run, tmp_path
):
    assert os.environ[CPU_AUTO_DTYPE_VARIABLE] == "float32"  # this process: auto is float32
    (started,) = [
        json.loads(line)
        for line in (bfloat16_auto_run / "events.jsonl").read_text().splitlines()
        if json.loads(line)["event"] == "started"
    ]
    assert started["dtype"] == "bfloat16"
    assert json.loads((bfloat16_auto_run / "config.json").read_text())["run"]["dtype"] == "auto"
    assert locate_team(bfloat16_auto_run).config.run.dtype == "bfloat16"
    team = load_team(bfloat16_auto_run)
    assert team.team.backbone.model.get_base_model().dtype == torch.bfloat16


def test_a_dtype_the_caller_names_wins_over_the_trained_one(bfloat16_auto_run):
    from llm.common.config import parse_override

    source = locate_team(bfloat16_auto_run, overrides=[parse_override("run.dtype=float32")])
    assert source.config.run.dtype == "float32"
