"""Sampling engines side by side: Hugging Face ``generate`` in process ("hf") against a vLLM
server with one LoRA adapter per agent ("vllm"), on the default team.

For each engine, on the same team, problems and settings (the default relay on SmolLM2-135M,
float32, one thread each):

1. tokens per CPU-second of rollouts: ``DialogueSampler.sample`` repeated ``--draws`` times,
   generated tokens over the CPU time they took, teamtr's process and (for "vllm") every process
   of the server's group together (read from /proc), and the wall time;
2. one stage of the default scheme (TeamTR: a draw before each of the two agent updates), its
   CPU time, teamtr's and the server's, and its wall time.

The server's start (writing the base folder once, loading it, warming up) is reported on its
own line, not charged to either measure. The two engines take turns (hf, vllm, hf, vllm, ...)
so that load on the machine hits them alike.

Usage: ``.venv/bin/python bench/engine_throughput.py [--source smollm2] [--draws 3]
[--device cpu|cuda] [--json results/engine_throughput.json]`` (needs ``make vllm``;
``bench/gpu_check.sh`` runs it on a GPU where vLLM is installed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from llm.common.config import load_config, parse_override
from llm.engines.vllm.client import VLLMEngine
from llm.training.builder import Components, build
from teamtr.config import StageConfig
from teamtr.penalty import EpisodicPenalty
from teamtr.stage import run_stage

TICKS = os.sysconf("SC_CLK_TCK")


def group_cpu_seconds(group: int | None) -> float:
    """User + system CPU seconds of every live process in process group ``group``."""
    if group is None:
        return 0.0
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group:  # pgrp
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICKS


def cpu_now(parts: Components) -> float:
    engine = parts.sampler.engine
    server = engine.server if isinstance(engine, VLLMEngine) else None
    return time.process_time() + group_cpu_seconds(server.server_pid if server else None)


def build_parts(
    source: str, engine: str, seed: int, device: str
) -> tuple[Components, float, float]:
    """The default run's parts with ``engine``; and the CPU and wall seconds its start took."""
    overrides = [
        f"model.source={source}",
        f"run.device={device}",
        f"sampler.engine={engine}",
        "run.dtype=float32",
        "run.threads=1",
        f"run.seed={seed}",
        "sampler.signal_groups=0",  # every draw the same size: tokens per draw comparable
    ]
    if engine == "vllm" and device != "cpu":  # the GPU is shared with training
        overrides.append("sampler.engine_args=--gpu-memory-utilization 0.3")
    config = load_config("default", [parse_override(o) for o in overrides])
    started, wall = time.process_time(), time.perf_counter()
    parts = build(config, progress=False)
    return parts, cpu_now(parts) - started, time.perf_counter() - wall


def measure_draws(parts: Components, draws: int) -> dict[str, float]:
    tokens, cpu, wall = 0, 0.0, 0.0
    for _ in range(draws):
        before, clock = cpu_now(parts), time.perf_counter()
        rollouts = parts.sampler.sample(parts.team)
        cpu += cpu_now(parts) - before
        wall += time.perf_counter() - clock
        tokens += rollouts.generated_tokens
    return {
        "tokens": tokens,
        "cpu_seconds": cpu,
        "wall_seconds": wall,
        "tokens_per_cpu_second": tokens / cpu,
        "tokens_per_second": tokens / wall,
    }


def measure_stage(parts: Components) -> dict[str, float]:
    torch.manual_seed(0)
    before, clock = cpu_now(parts), time.perf_counter()
    report, _ = run_stage(
        parts.team,
        parts.sampler,
        parts.updater,
        StageConfig(scheme="teamtr", radius=parts.config.stage.radius, order="fixed"),
        EpisodicPenalty(parts.config.sampler.turns),
    )
    gaps = [r.update.mismatch.max_gap for r in report.records if r.update.mismatch is not None]
    return {
        "cpu_seconds": cpu_now(parts) - before,
        "wall_seconds": time.perf_counter() - clock,
        "updates_checked": len(gaps),
        "largest_mismatch_gap": max(gaps, default=0.0),
    }


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default="smollm2")
    parser.add_argument("--draws", type=int, default=3)
    parser.add_argument("--json", default=None)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda where a GPU is lent")
    args = parser.parse_args()
    torch.set_num_threads(1)
    engines = ("hf", "vllm")
    parts, start = {}, {}
    for engine in engines:
        built, cpu, wall = build_parts(args.source, engine, seed=0, device=args.device)
        parts[engine] = built
        start[engine] = {"cpu_seconds": cpu, "wall_seconds": wall}
    try:
        for engine in engines:  # warm-up: first merges, first adapter loads, first prefills
            parts[engine].sampler.sample(parts[engine].team)
        draws = {engine: measure_draws(parts[engine], args.draws) for engine in engines}
        stage = {engine: measure_stage(parts[engine]) for engine in engines}
    finally:
        for built in parts.values():
            built.sampler.close()
    settings = parts["hf"].config.sampler
    result = {
        "command": "OMP_NUM_THREADS=1 .venv/bin/python bench/engine_throughput.py "
        f"--source {args.source} --draws {args.draws} --device {args.device}",
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "model": args.source,
        "device": args.device,
        "dtype": "float32",
        "threads": 1,
        "batch": {
            "dialogues": settings.prompts_per_batch * settings.group_size,
            "turns": settings.turns,
            "max_new_tokens": list(settings.max_new_tokens)
            if isinstance(settings.max_new_tokens, tuple)
            else settings.max_new_tokens,
        },
        "start": start,
        "draws": draws,
        "stage": stage,
        "ratio_tokens_per_cpu_second_vllm_over_hf": draws["vllm"]["tokens_per_cpu_second"]
        / draws["hf"]["tokens_per_cpu_second"],
        "ratio_stage_cpu_vllm_over_hf": stage["vllm"]["cpu_seconds"] / stage["hf"]["cpu_seconds"],
    }
    print(f"engines on {result['cpu']}, {args.source}, float32, one thread each")
    print(f"{'':28}{'hf':>12}{'vllm':>12}{'vllm / hf':>12}")
    for label, key, table in (
        ("tokens per CPU-second", "tokens_per_cpu_second", draws),
        ("tokens per second (wall)", "tokens_per_second", draws),
        ("a stage's CPU seconds", "cpu_seconds", stage),
        ("a stage's wall seconds", "wall_seconds", stage),
    ):
        hf, vllm = table["hf"][key], table["vllm"][key]
        print(f"{label:28}{hf:12.1f}{vllm:12.1f}{vllm / hf:12.2f}")
    print(
        f"start (base folder, server ready): hf {start['hf']['wall_seconds']:.0f} s, "
        f"vllm {start['vllm']['wall_seconds']:.0f} s wall"
    )
    print(f"largest mismatch gap of a vllm update: {stage['vllm']['largest_mismatch_gap']:.2e}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
