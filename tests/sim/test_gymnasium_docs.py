"""docs/gymnasium.md shows what its example scripts print, line for line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "gymnasium.md"
QUICK_EXAMPLES = ("docs/examples/frozen_lake.py", "docs/examples/tabular_refusals.py")
"""The examples that run in a few seconds (the per-seed Taxi follow-up takes a minute)."""


def shown_runs() -> dict[str, tuple[list[str], str]]:
    """script -> (python options, the output printed under its command in the page)."""
    blocks = re.findall(r"```\n\$ \.venv/bin/python (.*?)\n(.*?)```", PAGE.read_text(), re.DOTALL)
    runs = {}
    for command, output in blocks:
        words = command.split()
        scripts = [word for word in words if word.endswith(".py")]
        if scripts:  # not `python -m ...`
            runs[scripts[0]] = (words[: words.index(scripts[0])], output)
    return runs


@pytest.mark.parametrize("script", QUICK_EXAMPLES)
def test_example_prints_what_the_page_shows(script: str) -> None:
    options, shown = shown_runs()[script]
    out = subprocess.run(
        [sys.executable, *options, script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout == shown
