"""Progress on a pseudo-terminal: a bar where the terminal has a width, plain stage lines on
one that reports a size of 0x0 (``script``, some CI runners), never nothing."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
from llm_test_support import SMOKE

REPO = Path(__file__).resolve().parents[2]


def train_on_terminal(tmp_path: Path, rows: int, columns: int) -> str:
    """Run the smoke config with stdout and stderr on a pseudo-terminal of this size."""
    config = tmp_path / "smoke.toml"
    config.write_text(
        SMOKE.read_text().replace("[run]\n", f'[run]\noutput_dir = "{tmp_path / "runs"}"\n')
    )
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llm.interface.cli",
            "train",
            "--config",
            str(config),
            "--name",
            "r",
        ],
        stdout=follower,
        stderr=follower,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=tmp_path,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the follower side closed: the process is done
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert process.wait(timeout=300) == 0
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.skipif(not hasattr(termios, "TIOCSWINSZ"), reason="no pseudo-terminals here")
def test_a_terminal_of_size_zero_gets_stage_lines(tmp_path):
    out = train_on_terminal(tmp_path, 0, 0)
    assert "teamtr stage 1/2: reward" in out and "teamtr stage 2/2: reward" in out
    assert "run directory:" in out


@pytest.mark.skipif(not hasattr(termios, "TIOCSWINSZ"), reason="no pseudo-terminals here")
def test_a_terminal_with_a_width_gets_a_bar(tmp_path):
    out = train_on_terminal(tmp_path, 24, 100)
    assert "teamtr stages" in out and "\r" in out  # tqdm's bar, redrawn in place
    assert "teamtr stage 1/2: reward" not in out
