"""Every run that starts ends with an event saying how: "finished" (its final metrics and
checkpoint) or "failed" (its one error line); a TensorBoard write that fails in its own thread
(a full disk) ends the run with that one line too, without the thread's traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from llm_test_support import SMOKE

import llm.training.stages.loop
from llm.interface.cli import main

REPO = Path(__file__).resolve().parents[2]


def smoke_config(tmp_path: Path) -> Path:
    config = tmp_path / "smoke.toml"
    config.write_text(
        SMOKE.read_text().replace("[run]\n", f'[run]\noutput_dir = "{tmp_path / "runs"}"\n')
    )
    return config


def events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def test_a_finished_run_says_so_with_its_metrics_and_checkpoint(tmp_path, capsys):
    config = smoke_config(tmp_path)
    assert main(["train", "--config", str(config), "--name", "r", "--no-progress"]) == 0
    run_dir = tmp_path / "runs" / "r"
    logged = events(run_dir)
    assert [e["event"] for e in logged] == ["started", "finished"]
    finished = logged[-1]
    assert finished["stages"] == 2
    assert Path(finished["checkpoint"]) == run_dir / "checkpoints" / "stage_2"
    assert Path(finished["checkpoint"]).is_dir()
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert finished["metrics"]["train_reward"] == last["train_reward"]
    assert finished["metrics"]["eval"] == last["eval"]


def test_a_run_stopped_by_a_bug_logs_a_failed_event_with_its_error(tmp_path, capsys, monkeypatch):
    config = smoke_config(tmp_path)

    def broken(*args, **kwargs):
        raise RuntimeError("the stage loop broke\nsecond line")

    monkeypatch.setattr(llm.training.stages.loop, "run_stage", broken)
    with pytest.raises(RuntimeError, match="the stage loop broke"):
        main(["train", "--config", str(config), "--name", "r", "--no-progress"])
    logged = events(tmp_path / "runs" / "r")
    assert [e["event"] for e in logged] == ["started", "failed"]
    assert logged[-1]["error"] == "RuntimeError: the stage loop broke"


FULL_TENSORBOARD = """
import errno, os, sys
from tensorboard.summary.writer import record_writer

real = record_writer.RecordWriter.write
calls = [0]

def write(self, data):
    calls[0] += 1
    if calls[0] > 12:  # the file version and the first stage's scalars get through
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return real(self, data)

record_writer.RecordWriter.write = write
from llm.interface.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


def test_a_full_disk_under_tensorboard_ends_the_run_with_one_error_line(tmp_path):
    config = smoke_config(tmp_path)
    config.write_text(config.read_text().replace("stages = 2", "stages = 4"))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", FULL_TENSORBOARD, "train", "--config", str(config)]
        + ["--name", "r", "--no-progress"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: "), done.stderr
    assert "Traceback" not in done.stderr and "Exception in thread" not in done.stderr
    assert os.strerror(28) in done.stderr and "--resume" in done.stderr
    failed = events(tmp_path / "runs" / "r")[-1]
    assert failed["event"] == "failed" and os.strerror(28) in failed["error"]
