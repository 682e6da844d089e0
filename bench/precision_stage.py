"""What half precision buys on this machine: one stage in float32 and in bfloat16, side by side.

For each precision, in one process, one thread, one after the other, from the same seeds: the
config's team is built afresh and trains one stage through ``teamtr.run_stage`` (sampling,
updates, certificate), profiled by ``llm.common.profiling`` (exclusive CPU seconds per
section). Printed as ratios to float32: the stage's CPU seconds, CPU seconds per generated
token (the stages need not generate the same tokens: their policies round differently), and
generated tokens per CPU-second of sampling. The same draw's generation alone (the first turn
of the stage's first batch, from the same seed) is timed too, and the raw matrix-product rate
of each precision on one thread (the hardware's ceiling: 2048x576 by 576x1536).

Usage: ``OMP_NUM_THREADS=1 .venv/bin/python bench/precision_stage.py --config default
--json results/precision_stage.json`` (``--dtypes float32 bfloat16 float16``; a dtype may name
its ``[lora] half_precision_sum`` too: ``bfloat16:peft``, ``bfloat16:round_once``; ``--quick``:
the tiny random model, seconds).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import torch

from llm.common import profiling
from llm.common.config import load_config
from llm.training.builder import build
from teamtr.penalty import EpisodicPenalty
from teamtr.stage import run_stage


def matmul_rate(dtype: torch.dtype, repeats: int = 10) -> float:
    """GFLOP/s of one 2048x576 @ 576x1536 product (SmolLM2's MLP shape) on this thread."""
    a = torch.randn(2048, 576).to(dtype)
    b = torch.randn(576, 1536).to(dtype)
    a @ b
    started = time.process_time()
    for _ in range(repeats):
        a @ b
    return 2 * 2048 * 576 * 1536 * repeats / (time.process_time() - started) / 1e9


def one_stage(config, seed: int) -> dict[str, Any]:
    parts = build(config)
    torch.manual_seed(seed)
    with profiling.recording() as profile:
        report, _ = run_stage(
            parts.team,
            parts.sampler,
            parts.updater,
            config.stage,
            EpisodicPenalty(config.sampler.turns),
        )
    sampling = sum(s for name, s in profile.seconds.items() if name.startswith("sampling turn"))
    tokens = sum(r.generated_tokens for r in report.sampled_rollouts)
    mismatch = [
        r.update.mismatch.as_dict()
        for r in report.records
        if getattr(r.update, "mismatch", None) is not None
    ]
    return {
        "cpu_seconds": profile.total_seconds,
        "generated_tokens": tokens,
        "sampling_cpu_seconds": sampling,
        "cpu_seconds_per_token": profile.total_seconds / max(tokens, 1),
        "tokens_per_sampling_cpu_second": tokens / sampling if sampling else None,
        "sections": dict(sorted(profile.seconds.items(), key=lambda kv: -kv[1])),
        "mismatch": mismatch,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="default", help="config file or shipped name")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="the tiny random model")
    parser.add_argument("--json", type=Path, help="write the measurements here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    base = load_config(args.config)
    if args.quick:
        base = dataclasses.replace(
            base, model=dataclasses.replace(base.model, source="tiny", sources=())
        )
    result: dict[str, Any] = {"config": args.config, "source": base.model.source, "dtypes": {}}
    for name in args.dtypes:
        dtype, _, lora_sum = name.partition(":")
        config = dataclasses.replace(base, run=dataclasses.replace(base.run, dtype=dtype))
        if lora_sum:
            lora = dataclasses.replace(base.lora, half_precision_sum=lora_sum)
            config = dataclasses.replace(config, lora=lora)
        row = one_stage(config, args.seed)
        row["matmul_gflops"] = matmul_rate(getattr(torch, dtype))
        result["dtypes"][name] = row
        print(
            f"{name:>9}: stage {row['cpu_seconds']:.1f} CPU-s, {row['generated_tokens']} tokens "
            f"({row['cpu_seconds_per_token'] * 1e3:.1f} ms a token), sampling "
            f"{row['tokens_per_sampling_cpu_second']:.1f} tokens per CPU-s, matmul "
            f"{row['matmul_gflops']:.0f} GFLOP/s",
            flush=True,
        )
    reference = result["dtypes"].get("float32")
    if reference is not None:
        for name, row in result["dtypes"].items():
            row["ratio_to_float32"] = {
                "stage_cpu": row["cpu_seconds"] / reference["cpu_seconds"],
                "cpu_per_token": row["cpu_seconds_per_token"] / reference["cpu_seconds_per_token"],
                "generation_speed": row["tokens_per_sampling_cpu_second"]
                / reference["tokens_per_sampling_cpu_second"],
                "matmul_speed": row["matmul_gflops"] / reference["matmul_gflops"],
            }
            print(f"{name:>9} / float32: {json.dumps(row['ratio_to_float32'])}")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
