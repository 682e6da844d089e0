"""What half precision buys on this machine: one stage in float32 and in bfloat16, side by side.

For each precision, in one process, one thread, one after the other, from the same seeds: the
config's team is built afresh and trains one stage through ``teamtr.run_stage`` (sampling,
updates, certificate), profiled by ``llm.common.profiling`` (exclusive CPU seconds per
section). Printed as ratios to float32: the stage's CPU seconds, CPU seconds per generated
token (the stages need not generate the same tokens: their policies round differently), and
generated tokens per CPU-second of sampling. The raw matrix-product rate of each precision on
one thread is measured too (the hardware's ceiling: 2048x576 by 576x1536).

The stage is also cut into the parts that half precision treats differently
(``stage_sections``): the output head, attention, the casts between the float32 stream of the
float32 LoRA sum and each half-precision product, the decoder's products with the base
weights (``torch.nn.functional.linear`` on a weight wider than a LoRA rank: the part AMX
speeds up), the rest of the decoder (norms, element-wise work, residual adds, the LoRA
branches: what stays float32 around the products), the draw of each token (softmax and
multinomial), generation's own loop, and the same parts in the training passes (scoring) and their backward pass, each in sampling
and in training. ``--repeat R`` runs the precisions R times, alternating, and gives each ratio's
median and range over the R rounds.

Usage: ``OMP_NUM_THREADS=1 .venv/bin/python bench/precision_stage.py --config default
--json results/precision_stage.json`` (``--dtypes float32 bfloat16 float16``; a dtype may name
its ``[lora] half_precision_sum`` too: ``bfloat16:peft``, ``bfloat16:round_once``, and options
of ``llm.models.precision``: ``bfloat16+attention`` (attention in bfloat16), ``bfloat16+head``
(a bfloat16 head for sampling); ``--quick``: the tiny random model, seconds; ``--repeat 3``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from llm.common import profiling
from llm.common.config import load_config
from llm.models import half_precision_sum
from llm.models.precision import (
    FLOAT32_ATTENTION,
    half_precision_attention,
    half_precision_head_for_sampling,
)
from llm.training.builder import build
from teamtr.penalty import EpisodicPenalty
from teamtr.stage import run_stage

SAMPLING = "sampling turn"
"""The sampler's sections (``sampling turn 1``, ...): what runs inside them is sampling."""


def matmul_rate(dtype: torch.dtype, repeats: int = 10) -> float:
    """GFLOP/s of one 2048x576 @ 576x1536 product (SmolLM2's MLP shape) on this thread."""
    a = torch.randn(2048, 576).to(dtype)
    b = torch.randn(576, 1536).to(dtype)
    a @ b
    started = time.process_time()
    for _ in range(repeats):
        a @ b
    return 2 * 2048 * 576 * 1536 * repeats / (time.process_time() - started) / 1e9


def _phase() -> str:
    """ "sampling" inside a sampler's turn section, else "training" (scoring, updates)."""
    profile = profiling._active  # noqa: SLF001 (the bench reads the open sections)
    if profile is not None and any(t.name.startswith(SAMPLING) for t in profile._open):  # noqa: SLF001
        return "sampling"
    return "training"


def _timed(part: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` charging its CPU time to ``<phase>: <part>``."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with profiling.section(f"{_phase()}: {part}"):
            return function(*args, **kwargs)

    return wrapper


def _module_section(module: torch.nn.Module, part: str, rows_counter: str | None = None) -> None:
    """Charge ``module``'s forward passes to ``<phase>: <part>`` (hooks; a deep copy of the
    model, such as float32's merged generation copy, keeps them)."""
    open_sections: list[Any] = []

    def enter(_module: torch.nn.Module, args: tuple) -> None:
        timed = profiling.section(f"{_phase()}: {part}")
        timed.__enter__()
        open_sections.append(timed)
        if rows_counter is not None and args:
            profiling.count(f"{_phase()}: {rows_counter}", args[0].shape[:-1].numel())

    def leave(_module: torch.nn.Module, _args: tuple, _output: Any) -> None:
        open_sections.pop().__exit__(None, None, None)

    module.register_forward_pre_hook(enter)
    module.register_forward_hook(leave)


@contextlib.contextmanager
def stage_sections(model: torch.nn.Module) -> Iterator[None]:
    """Cut the stage's CPU time into the parts half precision treats differently (see the
    module's docstring); ``model``: the team's PEFT model (its base's head and decoder get
    hooks, its attention functions and LoRA-sum casts are wrapped while the block runs)."""
    base = model.get_base_model()
    _module_section(base.lm_head, "output head", rows_counter="head rows")
    _module_section(base.model, DECODER_REST)
    saved = {
        name: ALL_ATTENTION_FUNCTIONS[name]
        for name in ("sdpa", FLOAT32_ATTENTION)
        if name in ALL_ATTENTION_FUNCTIONS
    }
    casts = (half_precision_sum.to_product_dtype, half_precision_sum.to_float32)
    draw = (torch.multinomial, torch.nn.functional.softmax)
    linear = torch.nn.functional.linear
    vocabulary = base.lm_head.weight.shape[0]
    torch.nn.functional.linear = _base_products(linear, vocabulary)  # type: ignore[assignment]
    for name, function in saved.items():
        ALL_ATTENTION_FUNCTIONS[name] = _timed("attention", function)
    sums = half_precision_sum
    sums.to_product_dtype = _timed("casts of the float32 sum", casts[0])  # type: ignore[assignment]
    sums.to_float32 = _timed("casts of the float32 sum", casts[1])  # type: ignore[assignment]
    torch.multinomial = _timed("draw (softmax, multinomial)", draw[0])  # type: ignore[assignment]
    torch.nn.functional.softmax = _timed("draw (softmax, multinomial)", draw[1])  # type: ignore[assignment]
    try:
        yield
    finally:
        for name in saved:
            del ALL_ATTENTION_FUNCTIONS[name]  # the local override: the registered one again
        sums.to_product_dtype, sums.to_float32 = casts  # type: ignore[assignment]
        torch.multinomial, torch.nn.functional.softmax = draw  # type: ignore[assignment]
        torch.nn.functional.linear = linear  # type: ignore[assignment]


DECODER_PRODUCTS = "decoder: products with the base weights"
DECODER_REST = "decoder: norms, element-wise, residual, LoRA branches"
LEGACY_DECODER = "decoder: products, norms, LoRA branches"
LORA_RANK_CEILING = 64
"""A product whose weight has a side this narrow is a LoRA branch's (A or B), not the base's."""


def _base_products(linear: Callable[..., Any], vocabulary: int) -> Callable[..., Any]:
    """``torch.nn.functional.linear`` charging the decoder's base-weight products to their own
    part. The head's product (a weight of ``vocabulary`` rows, whichever copy: the merged
    generation model's, a float32 one) stays the head's; a LoRA branch's stays in the decoder's
    rest."""
    timed = _timed(DECODER_PRODUCTS, linear)

    def dispatch(x: torch.Tensor, weight: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if weight.shape[0] == vocabulary or min(weight.shape) <= LORA_RANK_CEILING:
            return linear(x, weight, *args, **kwargs)
        return timed(x, weight, *args, **kwargs)

    return dispatch


PARTS = (
    "output head",
    "attention",
    "casts of the float32 sum",
    DECODER_PRODUCTS,
    DECODER_REST,
    "draw (softmax, multinomial)",
)
LEGACY_PARTS = tuple(
    LEGACY_DECODER if p == DECODER_PRODUCTS else p for p in PARTS if p != DECODER_REST
)
"""The parts of a profile recorded before the decoder's products had a part of their own
(results/precision_stage_amx.json): one decoder part."""


def sections_table(seconds: dict[str, float]) -> dict[str, float]:
    """The profile's exclusive seconds gathered into the table's rows: each part in sampling
    and in training, generation's own loop (what a sampling turn spends outside the model and
    the draw), the training passes' backward, and the rest of the stage."""
    folded: dict[str, float] = {}
    for name, value in seconds.items():  # a backtracked try's sections are the same parts
        key = name.removeprefix("backtrack ")
        folded[key] = folded.get(key, 0.0) + value
    seconds = folded
    rows: dict[str, float] = {}
    legacy = any(name.endswith(LEGACY_DECODER) for name in seconds)
    for phase in ("sampling", "training"):
        for part in LEGACY_PARTS if legacy else PARTS:
            rows[f"{phase}: {part}"] = seconds.get(f"{phase}: {part}", 0.0)
    rows["sampling: generate loop and sampler"] = sum(
        s for name, s in seconds.items() if name.startswith(SAMPLING)
    )
    rows["training: backward"] = sum(s for name, s in seconds.items() if "backward" in name)
    rows["training: losses, KL, optimiser, rest"] = sum(
        s
        for name, s in seconds.items()
        if not name.startswith(("sampling", "training")) and "backward" not in name
    )
    return rows


def one_stage(config, seed: int, options: tuple[str, ...] = ()) -> dict[str, Any]:
    parts = build(config)
    for option in options:
        OPTIONS[option](parts.team.backbone.model)
    torch.manual_seed(seed)
    with stage_sections(parts.team.backbone.model), profiling.recording() as profile:
        report, _ = run_stage(
            parts.team,
            parts.sampler,
            parts.updater,
            config.stage,
            EpisodicPenalty(config.sampler.turns),
        )
    parts.sampler.close()
    table = sections_table(dict(profile.seconds))
    sampling = sum(s for name, s in table.items() if name.startswith("sampling"))
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
        "table": table,
        "sections": dict(sorted(profile.seconds.items(), key=lambda kv: -kv[1])),
        "counts": dict(profile.counts),
        "mismatch": mismatch,
    }


def ratios(row: dict[str, Any], reference: dict[str, Any]) -> dict[str, float]:
    return {
        "stage_cpu": row["cpu_seconds"] / reference["cpu_seconds"],
        "cpu_per_token": row["cpu_seconds_per_token"] / reference["cpu_seconds_per_token"],
        "generation_speed": row["tokens_per_sampling_cpu_second"]
        / reference["tokens_per_sampling_cpu_second"],
        "matmul_speed": row["matmul_gflops"] / reference["matmul_gflops"],
    }


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


class SubmoduleSumLoraLinear(half_precision_sum.Float32SumLoraLinear):
    """The float32 sum's layer as it was before the cuts of docs/stage_cost.md ("A bfloat16
    stage, part by part"): PEFT's submodules called for the branch, one cast per product."""

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        base = self.get_base_layer()
        result = base(x.to(base.weight.dtype), *args, **kwargs).float()
        branch = half_precision_sum._lora_branch(self, x)  # noqa: SLF001
        return result if branch is None else result + branch


def before_the_cuts(model: torch.nn.Module) -> int:
    """``bfloat16+before``: the float32 sum's layers computed as before the cuts."""
    changed = 0
    for module in model.modules():
        if type(module) is half_precision_sum.Float32SumLoraLinear:
            module.__class__ = SubmoduleSumLoraLinear
            changed += 1
    return changed


OPTIONS: dict[str, Callable[[torch.nn.Module], object]] = {
    "attention": half_precision_attention,
    "head": half_precision_head_for_sampling,
    "before": before_the_cuts,
}
"""``bfloat16+attention``, ``bfloat16+head``: the half-precision options measured beside the
default (``llm.models.precision``)."""


def configured(base, name: str):
    dtype, _, lora_sum_mode = name.split("+")[0].partition(":")
    config = dataclasses.replace(base, run=dataclasses.replace(base.run, dtype=dtype))
    if lora_sum_mode:
        lora = dataclasses.replace(base.lora, half_precision_sum=lora_sum_mode)
        config = dataclasses.replace(config, lora=lora)
    return config, getattr(torch, dtype)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="default", help="config file or shipped name")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=1, help="rounds of every dtype, alternating")
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
        "cpu": torch.backends.cpu.get_cpu_capability(),
        "amx_bf16": bool(torch.cpu.get_capabilities().get("amx_bf16", False)),
        "rounds": [],
    }
    for round_index in range(args.repeat):
        rows: dict[str, Any] = {}
        for name in args.dtypes:
            config, dtype = configured(base, name)
            row = one_stage(config, args.seed, tuple(name.split("+")[1:]))
            row["matmul_gflops"] = matmul_rate(dtype)
            rows[name] = row
            print(
                f"[{round_index + 1}/{args.repeat}] {name:>9}: stage {row['cpu_seconds']:.1f} "
                f"CPU-s, {row['generated_tokens']} tokens ({row['cpu_seconds_per_token'] * 1e3:.1f}"
                f" ms a token), sampling {row['tokens_per_sampling_cpu_second']:.1f} tokens per "
                f"CPU-s, matmul {row['matmul_gflops']:.0f} GFLOP/s",
                flush=True,
            )
        if "float32" in rows:
            for row in rows.values():
                row["ratio_to_float32"] = ratios(row, rows["float32"])
        result["rounds"].append(rows)
    print_summary(result, args.dtypes)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


def print_summary(result: dict[str, Any], names: list[str]) -> None:
    rounds = result["rounds"]
    result["summary"] = summary = {}
    for name in names:
        runs = [r[name] for r in rounds]
        entry: dict[str, Any] = {
            "cpu_seconds": spread([r["cpu_seconds"] for r in runs]),
            "table": {part: spread([r["table"][part] for r in runs]) for part in runs[0]["table"]},
        }
        if "ratio_to_float32" in runs[0]:
            entry["ratio_to_float32"] = {
                key: spread([r["ratio_to_float32"][key] for r in runs])
                for key in runs[0]["ratio_to_float32"]
            }
            text = ", ".join(
                f"{k} {v['median']:.3f} ({v['min']:.3f}-{v['max']:.3f})"
                for k, v in entry["ratio_to_float32"].items()
            )
            print(f"{name:>9} / float32, median (range) of {len(runs)}: {text}")
        summary[name] = entry
    print(f"\nCPU-s by part, median of {len(rounds)} round(s):")
    print(f"{'part':<64}" + "".join(f"{n:>16}" for n in names))
    for part in summary[names[0]]["table"]:
        cells = "".join(f"{summary[n]['table'][part]['median']:>16.2f}" for n in names)
        print(f"{part:<64}{cells}")
    cells = "".join(f"{summary[n]['cpu_seconds']['median']:>16.2f}" for n in names)
    print(f"{'stage':<64}{cells}")


if __name__ == "__main__":
    raise SystemExit(main())
