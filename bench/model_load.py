"""Benchmark: loading SmolLM2 from its GGUF file against loading the folder it was unpacked into.

transformers unpacks a GGUF file on every load; teamtr unpacks it once (``llm.models.
unpacked_gguf``) and loads the folder after. One run, one process, on the CPU clock, alternating
the two ways ``--repeats`` times (the machines are shared and noisy): the model and the
tokenizer each way, the unpacking itself once (into a fresh cache), and the ratios.

    OMP_NUM_THREADS=1 python bench/model_load.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils.quantization_config import GgufConfig

from llm.models.loading import resolve_source
from llm.models.unpacked_gguf import unpacked_folder


def cpu_seconds(action: Callable[[], object]) -> float:
    start = time.process_time()
    action()
    return time.process_time() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="smollm2", help="a GGUF model source")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    resolved = resolve_source(args.source)
    if resolved.gguf_file is None:
        print(f"error: {args.source!r} is not a GGUF source", file=sys.stderr)
        return 2
    gguf = Path(resolved.location) / resolved.gguf_file
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as cache:
        start = time.process_time()
        folder = unpacked_folder(gguf, Path(cache))
        unpacking = time.process_time() - start
        megabytes = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20
        ways = {
            "gguf model": lambda: AutoModelForCausalLM.from_pretrained(
                gguf.parent,
                gguf_file=gguf.name,
                dtype=torch.float32,
                quantization_config=GgufConfig(dequantize=True),
            ),
            "folder model": lambda: AutoModelForCausalLM.from_pretrained(
                folder, dtype=torch.float32
            ),
            "gguf tokenizer": lambda: AutoTokenizer.from_pretrained(
                gguf.parent, gguf_file=gguf.name
            ),
            "folder tokenizer": lambda: AutoTokenizer.from_pretrained(folder),
        }
        times: dict[str, list[float]] = {way: [] for way in ways}
        for _ in range(args.repeats):
            for way, load in ways.items():
                times[way].append(cpu_seconds(load))
    median = {way: statistics.median(seconds) for way, seconds in times.items()}
    figures = {
        "cpu_seconds_median": median,
        "unpacking_cpu_seconds": unpacking,
        "unpacked_folder_mib": megabytes,
        "model_ratio_gguf_to_folder": median["gguf model"] / median["folder model"],
        "tokenizer_ratio_gguf_to_folder": median["gguf tokenizer"] / median["folder tokenizer"],
        "repeats": args.repeats,
    }
    for way, seconds in median.items():
        print(f"{way:>17}: {seconds:7.2f} CPU-s (median of {args.repeats})")
    print(f"{'unpacking once':>17}: {unpacking:7.2f} CPU-s, a folder of {megabytes:.0f} MiB")
    print(
        f"GGUF / folder: model {figures['model_ratio_gguf_to_folder']:.0f}x, "
        f"tokenizer {figures['tokenizer_ratio_gguf_to_folder']:.0f}x"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
