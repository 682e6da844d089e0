"""Where bfloat16 training loses its signal: one batch, the same update, one rounding at a time.

For each seed: the config's team is built in float32 and one batch is sampled from it (the
stage's first draw). Then, for each variant below, the team is built afresh from the same seed
(so every adapter starts from the same weights: A drawn, B = 0), the batch's messages are
re-scored by the variant's own model (its reference pass is then on-policy by construction, so
no sampler mismatch and no correction enter), and each agent's first update
(``TrustRegionUpdater.update``, the project's trust-region step) runs on that batch from the
same start. Reported per variant, agent and seed:

- the first step's gradient (the reference pass's): its cosine with float32's and its norm as a
  ratio to float32's, over all of the agent's adapter matrices, and per matrix kind (A and B);
- the Adam step the update took (new minus old weights): cosine with float32's, norm ratio;
- the KL the update reached and the surrogate it gained, as the variant's own model measures
  them, and the backtracks;
- the same step measured by the float32 model (its weights loaded there): whether the
  parameters moved less, or the variant's forward pass hides how far they moved.

Variants (``--variants``): ``float32``; ``bfloat16`` (PEFT's sum, ``half_precision_sum =
"peft"``: the layer's bfloat16 product rounded, the LoRA branch added, rounded again: the
behaviour before ``llm.models.half_precision_sum``); ``bf16-attn-bf16`` (as bfloat16, with
attention in torch's bfloat16 SDPA instead of float32); ``bf16-round-once`` (W x + s B A x in float32,
rounded once); ``bf16-float32-sum`` (the bfloat16 product's output plus the branch, kept in
float32: the default); ``float16-float32-sum`` (float16 with the same sum; on a GPU,
``bench/gpu_check.py --parts diagnosis``).

Usage (one thread; about 25 CPU-minutes for 3 seeds of the default relay on SmolLM2)::

    OMP_NUM_THREADS=1 .venv/bin/python bench/precision_diagnosis.py --config default \\
        --seeds 0 1 2 --json results/precision_diagnosis.json

``--quick``: the tiny random model (seconds; what the tests run).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from llm.common.config import RunConfig, load_config
from llm.conversation.dialogue import Episode, Turn
from llm.logprobs.scoring import message_tokens
from llm.models.agents import AdapterWeights
from llm.models.half_precision_sum import lora_sum_of
from llm.sampling.rollouts import DialogueRollouts
from llm.training.builder import Components, build

VARIANTS: dict[str, dict[str, str]] = {
    "float32": {"dtype": "float32"},
    "bfloat16": {"dtype": "bfloat16", "sum": "peft"},
    "bf16-attn-bf16": {"dtype": "bfloat16", "sum": "peft", "attention": "sdpa"},
    "bf16-round-once": {"dtype": "bfloat16", "sum": "round_once"},
    "bf16-float32-sum": {"dtype": "bfloat16", "sum": "float32"},
    "float16-float32-sum": {"dtype": "float16", "sum": "float32"},
}
DEFAULT_VARIANTS = [name for name in VARIANTS if not name.startswith("float16")]
"""float16 only where asked for (``bench/gpu_check.py``): CPUs multiply it slowly."""
"""Each variant: the model's dtype, its ``half_precision_sum`` and (optionally) the attention
implementation that replaces the float32 one half precision installs."""


def variant_config(base: RunConfig, variant: str, seed: int) -> RunConfig:
    spec = VARIANTS[variant]
    lora = dataclasses.replace(base.lora, half_precision_sum=spec.get("sum", "float32"))
    run = dataclasses.replace(base.run, dtype=spec["dtype"], seed=seed)
    # As ``teamtr train --seed``: the adapters' initialisation and the sampler's draws.
    sampler = dataclasses.replace(base.sampler, seed=seed)
    return dataclasses.replace(base, lora=lora, run=run, sampler=sampler)


def build_variant(base: RunConfig, variant: str, seed: int) -> Components:
    parts = build(variant_config(base, variant, seed), progress=False)
    attention = VARIANTS[variant].get("attention")
    if attention is not None:
        parts.team.backbone.model.get_base_model().set_attn_implementation(attention)
    return parts


def without_recorded_logps(episodes: tuple[Episode, ...]) -> tuple[Episode, ...]:
    """The same messages with no sampler log-probs: every variant scores its own behaviour."""
    return tuple(
        dataclasses.replace(
            episode, turns=tuple(Turn(turn.agent, turn.message) for turn in episode.turns)
        )
        for episode in episodes
    )


def rebound(rollouts: DialogueRollouts, parts: Components) -> DialogueRollouts:
    """``rollouts``' tokens, rewards and advantages as if ``parts``' team had drawn them: the
    behaviour log-probs are its own model's, so its ratio check holds exactly."""
    episodes = without_recorded_logps(rollouts.episodes)
    return dataclasses.replace(
        rollouts,
        behaviour=parts.team,
        episodes=episodes,
        old_logps=parts.sampler.scored_logps(parts.team, episodes),
        pool=(),
    )


def flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().double().flatten() for t in tensors])


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    denominator = float(a.norm() * b.norm())
    return float(a @ b) / denominator if denominator > 0 else math.nan


def first_gradient(
    parts: Components, agent: int, rollouts: DialogueRollouts
) -> dict[str, torch.Tensor]:
    """The first step's gradient of ``agent``'s adapter (the reference pass's), keyed."""
    updater = parts.updater
    n_tokens = int(message_tokens(parts.chat, rollouts.episodes, agent))
    reference = updater._reference_pass(parts.team, agent, rollouts, n_tokens)
    keys = list(parts.team.backbone.parameters_of(agent).keys())
    assert reference.first_gradient is not None
    return {
        key: (torch.zeros(()) if g is None else g)
        for key, g in zip(keys, reference.first_gradient, strict=True)
    }


def reference_chunks(parts: Components, agent: int, rollouts: DialogueRollouts) -> list:
    """``agent``'s pre-update policy on the batch, as ``parts``' updater measures against it."""
    n_tokens = int(message_tokens(parts.chat, rollouts.episodes, agent))
    return parts.updater._reference_pass(parts.team, agent, rollouts, n_tokens).chunks


def measured_in(
    parts: Components, agent: int, rollouts: DialogueRollouts, tensors, references: list
) -> tuple[float, float]:
    """(KL, surrogate) of ``agent``'s adapter ``tensors`` against its initial one, as ``parts``'
    model measures them (the updater's own ``_kl_and_surrogate``, against ``references``:
    ``reference_chunks`` of the same parts, agent and batch)."""
    start = parts.team
    moved = start.with_agent(agent, AdapterWeights({k: v.clone() for k, v in tensors.items()}))
    moved.activate()
    measurement = parts.updater._kl_and_surrogate(moved, agent, rollouts, references)
    start.activate()
    return measurement.kl, measurement.surrogate


def logp_change(
    parts: Components, agent: int, rollouts: DialogueRollouts, tensors: dict[str, torch.Tensor]
) -> torch.Tensor:
    """How far the log-prob of every token ``agent`` sampled moves when its adapter goes from
    the start to ``tensors``, as ``parts``' model computes it (float64, in a fixed order)."""
    start = parts.team
    old = parts.sampler.agent_logps(start, rollouts.episodes, agent)
    moved = start.with_agent(agent, AdapterWeights({k: v.clone() for k, v in tensors.items()}))
    new = parts.sampler.agent_logps(moved, rollouts.episodes, agent)
    start.activate()
    return torch.cat([(new[key] - old[key]).double() for key in sorted(old)])


def by_kind(tensors: dict[str, torch.Tensor], kind: str) -> list[torch.Tensor]:
    return [t for key, t in tensors.items() if f".{kind}." in key or key.endswith(f"{kind}.weight")]


def compare(mine: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> dict[str, float]:
    keys = list(reference)
    out = {
        "cosine": cosine(flat([mine[k] for k in keys]), flat([reference[k] for k in keys])),
        "norm_ratio": float(flat([mine[k] for k in keys]).norm())
        / max(float(flat([reference[k] for k in keys]).norm()), 1e-300),
    }
    for kind in ("lora_A", "lora_B"):
        a, b = by_kind(mine, kind), by_kind(reference, kind)
        if a:
            # NaN where float32's is 0: A's gradient at B = 0 is exactly 0 in every precision.
            reference_norm = float(flat(b).norm())
            mine_norm = float(flat(a).norm())
            out[f"norm_ratio_{kind}"] = mine_norm / reference_norm if reference_norm else math.nan
    return out


def one_seed(base: RunConfig, seed: int, variants: list[str], log) -> dict[str, Any]:
    started = time.process_time()
    reference_parts = build_variant(base, "float32", seed)
    torch.manual_seed(seed)
    drawn = reference_parts.sampler.sample(reference_parts.team)
    log(
        f"seed {seed}: batch of {len(drawn.episodes)} dialogues, reward {drawn.mean_reward:.3f}, "
        f"{drawn.held_signal_groups} groups with signal ({time.process_time() - started:.0f} CPU-s)"
    )
    radius = base.stage.radius
    n_agents = reference_parts.team.n_agents
    float32_rollouts = rebound(drawn, reference_parts)
    rows: dict[str, dict[str, Any]] = {}
    reference_gradient: dict[int, dict[str, torch.Tensor]] = {}
    reference_step: dict[int, dict[str, torch.Tensor]] = {}
    reference_policy: dict[int, dict[str, torch.Tensor]] = {}
    reference_change: dict[int, torch.Tensor] = {}
    # The float32 pre-update policy every variant's step is measured against, once per agent.
    float32_references = {
        agent: reference_chunks(reference_parts, agent, float32_rollouts)
        for agent in range(n_agents)
    }
    for variant in variants:
        parts = reference_parts if variant == "float32" else build_variant(base, variant, seed)
        rollouts = float32_rollouts if variant == "float32" else rebound(drawn, parts)
        per_agent = {}
        for agent in range(n_agents):
            t0 = time.process_time()
            start = parts.team.agent(agent)
            gradient = first_gradient(parts, agent, rollouts)
            update = parts.updater.update(parts.team, agent, rollouts, radius)
            step = {k: update.policy.tensors[k] - start.tensors[k] for k in start.tensors}
            if variant == "float32":
                reference_gradient[agent], reference_step[agent] = gradient, step
                reference_policy[agent] = dict(update.policy.tensors)
                reference_change[agent] = logp_change(
                    parts, agent, rollouts, reference_policy[agent]
                )
            # The float32 update's own weights, through this variant's forward pass: the share
            # of float32's log-prob change it keeps (projection; 1 = all of it, 0 = none) and
            # the cosine (the rest is rounding noise, orthogonal to it).
            change = logp_change(parts, agent, rollouts, reference_policy[agent])
            wanted = reference_change[agent]
            kept = float(change @ wanted) / float(wanted @ wanted)
            kl_f32, surrogate_f32 = measured_in(
                reference_parts,
                agent,
                float32_rollouts,
                update.policy.tensors,
                float32_references[agent],
            )
            row = {
                "kl": update.kl,
                "surrogate": update.surrogate,
                "backtracks": update.backtracks,
                "kept": bool(update.accepted),
                "kl_in_float32": kl_f32,
                "signal_kept": kept,
                "signal_cosine": cosine(change, wanted),
                "surrogate_in_float32": surrogate_f32,
                "gradient": compare(gradient, reference_gradient[agent]),
                "step": compare(step, reference_step[agent]),
                "cpu_seconds": time.process_time() - t0,
            }
            per_agent[str(agent)] = row
            log(
                f"  {variant:>17} agent {agent}: KL {row['kl']:.4f} (in float32 {kl_f32:.4f}), "
                f"surrogate {row['surrogate']:.3f}, float32's step kept {kept:.3f} (cos "
                f"{row['signal_cosine']:.3f}), backtracks {row['backtracks']}, gradient cos "
                f"{row['gradient']['cosine']:.4f} norm x{row['gradient']['norm_ratio']:.3f}, step cos "
                f"{row['step']['cosine']:.4f} norm x{row['step']['norm_ratio']:.3f}"
            )
        rows[variant] = {
            "lora_sum": lora_sum_of(parts.team.backbone.model),
            "agents": per_agent,
        }
    return {
        "seed": seed,
        "batch_reward": drawn.mean_reward,
        "signal_groups": drawn.held_signal_groups,
        "variants": rows,
        "cpu_seconds": time.process_time() - started,
    }


def summary(seeds: list[dict[str, Any]], variants: list[str]) -> dict[str, dict[str, float]]:
    """Per variant, over every (seed, agent): means of the ratios to float32 and of the cosines
    (each over the seeds that measured it)."""
    out = {}
    for variant in variants:
        rows = [
            (row, seed["variants"]["float32"]["agents"][agent])
            for seed in seeds
            if variant in seed["variants"]
            for agent, row in seed["variants"][variant]["agents"].items()
        ]

        def mean(values: list[float]) -> float:
            finite = [v for v in values if math.isfinite(v)]
            return statistics.fmean(finite) if finite else math.nan

        def se(values: list[float]) -> float:
            finite = [v for v in values if math.isfinite(v)]
            return (
                statistics.stdev(finite) / math.sqrt(len(finite)) if len(finite) > 1 else math.nan
            )

        kl_ratio = [r["kl"] / f["kl"] if f["kl"] > 0 else math.nan for r, f in rows]
        kl_f32_ratio = [r["kl_in_float32"] / f["kl"] if f["kl"] > 0 else math.nan for r, f in rows]
        gain_ratio = [
            r["surrogate"] / f["surrogate"] if f["surrogate"] > 0 else math.nan for r, f in rows
        ]
        out[variant] = {
            "updates": len(rows),
            "kl_ratio": mean(kl_ratio),
            "kl_ratio_se": se(kl_ratio),
            "kl_in_float32_ratio": mean(kl_f32_ratio),
            "surrogate_ratio": mean(gain_ratio),
            "gradient_cosine": mean([r["gradient"]["cosine"] for r, _ in rows]),
            "gradient_norm_ratio": mean([r["gradient"]["norm_ratio"] for r, _ in rows]),
            "step_cosine": mean([r["step"]["cosine"] for r, _ in rows]),
            "step_norm_ratio": mean([r["step"]["norm_ratio"] for r, _ in rows]),
            "backtracks": mean([float(r["backtracks"]) for r, _ in rows]),
            "kl": mean([r["kl"] for r, _ in rows]),
            "signal_kept": mean([r["signal_kept"] for r, _ in rows]),
            "signal_kept_se": se([r["signal_kept"] for r, _ in rows]),
            "signal_cosine": mean([r["signal_cosine"] for r, _ in rows]),
        }
    return out


def markdown(table: dict[str, dict[str, float]]) -> str:
    lines = [
        "| variant | updates | KL ÷ float32's | the same step's KL in float32 ÷ float32's | "
        "surrogate ÷ float32's | float32's step: change kept | its cosine | gradient cosine | gradient norm ÷ | step cosine | step norm ÷ | "
        "backtracks |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for variant, row in table.items():
        lines.append(
            f"| {variant} | {row['updates']} | {row['kl_ratio']:.2f} ± {row['kl_ratio_se']:.2f} | "
            f"{row['kl_in_float32_ratio']:.2f} | {row['surrogate_ratio']:.2f} | "
            f"{row['signal_kept']:.2f} ± {row['signal_kept_se']:.2f} | {row['signal_cosine']:.3f} | "
            f"{row['gradient_cosine']:.4f} | {row['gradient_norm_ratio']:.3f} | "
            f"{row['step_cosine']:.4f} | {row['step_norm_ratio']:.3f} | {row['backtracks']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="default", help="config file or shipped name")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, choices=list(VARIANTS))
    parser.add_argument("--quick", action="store_true", help="the tiny random model")
    parser.add_argument("--json", type=Path, help="write the measurements here (after each seed)")
    args = parser.parse_args(argv)
    if "float32" not in args.variants:
        args.variants.insert(0, "float32")
    args.variants.sort(key=lambda v: v != "float32")  # the reference first
    torch.set_num_threads(1)
    base = load_config(args.config)
    if args.quick:
        base = dataclasses.replace(
            base, model=dataclasses.replace(base.model, source="tiny", sources=())
        )
    result: dict[str, Any] = {
        "config": args.config,
        "source": base.model.source,
        "learning_rate": base.updater.learning_rate,
        "radius": base.stage.radius,
        "seeds": [],
    }
    if args.json is not None and args.json.is_file():
        # Seeds measured before (with the same config) are kept: a study grows seed by seed.
        before = json.loads(args.json.read_text())
        if before.get("config") == args.config and before.get("source") == base.model.source:
            result["seeds"] = [s for s in before["seeds"] if s["seed"] not in args.seeds]
    for seed in args.seeds:
        result["seeds"].append(
            one_seed(base, seed, args.variants, lambda line: print(line, flush=True))
        )
        measured = [v for v in VARIANTS if any(v in s["variants"] for s in result["seeds"])]
        result["summary"] = summary(result["seeds"], measured)
        if args.json is not None:  # after every seed: a long run keeps what it measured
            args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(result["summary"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
