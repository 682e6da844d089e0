"""Language-model backend benchmark, side by side in one run.

1. Sampler tokens/s against raw ``model.generate`` on the same prompts (goal: ratio >= 0.9).
   The sampler's side is exactly its generation path (``DialogueSampler.speaker_model``: by
   default the speaker's adapter merged into a generation copy, ``llm.models.generation``), with the
   speaker changing at every call as it does between turns, so each call pays one merge. The
   PEFT model (LoRA as an extra product in every layer) is measured alongside. The sides take
   turns within each round, in a rotating order, so that load on the machine hits them alike.
2. Per-stage wall time and generated tokens of ``teamtr`` against ``stale`` from the same team
   (teamtr resamples after every update; prefix reuse keeps turns before the updated agent's
   first turn).
3. Resident memory, each measured in a fresh process: 3 LoRA agents on one base model, the same
   plus the generation copy, 3 base models with one LoRA adapter each (the layout of a
   heterogeneous team), and 3 separate plain model copies.

Usage: ``.venv/bin/python bench/llm_throughput.py [--source smollm2] [--json OUT]
[--sections generation memory stage] [--device cpu|cuda|auto] [--dtype auto|float32|bfloat16]``
(all sections by default; ``--sections generation`` runs only the throughput comparison, the
stage section being the slow one; the memory section measures CPU resident memory only).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from llm.common.config import RunConfig
from llm.engines.hf.messages import generate_messages
from llm.models.agents import LoraBackbone, LoraSettings, SeparateBackbone
from llm.models.loading import load_model
from llm.problems.tasks import ArithmeticSuite
from llm.sampling.sampler import SamplerSettings
from llm.training.builder import build, placement_of
from llm.update.updater import UpdaterSettings
from teamtr.config import StageConfig
from teamtr.penalty import EpisodicPenalty
from teamtr.stage import run_stage

SECTIONS = ("generation", "memory", "stage")
MEMORY_CASES = (
    "three_lora_agents",
    "three_lora_agents_with_generation_copy",
    "three_separate_lora_models",
    "three_model_copies",
)


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def generation_throughput(
    parts, raw_model, prompts: int, new_tokens: int, rounds: int
) -> dict[str, float]:
    problems = ArithmeticSuite(1).fixed_set("test", prompts, seed=0)
    chat = parts.chat
    contexts = [chat.encode_prompt(p.question) + list(chat.headers[0]) for p in problems]
    team = parts.team
    sides: dict[str, Callable[[int], torch.nn.Module]] = {
        "raw_generate": lambda agent: raw_model,
        "sampler": lambda agent: parts.sampler.engine.speaker_model(team, agent),
        "peft_generate": lambda agent: team.use(agent),
    }
    tokens = dict.fromkeys(sides, 0)
    seconds = dict.fromkeys(sides, 0.0)
    model_seconds = dict.fromkeys(sides, 0.0)
    round_ratios: dict[str, list[float]] = {"sampler": [], "peft_generate": []}
    labels = list(sides)
    started = time.perf_counter()
    sides["sampler"](team.n_agents - 1)  # made once per run: the generation copy, if any
    setup_seconds = time.perf_counter() - started
    for round_index in range(rounds):
        agent = round_index % team.n_agents
        shift = round_index % len(labels)
        speed = {}
        for label in labels[shift:] + labels[:shift]:
            torch.manual_seed(round_index)
            started = time.perf_counter()
            model = sides[label](agent)  # the merge, when the speaker changed, is timed too
            model_seconds[label] += time.perf_counter() - started
            messages = generate_messages(model, contexts, chat, new_tokens, 1.0)
            elapsed = time.perf_counter() - started
            generated = sum(len(m) for m in messages)
            seconds[label] += elapsed
            tokens[label] += generated
            speed[label] = generated / elapsed
        for label, ratios in round_ratios.items():
            ratios.append(speed[label] / speed["raw_generate"])
    results: dict[str, float] = {
        "rounds": float(rounds),
        "merged_generation": float(parts.sampler.settings.merged_generation),
        "sampler_setup_seconds": setup_seconds,
    }
    for label in labels:
        results[f"{label}_tokens_per_s"] = tokens[label] / seconds[label]
    results["sampler_model_switch_seconds_per_call"] = model_seconds["sampler"] / rounds
    results["ratio_sampler_over_raw"] = (
        results["sampler_tokens_per_s"] / results["raw_generate_tokens_per_s"]
    )
    results["ratio_peft_over_raw"] = (
        results["peft_generate_tokens_per_s"] / results["raw_generate_tokens_per_s"]
    )
    # Within a round the sides run back to back, so a per-round ratio cancels slow swings of
    # the machine's load; the median discards rounds hit by a burst.
    results["median_round_ratio_sampler_over_raw"] = statistics.median(round_ratios["sampler"])
    results["median_round_ratio_peft_over_raw"] = statistics.median(round_ratios["peft_generate"])
    return results


def stage_costs(parts, config: RunConfig) -> dict[str, dict[str, float]]:
    results = {}
    for scheme in ("teamtr", "stale"):
        torch.manual_seed(0)
        started = time.perf_counter()
        report, _ = run_stage(
            parts.team,
            parts.sampler,
            parts.updater,
            StageConfig(scheme=scheme, radius=0.02, order="fixed"),
            EpisodicPenalty(config.sampler.turns),
        )
        calls = report.sampled_rollouts
        results[scheme] = {
            "wall_seconds": time.perf_counter() - started,
            "sampling_seconds": sum(c.wall_seconds for c in calls),
            "generated_tokens": float(sum(c.generated_tokens for c in calls)),
            "reused_turns": float(sum(c.reused_turns for c in calls)),
            "sample_calls": float(len(calls)),
        }
    results["ratio_teamtr_over_stale"] = {
        key: results["teamtr"][key] / results["stale"][key]
        for key in ("wall_seconds", "generated_tokens")
    }
    return results


def memory_case(source: str, case: str) -> float:
    """Resident MiB added by loading what ``case`` names (run in a fresh process)."""
    gc.collect()
    before = rss_mib()
    base = load_model(source)
    if case == "three_model_copies":
        copies = [copy.deepcopy(base) for _ in range(2)]
        assert len(copies) == 2
    elif case == "three_separate_lora_models":  # a heterogeneous team's layout, same models
        separate = SeparateBackbone.create(
            [base, load_model(source), load_model(source)], LoraSettings()
        )
        assert separate.n_agents == 3
    else:
        backbone = LoraBackbone.create(base, 3, LoraSettings())
        if case == "three_lora_agents_with_generation_copy":
            backbone.generation_model(0, backbone.initial_team().agent(0))
    gc.collect()
    return rss_mib() - before


def memory(source: str) -> dict[str, float]:
    """Each case in its own process, so that memory freed by one cannot be reused by another."""
    results = {}
    for case in MEMORY_CASES:
        command = [sys.executable, __file__, "--source", source, "--memory-case", case]
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        results[f"{case}_mib"] = float(output.strip().splitlines()[-1])
    copies = results["three_model_copies_mib"]
    results["ratio_lora_over_copies"] = results["three_lora_agents_mib"] / copies
    results["ratio_lora_with_generation_copy_over_copies"] = (
        results["three_lora_agents_with_generation_copy_mib"] / copies
    )
    results["ratio_separate_lora_over_copies"] = results["three_separate_lora_models_mib"] / copies
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="smollm2")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=6, help="generate calls per side")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--device", default="cpu", help='[run] device ("auto", "cuda", ...)')
    parser.add_argument("--dtype", default="auto", help="[run] dtype (auto: bfloat16 on CUDA)")
    parser.add_argument("--memory-case", choices=MEMORY_CASES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_case:
        print(memory_case(args.source, args.memory_case))
        return

    report: dict[str, object] = {"sections": args.sections}
    if "memory" in args.sections:
        report["memory"] = memory(args.source)
    if not {"generation", "stage"} & set(args.sections):
        finish(report, args.json)
        return
    config = RunConfig()
    config = dataclasses.replace(
        config,
        model=dataclasses.replace(config.model, source=args.source),
        sampler=SamplerSettings(prompts_per_batch=2, group_size=4, turns=3, max_new_tokens=24),
        updater=UpdaterSettings(learning_rate=2e-4, steps=1),
        run=dataclasses.replace(config.run, device=args.device, dtype=args.dtype),
    )
    placement = placement_of(config)
    report["device"] = str(placement.device)
    report["dtype"] = str(placement.dtype).removeprefix("torch.")
    parts = build(config)
    if "generation" in args.sections:
        raw = load_model(args.source, dtype=placement.dtype, device=placement.device)
        report["generation"] = generation_throughput(
            parts, raw, args.prompts, args.new_tokens, args.rounds
        )
        del raw
    if "stage" in args.sections:
        report["stage"] = stage_costs(parts, config)
    finish(report, args.json)


def finish(report: dict[str, object], json_path: str | None) -> None:
    text = json.dumps(report, indent=2)
    print(text)
    if json_path:
        Path(json_path).write_text(text)


if __name__ == "__main__":
    main()
