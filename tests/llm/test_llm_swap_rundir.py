"""`teamtr swap` creates its run directory as a training run does (``llm.training.rundir``): locked,
written whole in a temporary sibling, and absent entirely when a write fails."""

from __future__ import annotations

import errno
import os

import pytest
from test_llm_swap import AGENT, make_run

import llm.interface.swap
from llm.interface.cli import main
from llm.training.runlock import LOCK_FILE, RunLockedError, acquire


@pytest.fixture
def runs(tmp_path):
    return make_run(tmp_path, "current", seed=10), make_run(tmp_path, "other", seed=20)


def swap_argv(runs, out):
    current, other = runs
    return ["swap", "--run", str(current), "--agent", str(AGENT), "--model", str(other)] + [
        "--out",
        str(out),
    ]


def test_the_swapped_run_is_locked_while_written_and_released_after(runs, tmp_path, monkeypatch):
    out = tmp_path / "swapped"
    seen = []
    real = llm.interface.swap.write_checkpoint

    def write_checkpoint(directory, point):
        # Inside the temporary sibling, under the run lock, before the directory appears.
        assert not out.exists() and directory.name.startswith(f".{out.name}.tmp-")
        with pytest.raises(RunLockedError):
            acquire(directory)
        seen.append(directory)
        return real(directory, point)

    monkeypatch.setattr(llm.interface.swap, "write_checkpoint", write_checkpoint)
    assert main(swap_argv(runs, out)) == 0
    assert len(seen) == 1 and not seen[0].exists()
    assert (out / LOCK_FILE).is_file()  # the lock file moved with the directory
    acquire(out).release()  # and was released
    assert {p.name for p in out.iterdir()} >= {"config.json", "checkpoints", "swap.json"}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_failed_write_leaves_no_swapped_run_behind(runs, tmp_path, monkeypatch, capsys):
    out = tmp_path / "swapped"

    def full(directory, point):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory / "state.json"))

    monkeypatch.setattr(llm.interface.swap, "write_checkpoint", full)
    code = main(swap_argv(runs, out))
    err = capsys.readouterr().err
    assert code in (1, 2) and err.startswith("error: ") and err.count("\n") == 1
    assert os.strerror(errno.ENOSPC) in err
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
