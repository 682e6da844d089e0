"""Data-parallel throughput on the CPU: one process against N processes, side by side in one run.

Both runs train the same config with ``rollout_shards = N`` (so they sample exactly the same
episodes, ``llm.training.distributed``) and one torch thread per process, evaluation off. For each it
reports the stage wall times as rank 0 logged them, the generated tokens, and tokens per second
of stage time; the ratio N-process / 1-process is the data-parallel speed-up. Process start-up
(imports, model load) is reported apart, since it does not grow with the number of stages.

Usage: ``.venv/bin/python bench/data_parallel.py [--source smollm2] [--nproc 2] [--stages 2]
[--json results/data_parallel_cpu.json]``. On a machine whose cores are shared the ratio moves
with the load: the JSON records ``os.getloadavg()`` before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CONFIG = """extends = "{default}"
[model]
source = "{source}"
[sampler]
prompts_per_batch = {prompts}
group_size = 4
turns = 3
max_new_tokens = 16
[stage]
stages = {stages}
update_order = "fixed"
[run]
output_dir = "{runs}"
eval_every = 0
checkpoint_every = 0
threads = 1
rollout_shards = {shards}
device = "cpu"
"""


def run(config: Path, name: str, nproc: int) -> dict[str, float]:
    command = [sys.executable, "-m", "teamtr", "train", "--config", str(config), "--name", name]
    command.append("--no-progress")
    if nproc > 1:
        command += ["--nproc", str(nproc)]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    subprocess.run(command, cwd=REPO, env=environment, check=True, capture_output=True)
    total = time.perf_counter() - started
    run_dir = config.parent / "runs" / name
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    stage_seconds = sum(r["wall_seconds"] for r in records)
    tokens = sum(r["generated_tokens"] for r in records)
    return {
        "processes": float(nproc),
        "stage_seconds": stage_seconds,
        "generated_tokens": float(tokens),
        "tokens_per_stage_second": tokens / stage_seconds,
        "total_seconds": total,
        "startup_and_teardown_seconds": total - stage_seconds,
        "per_stage_seconds": [r["wall_seconds"] for r in records],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="smollm2")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=4, help="prompts_per_batch")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        config = Path(scratch) / "data_parallel.toml"
        config.write_text(
            CONFIG.format(
                default=REPO / "configs" / "reference.toml",
                source=args.source,
                prompts=args.prompts,
                stages=args.stages,
                runs=Path(scratch) / "runs",
                shards=args.nproc,
            )
        )
        load_before = os.getloadavg()
        one = run(config, "one_process", 1)
        many = run(config, f"{args.nproc}_processes", args.nproc)
        load_after = os.getloadavg()
    report = {
        "source": args.source,
        "config": {"prompts_per_batch": args.prompts, "group_size": 4, "stages": args.stages},
        "cpu_count": os.cpu_count(),
        "load_average_before": list(load_before),
        "load_average_after": list(load_after),
        "one_process": one,
        f"{args.nproc}_processes": many,
        "same_tokens": one["generated_tokens"] == many["generated_tokens"],
        "ratio_throughput": many["tokens_per_stage_second"] / one["tokens_per_stage_second"],
        "ratio_stage_time": one["stage_seconds"] / many["stage_seconds"],
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
