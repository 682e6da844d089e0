"""What a held-out pair's dialogues cost by how many are played at once: the measured
certificate's price per pair (docs/measured_certificate.md, "The trend rule on the relay").

For each precision, in one process, one thread: the config's team is built untrained and its
sampler plays batches of fresh coupled held-out dialogues (``new_episodes(rows, 1, coupled=True)``,
one problem each, as the certificate's groups are) to the end, through the sampler's own path
(the question read once per distinct prompt, each row's note, turns and messages its own). The
sizes take turns, ``--repeats`` rounds, after one warm-up play. Printed per size: the median CPU
seconds of a play and per dialogue, and the straight line through the medians, CPU = fixed +
per_dialogue * rows: the fixed part is what the decoding steps cost whatever the batch (each
step runs the model once for every row), the per-dialogue part what each row adds (its tokens
past the shared question, read and generated).

Usage: ``OMP_NUM_THREADS=1 .venv/bin/python bench/held_out_play_cost.py --config default
--json results/measured_certificate/held_out_play_cost.json`` (``--dtypes float32 bfloat16``,
``--rows 16 32 64``; ``--quick``: the tiny random model, seconds).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from llm.common.config import load_config
from llm.training.builder import build


def play_costs(config, rows: list[int], repeats: int) -> dict[int, list[float]]:
    """Per batch size, the CPU seconds of each play (sizes taking turns)."""
    parts = build(config, progress=False)
    sampler, team = parts.sampler, parts.team
    sampler.play(team, sampler.new_episodes(min(rows), 1, True))  # warm-up: first calls
    costs: dict[int, list[float]] = {size: [] for size in rows}
    for _ in range(repeats):
        for size in rows:
            episodes = sampler.new_episodes(size, 1, True)
            started = time.process_time()
            sampler.play(team, episodes)
            costs[size].append(time.process_time() - started)
    sampler.close()
    return costs


def line_through(medians: dict[int, float]) -> tuple[float, float]:
    """Least-squares fixed + per_row * rows through the medians."""
    sizes = np.array(list(medians), dtype=float)
    seconds = np.array(list(medians.values()))
    per_row, fixed = np.polyfit(sizes, seconds, 1)
    return float(fixed), float(per_row)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="default")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="the tiny random model")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if len(set(args.rows)) < 2 or min(args.rows) < 1 or args.repeats < 1:
        parser.error("--rows: at least two distinct sizes >= 1; --repeats >= 1")
    torch.set_num_threads(1)
    report: dict[str, object] = {"config": args.config, "rows": args.rows}
    for dtype in args.dtypes:
        config = load_config(args.config)
        model = config.model if not args.quick else dataclasses.replace(config.model, source="tiny")
        config = dataclasses.replace(
            config, model=model, run=dataclasses.replace(config.run, dtype=dtype, threads=1)
        )
        costs = play_costs(config, args.rows, args.repeats)
        medians = {size: statistics.median(seconds) for size, seconds in costs.items()}
        fixed, per_row = line_through(medians)
        report[dtype] = {
            "plays": {str(size): seconds for size, seconds in costs.items()},
            "median": {str(size): seconds for size, seconds in medians.items()},
            "fixed_seconds": fixed,
            "per_dialogue_seconds": per_row,
        }
        for size, seconds in medians.items():
            print(f"{dtype}: {size} dialogues {seconds:.2f} CPU-s, {seconds / size:.3f} a dialogue")
        print(f"{dtype}: CPU-s = {fixed:.2f} + {per_row:.3f} x dialogues")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
