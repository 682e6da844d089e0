"""The GPU-probe figure is drawn from the committed results, starting at the untrained team."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results" / "gpu_probe"


def test_curves_count_agent_updates_and_start_untrained():
    sys.path.insert(0, str(REPO / "figures"))
    try:
        from plot_gpu_probe import curve
    finally:
        sys.path.remove(str(REPO / "figures"))
    updates, accuracies = curve(RESULTS, "d", "untrained_d.json")
    stages = [json.loads(line) for line in (RESULTS / "d.metrics.jsonl").open()]
    assert updates[0] == 0
    assert accuracies[0] == 100 * json.loads((RESULTS / "untrained_d.json").read_text())["accuracy"]
    assert updates[-1] == sum(len(s["updates"]) for s in stages)  # the last stage evaluates
    assert accuracies[-1] == 100 * stages[-1]["eval"]["accuracy"]


def test_the_script_writes_a_png(tmp_path):
    out = tmp_path / "probe.png"
    script = REPO / "figures" / "plot_gpu_probe.py"
    subprocess.run([sys.executable, str(script), str(RESULTS), str(out)], check=True, cwd=REPO)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
