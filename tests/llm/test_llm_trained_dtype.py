"""A team is played, evaluated and exported in the precision it trained in: ``dtype = "auto"``
resolves by the machine (bfloat16 on a CPU with AMX, float32 on others), so a run trained
where it chose bfloat16 and loaded where it chooses float32 (or the reverse) must keep its own
(``llm.export.trained_team.with_trained_dtype``, from the run's ``started`` event)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from llm.common.devices import CPU_AUTO_DTYPE_VARIABLE
from llm.export.trained_team import load_team, locate_team

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bfloat16_auto_run(tmp_path_factory) -> Path:
    """The smoke team trained one stage where ``auto`` picks bfloat16 (as on a CPU with AMX)."""
    runs = tmp_path_factory.mktemp("auto-dtype")
    environment = {**os.environ, CPU_AUTO_DTYPE_VARIABLE: "bfloat16", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "llm.interface.cli", "train", "--config", "smoke"]
    command += ["--output-dir", str(runs), "--name", "run", "--no-progress"]
    command += ["--set", "stage.stages=1", "--set", "run.eval_every=0"]
    subprocess.run(command, cwd=REPO, env=environment, check=True, capture_output=True)
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
