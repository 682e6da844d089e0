"""What ``[sampler] draw = "inverse_cdf"`` saves: the config's batches played both ways, side by
side.

For each precision and draw, in one process, one thread: the config's team is built with that
draw, and its sampler plays ``--repeats`` batches of the config's problems to the end (every
turn, through the sampler's own path: each group's prompt read once, kept keys and values),
the draws alternating and each repeat from the same seed for both. The draws give other
samples and so other lengths: the measure is generated tokens per CPU-second of sampling, and
the CPU per generation step (each step draws one token for every row of a call; prefill
included). Printed as the ratio inverse_cdf / multinomial per precision, and bfloat16's
sampling speed against float32's under each draw.

Usage: ``OMP_NUM_THREADS=1 .venv/bin/python bench/sampling_draw.py --config default
--json results/sampling_draw.json`` (``--dtypes float32 bfloat16``; ``--quick``: the tiny
random model, seconds).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

import torch

from llm.common import profiling
from llm.common.config import load_config
from llm.engines.hf.draw import DRAWS
from llm.training.builder import build


def timed_batches(config, repeats: int) -> dict[str, list[dict[str, float]]]:
    """Per draw, one record per repeat: CPU seconds, generation steps, generated tokens."""
    built = {
        draw: build(
            dataclasses.replace(config, sampler=dataclasses.replace(config.sampler, draw=draw))
        )
        for draw in DRAWS
    }
    measured: dict[str, list[dict[str, float]]] = {draw: [] for draw in DRAWS}
    for repeat in range(repeats):
        order = DRAWS if repeat % 2 == 0 else DRAWS[::-1]  # neither always runs first
        for draw in order:
            parts = built[draw]
            episodes = parts.sampler.new_episodes()
            with profiling.recording() as profile:
                _, tokens = parts.sampler.play(parts.team, episodes, seed=1000 + repeat)
            measured[draw].append(
                {
                    "cpu_seconds": profile.total_seconds,
                    "steps": profile.counts["generation steps"],
                    "tokens": tokens,
                }
            )
    return measured


def summary(records: list[dict[str, float]]) -> dict[str, float]:
    cpu = sum(r["cpu_seconds"] for r in records)
    return {
        "ms_per_step": 1e3 * cpu / sum(r["steps"] for r in records),
        "tokens_per_cpu_second": sum(r["tokens"] for r in records) / cpu,
        "median_ms_per_step": statistics.median(
            1e3 * r["cpu_seconds"] / r["steps"] for r in records
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="default", help="config file or shipped name")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=4, help="batches per draw and precision")
    parser.add_argument("--quick", action="store_true", help="the tiny random model")
    parser.add_argument("--json", type=Path, help="write the measurements here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    base = load_config(args.config)
    if args.quick:
        base = dataclasses.replace(
            base, model=dataclasses.replace(base.model, source="tiny", sources=())
        )
    result: dict[str, Any] = {
        "config": args.config,
        "source": base.model.source,
        "repeats": args.repeats,
        "dtypes": {},
    }
    for dtype in args.dtypes:
        config = dataclasses.replace(base, run=dataclasses.replace(base.run, dtype=dtype))
        measured = timed_batches(config, args.repeats)
        entry: dict[str, Any] = {draw: summary(measured[draw]) for draw in DRAWS}
        entry["runs"] = measured
        entry["inverse_cdf_over_multinomial"] = {
            "cpu_per_step": entry["inverse_cdf"]["ms_per_step"]
            / entry["multinomial"]["ms_per_step"],
            "tokens_per_cpu_second": entry["inverse_cdf"]["tokens_per_cpu_second"]
            / entry["multinomial"]["tokens_per_cpu_second"],
        }
        result["dtypes"][dtype] = entry
        for draw in DRAWS:
            print(
                f"{dtype:>9} {draw:>11}: {entry[draw]['ms_per_step']:.1f} ms a step, "
                f"{entry[draw]['tokens_per_cpu_second']:.1f} tokens per CPU-s",
                flush=True,
            )
        print(f"{dtype:>9} inverse_cdf / multinomial: {entry['inverse_cdf_over_multinomial']}")
    reference = result["dtypes"].get("float32")
    if reference is not None:
        for dtype, entry in result["dtypes"].items():
            entry["sampling_speed_over_float32"] = {
                draw: entry[draw]["tokens_per_cpu_second"]
                / reference[draw]["tokens_per_cpu_second"]
                for draw in DRAWS
            }
            print(f"{dtype:>9} / float32, tokens per CPU-s: {entry['sampling_speed_over_float32']}")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
