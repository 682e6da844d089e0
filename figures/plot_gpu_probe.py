"""Draw the held-out learning curves of the one-GPU probe (docs/teams_that_learn.md).

Usage: python figures/plot_gpu_probe.py results/gpu_probe figures/gpu_probe.png

Reads ``<run>.metrics.jsonl`` (``teamtr train`` output, one line per stage) and the untrained
evaluations ``untrained_d.json`` (the 2-agent arithmetic team) and ``untrained_grpo.json`` (one
agent, one turn), and plots greedy held-out accuracy against agent updates.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from studies.figures import save_figure
from studies.llm.run_records import held_out

# run -> (label, untrained evaluation it starts from: None where it is another question set)
RUNS = {
    "d": ("teamtr team", "untrained_d.json"),
    "stale": ("stale team", "untrained_d.json"),
    "shared": ("shared adapter", "untrained_d.json"),
    "lr5": ("teamtr team, lr 5e-4", "untrained_d.json"),
    "r03": ("teamtr team, lr 5e-4, radius 0.3", "untrained_d.json"),
    "grpo": ("one-turn GRPO", "untrained_grpo.json"),
}
MIXED = {"arith_teamtr": "teamtr team", "arith_grpo": "one-turn GRPO"}


def curve(folder: Path, run: str, untrained: str | None) -> tuple[list[int], list[float]]:
    stages = [json.loads(line) for line in (folder / f"{run}.metrics.jsonl").open()]
    points = [(0, held_out(json.loads((folder / untrained).read_text())))] if untrained else []
    updates = 0
    for stage in stages:
        updates += len(stage["updates"])
        if "eval" in stage:
            points.append((updates, held_out(stage["eval"])))
    return [u for u, _ in points], [100 * a for _, a in points]


def main(folder: Path, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (plain, mixed) = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    for run, (label, untrained) in RUNS.items():
        plain.plot(*curve(folder, run, untrained), "o-", markersize=3, label=label)
    for run, label in MIXED.items():
        mixed.plot(*curve(folder, run, None), "o-", markersize=3, label=label)
    plain.set_title("plain questions (200 held out), untrained at 0")
    mixed.set_title("mixed phrasings (100 held out; untrained 4%)")
    for axis in (plain, mixed):
        axis.set_xlabel("agent updates")
        axis.legend(fontsize=8)
    plain.set_ylabel("greedy held-out accuracy (%)")
    return save_figure(figure, out)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(f"wrote {main(Path(sys.argv[1]), Path(sys.argv[2]))}")
