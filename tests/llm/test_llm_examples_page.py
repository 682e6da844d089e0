"""docs/examples/README.md as printed: its ``--check`` commands pass as written (they load no
real model), and its Python block trains the per-turn task through ``run_stage`` (on the tiny
model in place of SmolLM2)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "examples" / "README.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(), re.DOTALL)


def run(arguments: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        arguments, cwd=ROOT, capture_output=True, text=True, timeout=600, env=environment
    )


def test_the_check_commands_of_the_page_pass_as_written(monkeypatch, capsys):
    """Through the console script's function, from the checkout's root, in this process."""
    from teamtr.cli import main

    checks = [
        line.split()
        for block in blocks("bash")
        for line in block.splitlines()
        if line.startswith("teamtr train") and line.endswith("--check")
    ]
    assert len(checks) == 2
    monkeypatch.chdir(ROOT)
    for command in checks:
        capsys.readouterr()
        assert main(command[1:]) == 0, (command, capsys.readouterr().err[-2000:])
        assert "dialogues played on a tiny random model" in capsys.readouterr().out


def test_the_python_block_trains_the_per_turn_task(tmp_path):
    (code,) = blocks("python")
    assert code.count('source="smollm2"') == 1
    tiny = code.replace('source="smollm2"', 'source="tiny", prompts_per_batch=2, group_size=2')
    out = run([sys.executable, "-c", tiny + "\nprint(len(report.records))\n"], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "3"  # one update per agent of the three
