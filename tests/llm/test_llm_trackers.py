"""``[run] report_to``: a run logs to TensorBoard and to trackio (the real library, writing to a
temporary ``TRACKIO_DIR``) with the same keys, per stage, per agent and of the evaluation; an
unknown tracker is one error naming the key."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from llm_test_support import TEAMTR
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from llm.common.config import ConfigError, RunConfig, load_config, parse_override
from llm.interface.cli import main

READ = """
import json
from trackio.sqlite_storage import SQLiteStorage
print(json.dumps([SQLiteStorage.get_runs("teamtr"), SQLiteStorage.get_logs("teamtr", "tracked")]))
"""


TRACKIO_MISSING = "[run] report_to: trackio is not installed"
needs_trackio = pytest.mark.skipif(
    importlib.util.find_spec("trackio") is None,
    reason="trackio is not installed (pip install 'teamtr[trackio]')",
)


def tracked_run(tmp_path) -> tuple[dict[str, str], Path, list[str]]:
    """The smoke run both trackers follow, in ``tmp_path``: its environment (trackio's store
    there too), its run directory and ``teamtr``'s arguments for it."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "TRACKIO_DIR": str(tmp_path / "tk")}
    arguments = [
        "train", "--config", "smoke",
        "--set", 'run.report_to=["tensorboard", "trackio"]',
        "--set", f"run.output_dir={json.dumps(str(tmp_path))}",
        "--name", "tracked",
        "--no-progress",
    ]  # fmt: skip
    return environment, tmp_path / "tracked", arguments


def resume_and_read(run_dir, environment) -> tuple[list, list]:
    """``teamtr train --resume`` of ``run_dir`` to its end, then trackio's store read back:
    (the runs it holds, the rows of the run)."""
    resumed = subprocess.run(
        [str(TEAMTR), "train", "--resume", str(run_dir), "--no-progress"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr
    read = subprocess.run(
        [sys.executable, "-c", READ], env=environment, capture_output=True, text=True, timeout=120
    )
    assert read.returncode == 0, read.stderr
    runs, rows = json.loads(read.stdout)
    return runs, rows


@needs_trackio
@pytest.mark.parametrize(
    ("stop", "code"),
    [(signal.SIGINT, 130), (signal.SIGKILL, -signal.SIGKILL)],
    ids=["SIGINT", "SIGKILL"],
)
def test_trackio_and_tensorboard_get_the_same_keys_and_a_resumed_run_goes_on(tmp_path, stop, code):
    """A run stopped once its first stage's checkpoint is written, then resumed: trackio keeps
    one run whose steps carry on (1, then 2: the resumed stage is neither a new run nor a
    second row of step 1), and every row is TensorBoard's points under the same keys. Stopped
    by SIGINT, the run closes its trackers; killed (SIGKILL), it cannot, and the first stage's
    row still reaches both, whether it was stored before the kill or logged again by the
    resumed run (this test does not tell which: the next one holds the scalars on disk before
    the checkpoint is written)."""
    environment, run_dir, arguments = tracked_run(tmp_path)
    process = subprocess.Popen(
        [str(TEAMTR), *arguments],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A shell without job control starts background commands with SIGINT ignored.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 300
    while not (run_dir / "checkpoints" / "stage_1").exists():
        assert process.poll() is None, process.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "the first stage never ended"
        time.sleep(0.01)
    process.send_signal(stop)
    _, err = process.communicate(timeout=300)
    assert process.returncode == code, err
    assert not (run_dir / "checkpoints" / "stage_2").exists(), "interrupted too late"
    runs, rows = resume_and_read(run_dir, environment)
    assert runs == ["tracked"]  # the resumed run went on in the same trackio run
    assert [row["step"] for row in rows] == [1, 2]  # one row per stage, numbered as printed
    board = EventAccumulator(str(run_dir / "tensorboard"))
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
    stages = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    assert [row["eval/accuracy"] for row in rows] == [s["eval"]["accuracy"] for s in stages]


KILLED_AFTER_ITS_CHECKPOINT = """
import json, os, signal, sys, time
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from trackio.sqlite_storage import SQLiteStorage

import llm.training.stages.loop as loop
from llm.interface.cli import main

write_checkpoint = loop.write_checkpoint


def observed(run_dir, point):
    # What the trackers hold of the stages done when their checkpoint is written; then the
    # checkpoint, and a SIGKILL, which closes nothing.
    board = EventAccumulator(str(Path(run_dir) / "tensorboard"))
    board.Reload()
    tags = [t for t in board.Tags()["scalars"] if point.stage in [e.step for e in board.Scalars(t)]]
    deadline = time.monotonic() + 60  # trackio stores what it is handed every 0.5 s
    stored = 0
    while stored < point.stage and time.monotonic() < deadline:
        time.sleep(0.05)
        stored = SQLiteStorage.get_max_step_for_run("teamtr", Path(run_dir).name) or 0
    print(json.dumps({"step": point.stage, "tensorboard": tags, "trackio": stored}), flush=True)
    write_checkpoint(run_dir, point)
    os.kill(os.getpid(), signal.SIGKILL)


loop.write_checkpoint = observed
sys.exit(main(sys.argv[1:]))
"""


@needs_trackio
def test_a_stages_scalars_are_stored_before_its_checkpoint_and_a_resume_logs_none_again(tmp_path):
    """The checkpoint writer observed: when the first stage's checkpoint is written, its
    scalars are already in TensorBoard's event file and in trackio's store (within the 60 s
    trackio may take to store a row it was handed). The run is then killed (SIGKILL): the
    resumed run logs nothing again (trackio's row of step 1 is the one stored before the
    kill) and TensorBoard's points of step 1 are those on disk at the checkpoint."""
    from datetime import UTC, datetime

    environment, run_dir, arguments = tracked_run(tmp_path)
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_AFTER_ITS_CHECKPOINT, *arguments],
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    on_disk = json.loads(killed.stdout.strip().splitlines()[-1])
    assert on_disk["step"] == 1 and (run_dir / "checkpoints" / "stage_1").is_dir()
    assert on_disk["trackio"] == 1, "stage 1's row was not handed to trackio before its checkpoint"
    assert {"stage/train_reward", "agent0/kl", "eval/accuracy"} <= set(on_disk["tensorboard"])
    resumed_at = datetime.now(UTC)
    _, rows = resume_and_read(run_dir, environment)
    assert [row["step"] for row in rows] == [1, 2]
    first_logged = datetime.fromisoformat(rows[0]["timestamp"])
    assert first_logged < resumed_at, "the resumed run logged stage 1 again"
    board = EventAccumulator(str(run_dir / "tensorboard"))
    board.Reload()
    step_one = {t for t in board.Tags()["scalars"] if 1 in [e.step for e in board.Scalars(t)]}
    assert step_one == set(on_disk["tensorboard"])


def test_a_missing_trackio_is_one_error_before_any_stage(tmp_path, capsys, monkeypatch):
    """Without the library (``sys.modules["trackio"] = None``: not importable, not found), a
    new run asking for it is one error line and exit code 2 before its run directory is made;
    a run resumed with it (its recorded ``report_to``) is one error line too, before any
    stage: its metrics and checkpoints as they were."""
    output_dir = json.dumps(str(tmp_path))
    tracked = [
        "--config", "smoke",
        "--set", 'run.report_to=["trackio"]',
        "--set", f"run.output_dir={output_dir}",
    ]  # fmt: skip
    monkeypatch.setitem(sys.modules, "trackio", None)
    assert main(["train", *tracked, "--name", "new", "--no-progress"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and TRACKIO_MISSING in lines[0]
    assert not (tmp_path / "new").exists()

    # A run that asked for trackio on a machine that has it, stopped after its first stage
    # (its last checkpoint gone, as a crash leaves it), resumed on one that has not.
    plain = ["--config", "smoke", "--set", f"run.output_dir={output_dir}"]
    assert main(["train", *plain, "--name", "resumed", "--no-progress"]) == 0
    run_dir = tmp_path / "resumed"
    shutil.rmtree(run_dir / "checkpoints" / "stage_2")
    config = json.loads((run_dir / "config.json").read_text())
    config["run"]["report_to"] = ["trackio"]
    (run_dir / "config.json").write_text(json.dumps(config))
    metrics = (run_dir / "metrics.jsonl").read_bytes()
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir), "--no-progress"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and TRACKIO_MISSING in lines[0]
    assert (run_dir / "metrics.jsonl").read_bytes() == metrics
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["stage_1"]


def test_an_unknown_tracker_names_the_key():
    with pytest.raises(ConfigError, match=r"--set run.report_to: must be a list of distinct"):
        load_config("smoke", [parse_override('run.report_to=["wandb"]')])
    assert load_config("smoke").run.report_to == ("tensorboard",)
    assert load_config("smoke", [parse_override("run.report_to=[]")]).run.report_to == ()


def test_tensorboard_is_the_default_tracker():
    """The code's default (``configs/reference.toml`` writes the same: test_llm_stage_config)."""
    assert RunConfig().run.report_to == ("tensorboard",)
