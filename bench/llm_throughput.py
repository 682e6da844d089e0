"""Language-model backend benchmark, side by side in one run (issue 4, §7).

1. Sampler tokens/s against raw ``model.generate`` on the same prompts (goal: ratio >= 0.9).
2. Per-stage wall time and generated tokens of ``teamtr`` against ``stale`` from the same team
   (teamtr resamples after every update; prefix reuse keeps turns before the updated agent's
   first turn).
3. Resident memory of 3 LoRA agents on one base model against 3 separate model copies.

Usage: ``.venv/bin/python bench/llm_throughput.py [--source smollm2] [--json OUT]``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import json
import time
from pathlib import Path

import torch

from llm.agents import LoraBackbone, LoraSettings
from llm.config import RunConfig
from llm.loading import load_model
from llm.sampler import SamplerSettings, generate_messages
from llm.tasks import ArithmeticSuite
from llm.train import RecordingSampler, build
from llm.updater import UpdaterSettings
from teamtr.config import StageConfig
from teamtr.penalty import EpisodicPenalty
from teamtr.stage import run_stage


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def generation_throughput(parts, raw_model, prompts: int, new_tokens: int) -> dict[str, float]:
    problems = ArithmeticSuite(1).fixed_set("test", prompts, seed=0)
    chat = parts.chat
    contexts = [chat.encode_prompt(p.question) + list(chat.headers[0]) for p in problems]
    results = {}
    for label, model in (("raw_generate", raw_model), ("sampler", parts.team.use(0))):
        torch.manual_seed(0)
        started = time.perf_counter()
        messages = generate_messages(model, contexts, chat, new_tokens, 1.0)
        seconds = time.perf_counter() - started
        tokens = sum(len(m) for m in messages)
        results[f"{label}_tokens_per_s"] = tokens / seconds
    results["ratio_sampler_over_raw"] = (
        results["sampler_tokens_per_s"] / results["raw_generate_tokens_per_s"]
    )
    return results


def stage_costs(parts, config: RunConfig) -> dict[str, dict[str, float]]:
    results = {}
    for scheme in ("teamtr", "stale"):
        recorder = RecordingSampler(parts.sampler)
        torch.manual_seed(0)
        started = time.perf_counter()
        run_stage(
            parts.team,
            recorder,
            parts.updater,
            StageConfig(scheme=scheme, radius=0.02, order="fixed"),
            EpisodicPenalty(config.sampler.turns),
        )
        results[scheme] = {
            "wall_seconds": time.perf_counter() - started,
            "sampling_seconds": sum(c.wall_seconds for c in recorder.calls),
            "generated_tokens": float(sum(c.generated_tokens for c in recorder.calls)),
            "reused_turns": float(sum(c.reused_turns for c in recorder.calls)),
            "sample_calls": float(len(recorder.calls)),
        }
    results["ratio_teamtr_over_stale"] = {
        key: results["teamtr"][key] / results["stale"][key]
        for key in ("wall_seconds", "generated_tokens")
    }
    return results


def memory(source: str) -> dict[str, float]:
    gc.collect()
    before = rss_mib()
    base = load_model(source)
    LoraBackbone.create(base, 3, LoraSettings())
    lora = rss_mib() - before
    copies = [copy.deepcopy(base) for _ in range(2)]
    three_copies = rss_mib() - before  # the LoRA wrapper's adapters are small next to a copy
    del copies
    return {
        "three_lora_agents_mib": lora,
        "three_model_copies_mib": three_copies,
        "ratio_lora_over_copies": lora / three_copies,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="smollm2")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    report: dict[str, object] = {"memory": memory(args.source)}
    gc.collect()
    config = RunConfig()
    config = dataclasses.replace(
        config,
        model=dataclasses.replace(config.model, source=args.source),
        sampler=SamplerSettings(prompts_per_batch=2, group_size=4, turns=3, max_new_tokens=24),
        updater=UpdaterSettings(learning_rate=2e-4, steps=1),
    )
    parts = build(config)
    raw = load_model(args.source)
    report["generation"] = generation_throughput(parts, raw, args.prompts, args.new_tokens)
    del raw
    report["stage"] = stage_costs(parts, config)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text)


if __name__ == "__main__":
    main()
