"""How far the sampler's own log-probabilities lie from the training forward pass's.

Before every update the updater checks that the rollouts' behaviour log-probs are its agent's
(the ratio new/old is 1 to ``ratio_tolerance``, 1e-4); today those log-probs come from a scoring
pass of the training model over every message of the agent (``llm.sampling.rollouts
.BehaviourLogps``, "behaviour log-probs" in ``docs/stage_cost.md``). ``generate`` has them for
free: the distribution each token was drawn from. Whether they could replace the scoring pass
depends on how far the two computations lie apart (the generating model is the merged copy with
a key/value cache and each group's prompt run once; the training model applies LoRA unmerged to
whole transcripts), and on what the pass costs. This script measures both, side by side in one
process, on one batch of a config's dialogues played turn by turn, once with the untrained team
(LoRA B = 0) and once with every adapter perturbed (random B, so the merge is not the base):

- per message token, |log p_generate - log p_training| (max, 99.9th percentile, mean), against
  ``ratio_tolerance``;
- CPU seconds of sampling with and without recording, and of the scoring pass it would save.

Usage: ``OMP_NUM_THREADS=1 .venv/bin/python bench/behaviour_logp_gap.py --config default
--json results/behaviour_logp_gap.json``; ``--quick`` runs the tiny random model (seconds).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from llm.common.config import load_config
from llm.common.devices import DTYPES
from llm.conversation.dialogue import Episode, Turn
from llm.engines.hf.messages import generate_messages
from llm.models.agents import AdapterWeights, LoraTeam
from llm.sampling.sampler import DialogueSampler
from llm.training.builder import build
from llm.update.mismatch import mismatch_kl_tolerance


def perturbed(team: LoraTeam, scale: float, seed: int) -> LoraTeam:
    """Every agent with random LoRA B matrices of standard deviation ``scale``."""
    generator = torch.Generator().manual_seed(seed)
    for agent in range(team.n_agents):
        tensors = {
            key: torch.randn(value.shape, generator=generator) * scale if "lora_B" in key else value
            for key, value in team.agent(agent).tensors.items()
        }
        team = team.with_agent(agent, AdapterWeights(tensors))
    return team


def generating_model(sampler: DialogueSampler, team: LoraTeam, agent: int, how: str):
    """The model that generates ``agent``'s messages: the sampler's choice, or forced to the
    merged copy (``llm.models.generation``) or to the unmerged PEFT model."""
    if how == "merged":
        return team.generation_model(sampler.chat.policy(agent))
    if how == "unmerged":
        return team.use(sampler.chat.policy(agent))
    return sampler.engine.speaker_model(team, agent)


def play(
    sampler: DialogueSampler,
    team: LoraTeam,
    episodes: list[Episode],
    record: bool,
    how: str = "sampler",
) -> tuple[list[Episode], dict[tuple[int, int], torch.Tensor], float]:
    """The sampler's turn-by-turn play (each group's prompt once), optionally recording each
    token's sampling log-probability; returns the episodes, the records and the CPU seconds."""
    s = sampler.settings
    recorded: dict[tuple[int, int], torch.Tensor] = {}
    torch.manual_seed(0)
    started = time.process_time()
    while True:
        pending: dict[int, list[int]] = {}
        for index, episode in enumerate(episodes):
            if len(episode.turns) < s.turns:
                pending.setdefault(sampler.next_speaker(episode), []).append(index)
        if not pending:
            return episodes, recorded, time.process_time() - started
        for agent in sorted(pending):
            indices = pending[agent]
            contexts = [sampler.chat.context(episodes[i], agent) for i in indices]
            lengths = [len(episodes[i].prompt) for i in indices]
            logps: list[torch.Tensor] | None = [] if record else None
            messages = generate_messages(
                generating_model(sampler, team, agent, how),
                contexts,
                sampler.chat,
                s.max_tokens_of(agent),
                s.temperature,
                lengths,
                sampled_logps=logps,
            )
            for row, (index, message) in enumerate(zip(indices, messages, strict=True)):
                episode = episodes[index]
                if logps is not None:
                    recorded[(index, len(episode.turns))] = logps[row]
                episodes[index] = episode.with_turns([*episode.turns, Turn(agent, message)])


def measure(
    sampler: DialogueSampler, team: LoraTeam, label: str, how: str = "sampler"
) -> dict[str, Any]:
    start = sampler.new_episodes()
    _, _, plain_seconds = play(sampler, team, list(start), record=False, how=how)
    episodes, recorded, record_seconds = play(sampler, team, list(start), record=True, how=how)
    started = time.process_time()
    training = {}
    for agent in range(team.n_agents):
        training.update(sampler.agent_logps(team, episodes, agent))
    scoring_seconds = time.process_time() - started
    signed = np.concatenate(
        [(training[key] - recorded[key]).double().numpy() for key in recorded if len(recorded[key])]
    )
    gaps = np.abs(signed)
    tokens = sum(len(m.message) for e in episodes for m in e.turns)
    return {
        "team": label,
        "generation": how,
        "tokens": int(gaps.size),
        "max_gap": float(gaps.max()),
        "p999_gap": float(np.quantile(gaps, 0.999)),
        "mean_gap": float(gaps.mean()),
        # k3 = e^g - 1 - g, g = log pi - log mu on tokens drawn from mu: KL(mu || pi) a token.
        "mismatch_kl": float(np.mean(np.expm1(signed) - signed)),
        "sampled_tokens": tokens,
        "sampled_tokens_per_cpu_second": tokens / plain_seconds,
        "sampling_cpu_seconds": plain_seconds,
        "sampling_recording_cpu_seconds": record_seconds,
        "scoring_pass_cpu_seconds": scoring_seconds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="default", help="config file or shipped name")
    parser.add_argument("--quick", action="store_true", help="the tiny random model")
    parser.add_argument("--scale", type=float, default=0.01, help="std of the perturbed LoRA B")
    parser.add_argument("--json", type=Path, help="write the measurements here")
    parser.add_argument(
        "--dtype", default="float32", choices=("float32", "bfloat16", "float16"), help="weights"
    )
    parser.add_argument(
        "--generation",
        nargs="+",
        default=["sampler"],
        choices=("sampler", "merged", "unmerged"),
        help="who generates: the sampler's choice, the merged copy, the PEFT model",
    )
    args = parser.parse_args(argv)
    config = load_config(args.config)
    config = dataclasses.replace(config, run=dataclasses.replace(config.run, dtype=args.dtype))
    if args.quick:
        config = dataclasses.replace(
            config,
            model=dataclasses.replace(config.model, source="tiny", sources=()),
            sampler=dataclasses.replace(config.sampler, prompts_per_batch=2, group_size=2),
        )
    torch.set_num_threads(1)
    parts = build(config)
    result = {
        "config": str(args.config),
        "source": config.model.source,
        "episodes": config.sampler.prompts_per_batch * config.sampler.group_size,
        "temperature": config.sampler.temperature,
        "ratio_tolerance": config.updater.ratio_tolerance,
        "perturbation_scale": args.scale,
        "dtype": args.dtype,
        "mismatch_kl_tolerance": mismatch_kl_tolerance(DTYPES[args.dtype])
        if args.dtype != "float32"
        else None,
        "teams": [
            row
            for how in args.generation
            for row in (
                measure(parts.sampler, parts.team, "untrained (B = 0)", how),
                measure(
                    parts.sampler, perturbed(parts.team, args.scale, seed=1), "perturbed B", how
                ),
            )
        ],
    }
    for row in result["teams"]:
        print(
            f"{args.dtype} {row['generation']:>8} {row['team']:>18}: {row['tokens']} tokens, "
            f"|gap| max {row['max_gap']:.2e}, KL {row['mismatch_kl']:.2e}, "
            f"99.9% {row['p999_gap']:.2e}, mean {row['mean_gap']:.2e} "
            f"(ratio_tolerance {result['ratio_tolerance']:.0e}); CPU s: sampling "
            f"{row['sampling_cpu_seconds']:.1f}, recording {row['sampling_recording_cpu_seconds']:.1f}, "
            f"scoring pass {row['scoring_pass_cpu_seconds']:.1f}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
