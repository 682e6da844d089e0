"""Faults around a run: a second process on the same run directory, a full disk, a deleted
run directory, leftovers of interrupted writes, and resuming what is already finished.

Runs are real `teamtr train` runs of the tiny smoke config (in this process, or as two real
subprocesses for the lock). Disk faults are injected where the checkpoint writer writes its
bytes (``llm.training.checkpoint._write_durably``), as a full or read-only file system would raise them.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from llm_test_support import SMOKE

import llm.training.checkpoint
import llm.training.stages.loop
from llm.interface.cli import main
from llm.training.checkpoint import latest_checkpoint, recover_interrupted_writes
from llm.training.runlock import LOCK_FILE, RunLockedError, acquire

REPO = Path(__file__).resolve().parents[2]


def smoke_config(directory: Path, extra_run: str = "", stages: int = 2) -> Path:
    text = SMOKE.read_text().replace("[run]\n", f'[run]\noutput_dir = "{directory / "runs"}"\n')
    text = text.replace("stages = 2", f"stages = {stages}").replace(
        "[run]\n", f"[run]\n{extra_run}"
    )
    path = directory / "smoke.toml"
    path.write_text(text)
    return path


def events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def one_error_line(err: str) -> str:
    """The one error line of ``err``; before it only the run's warnings may stand (a stage of
    the tiny model whose groups earned equal rewards says so)."""
    *before, last = err.splitlines() or [""]
    assert all(line.startswith("warning: ") for line in before), err
    assert last.startswith("error: ") and err.endswith("\n") and "Traceback" not in err, err
    return last + "\n"


def hidden_leftovers(run_dir: Path) -> list[str]:
    return [p.name for p in run_dir.rglob(".*") if p.name != LOCK_FILE]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("finished")
    config = smoke_config(directory)
    assert main(["train", "--config", str(config), "--name", "done", "--no-progress"]) == 0
    return directory / "runs" / "done"


def copy_of(run_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(run_dir, target)
    return target


# -- the lock ------------------------------------------------------------------------------------
def teamtr(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "teamtr.cli", *args, "--no-progress"],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_second_process_on_a_locked_run_exits_2_naming_the_holder(tmp_path):
    config = smoke_config(tmp_path, stages=5000)  # runs until it is killed
    run_dir = tmp_path / "runs" / "locked"
    first = teamtr("train", "--config", str(config), "--name", "locked")
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "checkpoints" / "stage_1").exists():
            assert first.poll() is None, first.communicate()[1][-2000:]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        second = teamtr("train", "--resume", str(run_dir))
        _, err = second.communicate(timeout=120)
        assert second.returncode == 2
        assert f"in use by process {first.pid}" in one_error_line(err)
        assert first.poll() is None  # the holder runs on, undisturbed
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=60)
    # The dead holder's lock file stays behind but blocks nothing: the kernel released it.
    assert (run_dir / LOCK_FILE).read_text().strip() == str(first.pid)
    lock = acquire(run_dir)
    try:
        assert lock.stale_pid == first.pid
        with pytest.raises(RunLockedError, match=f"in use by process {os.getpid()}"):
            acquire(run_dir)  # another open file description, as another process would have
    finally:
        lock.release()
    acquire(run_dir).release()


# -- faults in the middle of a run ---------------------------------------------------------------
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS], ids=["disk-full", "read-only"])
def test_a_disk_fault_mid_run_ends_with_one_message_a_failed_event_and_exit_1(
    tmp_path, capsys, monkeypatch, code
):
    config = smoke_config(tmp_path, stages=3)
    run_dir = tmp_path / "runs" / "full"
    real_write = llm.training.checkpoint._write_durably

    def write(path: Path, data: bytes) -> None:
        if "stage_2" in str(path) and path.name == "state.json":  # half-way into a checkpoint
            raise OSError(code, os.strerror(code), str(path))
        real_write(path, data)

    monkeypatch.setattr(llm.training.checkpoint, "_write_durably", write)
    assert main(["train", "--config", str(config), "--name", "full", "--no-progress"]) == 1
    err = one_error_line(capsys.readouterr().err)
    assert os.strerror(code) in err and "stopped in stage 2" in err
    assert f"teamtr train --resume {run_dir}" in err and "newest is" in err
    failed = [e for e in events(run_dir) if e["event"] == "failed"]
    assert len(failed) == 1 and failed[0]["stage"] == 1 and failed[0]["checkpoint"] is None
    assert hidden_leftovers(run_dir) == []  # no torn temporary checkpoint
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["stage_1"]

    monkeypatch.setattr(llm.training.checkpoint, "_write_durably", real_write)  # space freed
    assert main(["train", "--resume", str(run_dir), "--no-progress"]) == 0
    assert latest_checkpoint(run_dir).point.finished


def test_a_run_directory_deleted_mid_run_is_not_recreated(tmp_path, capsys, monkeypatch):
    config = smoke_config(tmp_path, stages=3)
    run_dir = tmp_path / "runs" / "deleted"
    real_run_stage = llm.training.stages.loop.run_stage

    def run_stage_then_delete(*args, **kwargs):
        result = real_run_stage(*args, **kwargs)
        if kwargs["stage_index"] == 1:
            shutil.rmtree(run_dir)
        return result

    monkeypatch.setattr(llm.training.stages.loop, "run_stage", run_stage_then_delete)
    assert main(["train", "--config", str(config), "--name", "deleted", "--no-progress"]) == 1
    err = one_error_line(capsys.readouterr().err)
    assert "run directory was deleted during stage 2" in err
    assert not run_dir.exists()


def test_an_unwritable_output_directory_is_found_before_the_model_loads(tmp_path, capsys):
    config = smoke_config(tmp_path)
    (tmp_path / "runs").write_text("a file where the runs should go")
    text = config.read_text().replace('source = "tiny:128x2"', 'source = "/no/such/model.gguf"')
    config.write_text(text)  # were the model loaded first, its error would come first
    assert main(["train", "--config", str(config), "--name", "r", "--no-progress"]) == 2
    err = one_error_line(capsys.readouterr().err)
    assert "[run] output_dir" in err and "is not a directory" in err


# -- leftovers of interrupted writes -------------------------------------------------------------
def test_interrupted_checkpoint_copies_are_used_when_complete_and_removed_otherwise(
    finished_run, tmp_path
):
    run_dir = copy_of(finished_run, tmp_path)
    checkpoints = run_dir / "checkpoints"
    # Killed between write_checkpoint's two renames: stage_2 is only in the .tmp/.old copies.
    shutil.copytree(checkpoints / "stage_2", checkpoints / ".stage_2.old-111")
    os.replace(checkpoints / "stage_2", checkpoints / ".stage_2.tmp-111")
    # Killed in the middle of writing stage_1 again: a torn copy (no manifest) and a stale one.
    shutil.copytree(checkpoints / "stage_1", checkpoints / ".stage_1.tmp-222")
    (checkpoints / ".stage_1.tmp-222" / "manifest.json").unlink()
    shutil.copytree(checkpoints / "stage_1", checkpoints / ".stage_1.old-333")
    (run_dir / ".metrics.jsonl.tmp-444").write_text("half a line")

    done = recover_interrupted_writes(run_dir)
    assert "restored stage_2 from .stage_2.tmp-111" in done
    assert sorted(p.name for p in checkpoints.iterdir()) == ["stage_1", "stage_2"]
    assert hidden_leftovers(run_dir) == []
    assert latest_checkpoint(run_dir).directory == checkpoints / "stage_2"


def test_resume_cleans_up_and_says_a_finished_run_is_complete_before_loading_a_model(
    finished_run, tmp_path, capsys
):
    run_dir = copy_of(finished_run, tmp_path)
    shutil.copytree(run_dir / "checkpoints" / "stage_2", run_dir / "checkpoints" / ".stage_2.tmp-9")
    config = json.loads((run_dir / "config.json").read_text())
    config["model"]["source"] = "/no/such/model.gguf"  # loading it would fail
    (run_dir / "config.json").write_text(json.dumps(config))
    assert main(["train", "--resume", str(run_dir), "--no-progress"]) == 0
    assert "already complete after 2 stages ([stage] stages = 2); nothing to do" in (
        capsys.readouterr().out
    )
    assert hidden_leftovers(run_dir) == []
    recovered = [e for e in events(run_dir) if e["event"] == "recovered"]
    assert recovered and "removed .stage_2.tmp-9" in recovered[-1]["actions"]


def test_a_finished_run_given_more_stages_goes_on_and_one_given_fewer_says_so(
    finished_run, tmp_path, capsys
):
    run_dir = copy_of(finished_run, tmp_path)
    more = ["train", "--resume", str(run_dir), "--no-progress", "--set", "stage.stages=3"]
    assert main(more) == 0
    stages = [json.loads(line)["stage"] for line in (run_dir / "metrics.jsonl").open()]
    assert [s for s in stages if s is not None][-3:] == [0, 1, 2]
    assert (run_dir / "checkpoints" / "stage_3").is_dir()
    assert json.loads((run_dir / "config.json").read_text())["stage"]["stages"] == 3
    capsys.readouterr()
    fewer = ["train", "--resume", str(run_dir), "--no-progress", "--set", "stage.stages=2"]
    assert main(fewer) == 0
    said = capsys.readouterr().out
    assert "already complete after 3 stages ([stage] stages = 2)" in said
    assert "`--set stage.stages=4` or more continues it" in said


def test_a_finished_run_out_of_time_names_the_budget_that_continues_it(
    finished_run, tmp_path, capsys
):
    run_dir = copy_of(finished_run, tmp_path)
    config = json.loads((run_dir / "config.json").read_text())
    config["stage"]["stages"] = 5  # stopped by the budget below before its stages
    config["run"]["time_budget_minutes"] = 1e-6
    (run_dir / "config.json").write_text(json.dumps(config))
    assert main(["train", "--resume", str(run_dir), "--no-progress"]) == 0
    assert "its time budget of 1e-06 minutes spent" in capsys.readouterr().out


def test_eval_records_the_checkpoint_it_used_after_a_fallback(finished_run, tmp_path, capsys):
    run_dir = copy_of(finished_run, tmp_path)
    (run_dir / "checkpoints" / "stage_2" / "agent0.safetensors").write_bytes(b"corrupt")
    out = tmp_path / "eval.json"
    assert main(["eval", "--run", str(run_dir), "--json", str(out), "--no-progress"]) == 0
    result = json.loads(out.read_text())
    assert result["checkpoint"] == "stage_1"
    assert result["skipped_checkpoints"][0].startswith("stage_2: ")
    assert result["run"] == str(run_dir)


def test_eval_results_that_cannot_be_written_exit_1_and_are_printed(
    finished_run, tmp_path, capsys, monkeypatch
):
    def full(path: Path, data: bytes) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(llm.training.checkpoint, "_write_durably", full)
    out = tmp_path / "eval.json"
    assert main(["eval", "--run", str(finished_run), "--json", str(out), "--no-progress"]) == 1
    err = one_error_line(capsys.readouterr().err)
    assert f"--json {out}: cannot write the results: No space left on device" in err
    assert '"checkpoint": "stage_2"' in err  # the evaluation is not lost
    assert list(tmp_path.iterdir()) == []  # nor is half a file left
