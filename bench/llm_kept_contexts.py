"""What keeping the unchanged speakers' keys and values saves a TeamTR stage's resampling.

One stage of resampling on the chain of ``teamtr llm-scaling`` (n SmolLM2 agents in a fixed
order, the study's settings, dynamic sampling on): the stage-start draw, then after each of the
first n - 1 agents changes (its LoRA B drawn at random, standing in for its update) the draw of
the intermediate team with prefix reuse, as ``run_stage`` calls the sampler. The same sequence
runs twice in one process from the same generator states, with ``[sampler] kept_contexts_mb`` off
and on, draw by draw in alternation so that both see the same machine: CPU seconds of each draw,
the positions the kept contexts spared, the memory they hold, and whether both produced the same dialogues (they
must, up to a float-rounding tie; a differing one is counted and reported).

Usage: ``OMP_NUM_THREADS=1 .venv/bin/python bench/llm_kept_contexts.py --agents 8
--json results/llm_kept_contexts.json``; ``--quick`` runs the tiny random model (seconds).
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
from llm.conversation.router import make_router
from llm.models.agents import AdapterWeights, LoraTeam
from llm.sampling.rollouts import DialogueRollouts
from llm.sampling.sampler import DialogueSampler
from llm.training.builder import build
from studies.llm.drift.scaling import StudySettings, unit_config


def changed(team: LoraTeam, agent: int, seed: int, scale: float = 0.01) -> LoraTeam:
    """``team`` with agent ``agent``'s LoRA B drawn at random (an update's stand-in)."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {
        key: torch.randn(value.shape, generator=generator) * scale if "lora_B" in key else value
        for key, value in team.agent(agent).tensors.items()
    }
    return team.with_agent(agent, AdapterWeights(tensors))


def measure(n_agents: int, seed: int, quick: bool) -> dict[str, Any]:
    settings = StudySettings(source="tiny" if quick else "smollm2")
    config = unit_config(settings, n_agents, seed)
    parts = build(config, progress=False)
    router = make_router("fixed", n_agents)
    samplers = {
        keep: DialogueSampler(
            parts.chat,
            router,
            parts.sampler.task,
            dataclasses.replace(
                config.sampler, kept_contexts_mb=config.sampler.kept_contexts_mb if keep else 0
            ),
        )
        for keep in (False, True)
    }
    teams = [parts.team]
    for agent in range(n_agents - 1):
        teams.append(changed(teams[-1], agent, seed=1000 * seed + agent))
    previous: dict[bool, DialogueRollouts | None] = {False: None, True: None}
    draws: list[dict[str, Any]] = []
    for index, team in enumerate(teams):
        row: dict[str, Any] = {"updated_agent": index - 1 if index else None}
        outcome = {}
        for keep in (False, True):
            torch.manual_seed(10_000 * seed + index)
            with profiling.recording() as profile:
                started = time.process_time()
                rollouts = samplers[keep].sample(
                    team, previous=previous[keep], updated_agent=index - 1 if index else None
                )
                cpu = time.process_time() - started
            previous[keep] = rollouts
            outcome[keep] = rollouts
            label = "kept" if keep else "plain"
            row[f"{label}_cpu_seconds"] = cpu
            row[f"{label}_kept_positions"] = int(profile.counts.get("kept context positions", 0))
            row[f"{label}_generated_tokens"] = rollouts.generated_tokens
            row[f"{label}_groups_drawn"] = rollouts.groups_drawn
            row[f"{label}_held_megabytes"] = samplers[keep].engine.context_caches.held_bytes / 2**20
        dialogues = {
            keep: [[t.message for t in e.turns] for e in rollouts.pool or rollouts.episodes]
            for keep, rollouts in outcome.items()
        }
        row["same_dialogues"] = dialogues[False] == dialogues[True]
        draws.append(row)
        print(
            f"draw {index} (after agent {row['updated_agent']}): plain "
            f"{row['plain_cpu_seconds']:.1f} s, kept {row['kept_cpu_seconds']:.1f} s, "
            f"{row['kept_kept_positions']} positions kept, same: {row['same_dialogues']}",
            flush=True,
        )
    plain = sum(d["plain_cpu_seconds"] for d in draws)
    kept = sum(d["kept_cpu_seconds"] for d in draws)
    resample_plain = sum(d["plain_cpu_seconds"] for d in draws[1:])
    resample_kept = sum(d["kept_cpu_seconds"] for d in draws[1:])
    return {
        "n_agents": n_agents,
        "seed": seed,
        "source": settings.source,
        "settings": settings.as_json(),
        "draws": draws,
        "stage_sampling_cpu_seconds": {"plain": plain, "kept": kept, "ratio": kept / plain},
        "resampling_cpu_seconds": {
            "plain": resample_plain,
            "kept": resample_kept,
            "ratio": resample_kept / resample_plain if resample_plain else float("nan"),
        },
        "all_same_dialogues": all(d["same_dialogues"] for d in draws),
        "most_held_megabytes": max(d["kept_held_megabytes"] for d in draws),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="the tiny random model (seconds)")
    parser.add_argument("--json", type=Path, help="write the measurement here")
    args = parser.parse_args(argv)
    if args.agents < 3:
        parser.error(
            "--agents must be at least 3 (with 2 no unchanged speaker follows a kept turn)"
        )
    result = measure(args.agents, args.seed, args.quick)
    total, resampling = result["stage_sampling_cpu_seconds"], result["resampling_cpu_seconds"]
    print(
        f"n = {args.agents}: a stage's sampling {total['plain']:.1f} -> {total['kept']:.1f} "
        f"CPU-s ({total['ratio']:.2f}x); its resampling {resampling['plain']:.1f} -> "
        f"{resampling['kept']:.1f} CPU-s ({resampling['ratio']:.2f}x); same dialogues: "
        f"{result['all_same_dialogues']}; kept keys and values held at most "
        f"{result['most_held_megabytes']:.0f} MB"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
