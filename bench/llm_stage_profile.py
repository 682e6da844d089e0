"""Where one training stage's CPU time goes, before and after the cheaper update, side by side.

Three cases, each one real stage through ``llm.training.train.train`` (sampling, updates, certificate,
metrics, TensorBoard, checkpoint), profiled with ``llm.common.profiling`` (exclusive CPU seconds per
part, ``time.process_time`` with one torch thread):

- ``teamtr``: one stage of ``configs/compare/teamtr.toml`` (the three-agent format the profile
  was measured with: 32 dialogues of 3 turns of <= 24 tokens);
- ``stale``: the same config with ``scheme = "stale"``;
- ``grpo``: one step of ``configs/compare/grpo.toml`` (one agent, 32 answers of 48 tokens).

Each case runs twice from the same freshly built team and seeds: ``before`` is the
straightforward computation (every gradient and reference log-softmax recomputed, every
transcript scored in full, every agent's behaviour log-probs at every sampling round:
``reuse_work=False`` in sampler and updater),
``after`` reuses what is exact to reuse (``llm.update.updater``, ``llm.update.backtracking``,
``llm.logprobs.scoring``). Both are timed in one process on the same machine, one after the other.

``generation`` measures the sampler against what the hardware allows on the same batch (the
first turn of the default batch): the sampler's ``model.generate`` call on whole contexts and
with each group's prompt run once (``prompt_lengths``, the ``after`` path), the same number of decoding steps as bare forward passes with
a static key/value cache (no sampling, no generation loop machinery), and one teacher-forced
forward pass over the same tokens (the floor: every token's compute in one batched call).

Usage: ``OMP_NUM_THREADS=1 .venv/bin/python bench/llm_stage_profile.py [--quick] [--json OUT]``
(``--signal-every-update``: the real model's rollouts graded 1, 0, 1, 0, ... as in ``--quick``,
so that the stages compared all do three updates' work, whatever the draw held);
``--table OUT`` prints a written report's tables again (markdown). ``--quick`` runs
the tiny random model on a smaller batch (seconds; ``make test`` runs it): a random model never
answers right, so its rollouts are graded 1, 0, 1, 0, ... to give every update a signal.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from graded_rollouts import AlternatingRewards

from llm.common import profiling
from llm.common.config import RunConfig, load_config
from llm.engines.hf.messages import generate_messages
from llm.training.builder import Components, build
from llm.training.train import train

ROOT = Path(__file__).resolve().parent.parent
CASES = {
    "teamtr": (ROOT / "configs" / "compare" / "teamtr.toml", "teamtr"),
    "stale": (ROOT / "configs" / "compare" / "teamtr.toml", "stale"),
    "grpo": (ROOT / "configs" / "compare" / "grpo.toml", "teamtr"),
}
PATHS = ("before", "after")
GROUPS = {
    "sampling (generate)": ("sampling turn",),
    "merge into generation copy": ("merge",),
    "behaviour log-probs": ("behaviour log-probs",),
    "reference logits (+ first gradient after)": ("reference logits",),
    "train forward": ("train forward",),
    "train backward": ("train backward",),
    "adam step": ("adam step",),
    "kl measurement": ("kl measurement",),
    "backtracks (forward, backward, kl, step)": ("backtrack ",),
    "snapshot and restore": ("snapshot and restore",),
    "certificate and stage loop": ("certificate and stage loop",),
    "checkpoint": ("checkpoint",),
    "logging": ("logging",),
    "grading": ("grading",),
}
"""Table rows: the profile's sections grouped by name prefix (first match wins)."""


def case_config(
    case: str, source: str, quick: bool, output_dir: Path, label: str, seed: int | None = None
) -> RunConfig:
    path, scheme = CASES[case]
    config = load_config(path)
    sampler = config.sampler
    if seed is not None:  # the problems drawn and the samples: another stage of the same run
        sampler = dataclasses.replace(sampler, seed=seed)
    if quick:
        sampler = dataclasses.replace(
            sampler,
            prompts_per_batch=2,
            group_size=4,
            max_new_tokens=min(sampler.longest_message, 8),
            score_chunk=4,
        )
    return dataclasses.replace(
        config,
        model=dataclasses.replace(config.model, source=source, sources=()),
        sampler=sampler,
        stage=dataclasses.replace(config.stage, scheme=scheme, stages=1),
        run=dataclasses.replace(
            config.run,
            output_dir=str(output_dir),
            name=f"{case}-{label}",
            seed=config.run.seed if seed is None else seed,
            eval_every=0,
            checkpoint_every=1,
            threads=1,
            time_budget_minutes=0.0,
        ),
    )


def grouped(parts: dict[str, dict[str, float]]) -> dict[str, float]:
    table = dict.fromkeys(GROUPS, 0.0)
    for name, part in parts.items():
        for row, prefixes in GROUPS.items():
            if name.startswith(prefixes):
                table[row] += part["cpu_seconds"]
                break
        else:
            table[name] = table.get(name, 0.0) + part["cpu_seconds"]
    return table


def profile_stage(
    case: str,
    path: str,
    source: str,
    quick: bool,
    scratch: Path,
    seed: int | None = None,
    alternating: bool = False,
) -> dict[str, Any]:
    config = case_config(case, source, quick, scratch, path, seed)
    parts: Components = build(config)
    reuse = path == "after"
    if quick or alternating:
        parts.sampler = AlternatingRewards(
            parts.chat, parts.sampler.router, parts.sampler.task, parts.sampler.settings
        )
    parts.sampler.reuse_work = reuse
    parts.updater.reuse_work = reuse
    torch.manual_seed(0)
    with profiling.recording() as profile:
        run_dir = train(config, progress=False, parts=parts)
    record = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    result = profile.to_dict()
    result["table"] = grouped(result["parts"])  # type: ignore[arg-type]
    result["table"]["unattributed"] = profile.unattributed_seconds
    result["paths"] = {
        "sampler_reuse_work": parts.sampler.reuse_work,
        "updater_reuse_work": parts.updater.reuse_work,
        "updater_share_prompt": parts.updater.share_prompt,
    }
    result["updates"] = record["updates"]
    result["certificate"] = record["certificate"]
    result["generated_tokens"] = record["generated_tokens"]
    result["episodes"] = config.sampler.prompts_per_batch * config.sampler.group_size
    # What the float32 resolution of the recorded KL and surrogate depends on (the tests
    # derive their tolerances from it): vocabulary, tokens per message, turns, A_max.
    result["numerics"] = {
        "vocabulary": parts.team.backbone.training_model(0).get_output_embeddings().out_features,
        "longest_message": config.sampler.longest_message,
        "turns": config.sampler.turns,
        "a_max": config.sampler.a_max,
    }
    return result


def generation_limit(source: str, quick: bool, scratch: Path) -> dict[str, float]:
    """The sampler's first turn on the default batch against bare forward passes of it."""
    config = case_config("stale", source, quick, scratch, "generation")
    parts = build(config)
    sampler, chat = parts.sampler, parts.chat
    episodes = sampler.new_episodes()
    contexts = [chat.context(e, 0) for e in episodes]
    model = sampler.engine.speaker_model(parts.team, 0)
    s = sampler.settings
    torch.manual_seed(0)
    started = time.process_time()
    messages = generate_messages(model, contexts, chat, s.max_tokens_of(0), s.temperature)
    sampler_seconds = time.process_time() - started
    torch.manual_seed(0)
    started = time.process_time()
    shared = generate_messages(
        model, contexts, chat, s.max_tokens_of(0), s.temperature, [len(e.prompt) for e in episodes]
    )
    shared_seconds = time.process_time() - started
    steps = max(len(m) for m in messages)
    generated = sum(len(m) for m in messages)
    # The same batch, left-padded as the sampler does, continued with the sampled tokens.
    length = max(len(c) for c in contexts)
    rows = len(contexts)
    input_ids = torch.full((rows, length + steps), chat.pad_id, dtype=torch.long)
    attention = torch.zeros((rows, length + steps), dtype=torch.long)
    for row, (context, message) in enumerate(zip(contexts, messages, strict=True)):
        input_ids[row, length - len(context) : length] = torch.tensor(context)
        input_ids[row, length : length + len(message)] = torch.tensor(message)
        attention[row, length - len(context) :] = 1
    from transformers import StaticCache

    with torch.no_grad():
        cache = StaticCache(config=model.config, max_cache_len=length + steps)
        started = time.process_time()
        position = (attention[:, :length].cumsum(-1) - 1).clamp(min=0)
        out = model(
            input_ids=input_ids[:, :length],
            attention_mask=attention[:, :length],
            position_ids=position,
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        for step in range(steps - 1):
            end = length + step + 1
            out = model(
                input_ids=input_ids[:, end - 1 : end],
                attention_mask=attention[:, :end],
                position_ids=attention[:, :end].sum(-1, keepdim=True) - 1,
                cache=out.cache,
                use_cache=True,
                cache_position=torch.tensor([end - 1]),
                logits_to_keep=1,
            )
        static_seconds = time.process_time() - started
        started = time.process_time()
        model(input_ids=input_ids, attention_mask=attention, logits_to_keep=steps)
        one_pass_seconds = time.process_time() - started
    return {
        "rows": float(rows),
        "decoding_steps": float(steps),
        "generated_tokens": float(generated),
        "sampler_cpu_seconds": sampler_seconds,
        "sampler_sharing_prompts_cpu_seconds": shared_seconds,
        "same_samples_sharing_prompts": float(shared == messages),
        "static_cache_forwards_cpu_seconds": static_seconds,
        "one_teacher_forced_pass_cpu_seconds": one_pass_seconds,
        "sampler_tokens_per_cpu_second": generated / sampler_seconds,
        "ratio_sampler_over_static_cache_forwards": sampler_seconds / static_seconds,
        "ratio_sampler_sharing_prompts_over_static_cache_forwards": shared_seconds / static_seconds,
        "ratio_sampler_over_one_pass": sampler_seconds / one_pass_seconds,
    }


def goals(cases: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """The two targets per path: a team update against a GRPO step, teamtr against stale."""
    out: dict[str, dict[str, float]] = {}
    for path in PATHS:
        if not all(path in cases.get(c, {}) for c in CASES):
            continue
        teamtr, stale, grpo = (cases[c][path] for c in ("teamtr", "stale", "grpo"))
        per_update = teamtr["total_cpu_seconds"] / len(teamtr["updates"])
        out[path] = {
            "teamtr_cpu_seconds_per_update": per_update,
            "grpo_step_cpu_seconds": grpo["total_cpu_seconds"],
            "ratio_team_update_over_grpo_step": per_update / grpo["total_cpu_seconds"],
            "ratio_teamtr_over_stale_stage": teamtr["total_cpu_seconds"]
            / stale["total_cpu_seconds"],
        }
    if "before" in out and "after" in out:
        for case in CASES:
            out.setdefault("speedup", {})[case] = (
                cases[case]["before"]["total_cpu_seconds"]
                / cases[case]["after"]["total_cpu_seconds"]
            )
    return out


def print_table(report: dict[str, Any]) -> None:
    """The report as markdown: CPU seconds per part and path, then counts, goals, generation."""
    cases = report["cases"]
    columns = [(c, p) for c in cases for p in PATHS if p in cases[c]]
    rows = list(dict.fromkeys(r for c, p in columns for r in cases[c][p]["table"]))
    print("| CPU seconds | " + " | ".join(f"{c} {p}" for c, p in columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for row in [*rows, "**total**"]:
        values = [
            cases[c][p]["total_cpu_seconds"]
            if row == "**total**"
            else cases[c][p]["table"].get(row, 0.0)
            for c, p in columns
        ]
        print(f"| {row} | " + " | ".join(f"{v:.1f}" for v in values) + " |")
    counts = sorted({k for c, p in columns for k in cases[c][p]["counts"]})
    for key in counts:
        values = [cases[c][p]["counts"].get(key, 0.0) for c, p in columns]
        print(f"| {key} | " + " | ".join(f"{v:.0f}" for v in values) + " |")
    backtracks = [sum(u["backtracks"] for u in cases[c][p]["updates"]) for c, p in columns]
    print("| backtracks | " + " | ".join(str(b) for b in backtracks) + " |")
    print()
    for path, values in report.get("goals", {}).items():
        print(f"- {path}: " + ", ".join(f"{k} = {v:.3g}" for k, v in values.items()))
    for key, value in report.get("generation", {}).items():
        print(f"- generation {key} = {value:.4g}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, small batch")
    parser.add_argument("--source", help="model source (default: smollm2; tiny with --quick)")
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--no-generation", action="store_true", help="skip the generation limit")
    parser.add_argument(
        "--seed", type=int, help="run and sampler seed instead of the configs' (other problems)"
    )
    parser.add_argument(
        "--signal-every-update",
        action="store_true",
        help="grade the real rollouts 1, 0, 1, 0, ... so that every update carries a signal",
    )
    parser.add_argument("--json", default=None, help="write the report here (after every case)")
    parser.add_argument("--table", metavar="JSON", help="only print the tables of a report")
    args = parser.parse_args()
    if args.table:
        print_table(json.loads(Path(args.table).read_text()))
        return
    source = args.source or ("tiny" if args.quick else "smollm2")
    torch.set_num_threads(1)
    # Imported once per process by the first run; not a cost of any stage.
    importlib.import_module("torch.utils.tensorboard")

    report: dict[str, Any] = {
        "source": source,
        "quick": args.quick,
        "threads": torch.get_num_threads(),
        "seed": args.seed,
        "signal_every_update": args.quick or args.signal_every_update,
        "command": " ".join(["bench/llm_stage_profile.py", *sys.argv[1:]]),
        "cases": {},
    }

    def save() -> None:
        report["goals"] = goals(report["cases"])
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(report, indent=1) + "\n")

    with tempfile.TemporaryDirectory() as scratch:
        if not args.no_generation:
            report["generation"] = generation_limit(source, args.quick, Path(scratch))
            save()
        for case in args.cases:
            for path in args.paths:
                print(f"profiling {case} ({path}) ...", file=sys.stderr, flush=True)
                result = profile_stage(
                    case,
                    path,
                    source,
                    args.quick,
                    Path(scratch),
                    args.seed,
                    args.signal_every_update,
                )
                report["cases"].setdefault(case, {})[path] = result
                save()
    print_table(report)


if __name__ == "__main__":
    main()
