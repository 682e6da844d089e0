"""Held-out accuracy of several methods' runs, seeds side by side, at one stage: the table and
figure of docs/environments.md (runs still going are read as far as they got).

Each method is ``NAME=UNTRAINED_EVAL.json:RUN_DIR[,RUN_DIR...]`` (one run directory a seed).
For every run, the held-out evaluation recorded after ``--stage`` stages (``[run]
eval_every``) and the CPU-seconds its stages took to get there; per method, the mean ± standard
error over seeds, beside the untrained team's accuracy (``teamtr eval --config``). A run that
has not reached the stage is listed as such and left out of the mean.

    python -m studies.llm.environments.held_out_at_stage --stage 4 --plot figures/environments.png \\
        --method calculator=results/environments/calculator_untrained.json:runs/env/calculator-s0
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from llm.interface.plot import read_records


def method_rows(untrained: Path, run_dirs: list[Path], stage: int) -> dict[str, Any]:
    """One method's runs at ``stage``: per run its held-out curve, the accuracy after ``stage``
    stages and the CPU-seconds to there; the mean ± standard error of those that got there."""
    runs: list[dict[str, Any]] = []
    for run_dir in run_dirs:
        records = read_records(run_dir / "metrics.jsonl")
        curve = [(r["stage"] + 1, r["eval"]["accuracy"]) for r in records if r.get("eval")]
        reached = [r for r in records if r["stage"] + 1 <= stage]
        at = dict(curve).get(stage)
        runs.append(
            {
                "run": str(run_dir),
                "curve": curve,
                "accuracy": at,
                "cpu_seconds": sum(r["cpu_seconds"] for r in reached) if at is not None else None,
            }
        )
    values: list[float] = [float(r["accuracy"]) for r in runs if r["accuracy"] is not None]
    mean = sum(values) / len(values) if values else None
    se = (
        math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))
        if mean is not None and len(values) > 1
        else None
    )
    return {
        "untrained": json.loads(untrained.read_text())["accuracy"],
        "runs": runs,
        "mean": mean,
        "standard_error": se,
    }


def markdown(table: dict[str, dict[str, Any]], stage: int) -> str:
    lines = [
        f"| method | untrained | after {stage} stages, per seed | mean ± SE | CPU-s to stage {stage} |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, row in table.items():
        per_seed = ", ".join(
            "not yet" if r["accuracy"] is None else f"{100 * r['accuracy']:.0f}%"
            for r in row["runs"]
        )
        mean = "–" if row["mean"] is None else f"{100 * row['mean']:.1f}%"
        if row["standard_error"] is not None:
            mean += f" ± {100 * row['standard_error']:.1f}"
        cpu = ", ".join(f"{r['cpu_seconds']:.0f}" for r in row["runs"] if r["cpu_seconds"])
        lines.append(f"| {name} | {100 * row['untrained']:.0f}% | {per_seed} | {mean} | {cpu} |")
    return "\n".join(lines)


def plot(table: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    for index, (name, row) in enumerate(table.items()):
        color = f"C{index}"
        for k, run in enumerate(row["runs"]):
            stages, accuracy = zip(*[(0, row["untrained"]), *run["curve"]], strict=True)
            axes.plot(
                stages,
                [100 * a for a in accuracy],
                "o-",
                color=color,
                alpha=0.6,
                label=name if k == 0 else None,
            )
    axes.set_xlabel("stages trained")
    axes.set_ylabel("held-out accuracy (%)")
    axes.set_ylim(0, 100)
    axes.legend()
    axes.set_title("each line one seed")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--method",
        action="append",
        required=True,
        help="NAME=UNTRAINED_EVAL.json:RUN_DIR[,RUN_DIR...]",
    )
    parser.add_argument("--stage", type=int, required=True, help="the stage to compare at")
    parser.add_argument("--plot", type=Path, help="the figure (PNG) of every run's curve")
    parser.add_argument("--json", type=Path, help="the table as JSON")
    args = parser.parse_args(argv)
    table = {}
    for spec in args.method:
        name, _, rest = spec.partition("=")
        untrained, _, runs = rest.partition(":")
        if not name or not untrained or not runs:
            parser.error(
                f"--method {spec!r}: expected NAME=UNTRAINED_EVAL.json:RUN_DIR[,RUN_DIR...]"
            )
        table[name] = method_rows(Path(untrained), [Path(r) for r in runs.split(",")], args.stage)
    print(markdown(table, args.stage))
    if args.plot:
        plot(table, args.plot)
    if args.json:
        args.json.write_text(json.dumps(table, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
