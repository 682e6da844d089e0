"""``teamtr train --nproc N`` leaves no ``torchelastic_*`` directory in the system's temporary
directory: the launch runs with a temporary directory of its own, removed afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from llm_test_support import SMOKE

REPO = Path(__file__).resolve().parents[2]


def test_a_launch_leaves_no_temporary_directory_behind(tmp_path):
    system_tmp = tmp_path / "tmp"
    system_tmp.mkdir()
    config = tmp_path / "smoke.toml"
    config.write_text(
        SMOKE.read_text()
        .replace("stages = 2", "stages = 1")
        .replace("[run]\n", f'[run]\noutput_dir = "{tmp_path / "runs"}"\n')
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TMPDIR": str(system_tmp)}
    script = (
        "import sys, tempfile; from llm.training.distributed import launch, launch_temporary_directory\n"
        "with launch_temporary_directory() as d:\n"
        "    assert tempfile.gettempdir() == str(d)\n"
        "    print(d)\n"
        "code = launch(1, sys.argv[1:]); print(tempfile.gettempdir()); raise SystemExit(code)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, "--config", str(config), "--name", "r", "--no-progress"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=tmp_path,
    )
    lines = done.stdout.split()
    assert not Path(lines[0]).exists()  # the launch's own directory is gone
    assert lines[-1] == str(system_tmp)  # and the system's is back
    assert list(system_tmp.iterdir()) == [], done.stderr  # torchrun left nothing there
    assert tempfile.gettempdir() != str(system_tmp)
