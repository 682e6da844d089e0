"""``[run] report_to``: a run logs to TensorBoard and to trackio (the real library, writing to a
temporary ``TRACKIO_DIR``) with the same keys, per stage, per agent and of the evaluation; an
unknown tracker is one error naming the key."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from llm.common.config import ConfigError, load_config, parse_override

TEAMTR = Path(sys.executable).with_name("teamtr")
READ = """
import json
from trackio.sqlite_storage import SQLiteStorage
print(json.dumps(SQLiteStorage.get_logs("teamtr", "tracked")))
"""


@pytest.mark.skipif(
    importlib.util.find_spec("trackio") is None,
    reason="trackio is not installed (pip install 'teamtr[trackio]')",
)
def test_trackio_and_tensorboard_get_the_same_keys(tmp_path):
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "TRACKIO_DIR": str(tmp_path / "tk")}
    done = subprocess.run(
        [
            str(TEAMTR),
            "train",
            "--config",
            "smoke",
            "--set",
            "stage.stages=2",
            "--set",
            'run.report_to=["tensorboard", "trackio"]',
            "--set",
            f"run.output_dir={json.dumps(str(tmp_path))}",
            "--name",
            "tracked",
            "--no-progress",
        ],  # fmt: skip
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    read = subprocess.run(
        [sys.executable, "-c", READ], env=environment, capture_output=True, text=True, timeout=120
    )
    assert read.returncode == 0, read.stderr
    rows = json.loads(read.stdout)
    assert [row["step"] for row in rows] == [1, 2]  # one row per stage, numbered as printed
    (events,) = (tmp_path / "tracked" / "tensorboard").glob("events.out.tfevents.*")
    board = EventAccumulator(str(events))
    board.Reload()
    for row in rows:
        tags = {key for key in row if key not in ("step", "timestamp")}
        assert tags <= set(board.Tags()["scalars"])
        assert {"stage/train_reward", "agent0/kl", "agent1/kl", "eval/accuracy"} <= tags
        for tag in tags:
            (point,) = [e for e in board.Scalars(tag) if e.step == row["step"]]
            assert row[tag] == pytest.approx(point.value, rel=1e-6)
    logged = {key for row in rows for key in row if key not in ("step", "timestamp")}
    assert logged == set(board.Tags()["scalars"])
    stages = [json.loads(line) for line in (tmp_path / "tracked" / "metrics.jsonl").open()]
    assert [row["eval/accuracy"] for row in rows] == [s["eval"]["accuracy"] for s in stages]


def test_an_unknown_tracker_names_the_key():
    with pytest.raises(ConfigError, match=r"--set run.report_to: must be a list of distinct"):
        load_config("smoke", [parse_override('run.report_to=["wandb"]')])
    assert load_config("smoke").run.report_to == ("tensorboard",)
    assert load_config("smoke", [parse_override("run.report_to=[]")]).run.report_to == ()


def test_reference_names_report_to():
    reference = Path(__file__).resolve().parents[2] / "llm" / "configs" / "reference.toml"
    assert 'report_to = ["tensorboard"]' in reference.read_text()
