"""The spread of a language-model team's held-out pairs with and without coupled continuations.

For one config and seed it plays the first stage's updates as a stage does (a training draw,
the agent's trust-region update, the next draw from the new team), and after each update draws
``--pairs`` fresh held-out dialogues of the old team continued by the new one twice: with
common random numbers (``[sampler] held_out_coupled = true``) and with independent noise. Per
update and way it reports the pairs' mean and standard deviation, each side's mean reward, how
often D was 0, the fixed-n
hedged bound on all of them, where sequential draws of ``--batch`` would have stopped (and
their anytime bound there), and the CPU-seconds the pairs took.

Usage::

    OMP_NUM_THREADS=1 python -m studies.llm.certificate.coupled_pairs --config default --seed 0 \\
        --pairs 256 --json results/measured_certificate/coupled_pairs-s0.json
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from llm.common.config import load_config
from llm.sampling.held_out_groups import HeldOut, continue_groups
from llm.training.builder import build
from teamtr.measured import ANYTIME, FUTILITY_RULES, lower_bound, sequential_stop

LEVEL = 0.95


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def sequential(
    differences: np.ndarray, width: float, batch: int, cap: int, futility: str
) -> dict[str, Any]:
    """Where draws of ``batch`` pairs at a time, up to ``cap``, would have stopped on these
    pairs in their order (by the ``futility`` rule), why, and the anytime bound there."""
    alpha = 1 - LEVEL
    for drawn in range(batch, min(cap, differences.size) + 1, batch):
        stop = sequential_stop(differences[:drawn], width, alpha, cap, futility)
        if stop is not None:
            break
    else:
        stop = "not stopped within the pairs drawn"
    bound = lower_bound(differences[:drawn], width, alpha, ANYTIME)
    return {"pairs": drawn, "stop": stop, "anytime_bound": bound, "futility": futility}


def summary(
    differences: np.ndarray, width: float, batch: int, cap: int, futility: str
) -> dict[str, Any]:
    values, counts = np.unique(differences, return_counts=True)
    return {
        "n": int(differences.size),
        "mean": float(differences.mean()),
        "sd": float(differences.std(ddof=1)),
        "zero_share": float(np.mean(differences == 0)),
        "values": {f"{v:+g}": int(c) for v, c in zip(values, counts, strict=True)},
        "hedged_bound": lower_bound(differences, width, 1 - LEVEL, "hedged"),
        "sequential": sequential(differences, width, batch, cap, futility),
    }


def measure_update(parts, old, new, agent: int, args: argparse.Namespace) -> dict[str, Any]:
    """``args.pairs`` pairs of (``old``, ``new``) each way."""
    row: dict[str, Any] = {"agent": agent}
    for coupled in (True, False):
        sampler = copy.copy(parts.sampler)
        sampler.settings = replace(parts.sampler.settings, held_out_coupled=coupled)
        started = cpu_seconds()
        # draw_pairs's steps, keeping each side's rewards
        fresh, tokens = sampler.play(old, sampler.new_episodes(args.pairs, 1, coupled))
        _, rewards = sampler.graded(fresh)
        held = HeldOut(tuple(fresh), rewards, 1, tokens)
        training_range = sampler.task.training_range
        assert training_range is not None, "the task's training rewards declare no range"
        pairs, continued = continue_groups(sampler, new, held, agent, training_range)
        way = summary(pairs.differences, pairs.reward_width, args.batch, args.cap, args.futility)
        way["old_mean"] = float(rewards.mean())
        way["new_mean"] = float(continued.rewards.mean())
        way["cpu_seconds"] = cpu_seconds() - started
        way["tokens"] = tokens + continued.generated_tokens
        row["coupled" if coupled else "independent"] = way
        print(f"agent {agent}, coupled {coupled}: {json.dumps(way)}", flush=True)
    spreads = row["independent"]["sd"], row["coupled"]["sd"]
    row["variance_ratio"] = (spreads[0] / spreads[1]) ** 2 if spreads[1] > 0 else None
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pairs", type=int, default=256, help="pairs per update and way")
    parser.add_argument("--updates", type=int, default=2, help="updates of the first stage")
    parser.add_argument("--batch", type=int, default=16, help="sequential draws' batch")
    parser.add_argument("--cap", type=int, default=256, help="sequential draws' cap")
    parser.add_argument(
        "--futility", choices=FUTILITY_RULES, default="trend", help="sequential draws' rule"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    config = load_config(args.config)
    config = replace(
        config,
        run=replace(config.run, seed=args.seed, threads=1),
        sampler=replace(config.sampler, seed=args.seed),
    )
    parts = build(config, progress=False)
    order = list(np.random.default_rng(args.seed).permutation(parts.team.n_agents))
    team, rollouts, rows = parts.team, parts.sampler.sample(parts.team), []
    for agent in [int(a) for a in order[: args.updates]]:
        radius = config.stage.radius  # one δ for every agent, or one per agent
        delta = radius[agent] if isinstance(radius, tuple) else radius
        update = parts.updater.update(team, agent, rollouts, delta)
        new = team.with_agent(agent, update.policy)
        rows.append(measure_update(parts, team, new, agent, args))
        team, rollouts = new, parts.sampler.sample(new, previous=rollouts, updated_agent=agent)
    result = {"config": args.config, "seed": args.seed, "level": LEVEL, "updates": rows}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    parts.sampler.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
