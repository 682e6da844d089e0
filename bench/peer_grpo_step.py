"""One GRPO step of teamtr against one of TRL's ``GRPOTrainer`` on the same work, side by side.

The work, the same for both: SmolLM2-135M-Instruct (float32, on the CPU, one torch thread), one
LoRA adapter of ``configs/compare/grpo.toml``'s ``[lora]`` (rank 16, alpha 32, every linear
layer, no dropout), the 8 problems of that config's first batch, rendered as teamtr renders
them, 4 samples each at temperature 1.0 of at most 48 new tokens, then one Adam step of 2e-4
on the 32 answers. Both are graded 1, 0, 1, 0, ... (as ``bench/llm_stage_profile.py
--signal-every-update``): every group then holds differing rewards, so that both steps do
their full work whatever the model answers (a batch without a signal costs teamtr no update).

What each step does beyond that is each library's own, and the report says so:

- teamtr: one stage of the config through ``llm.training.train.train`` (sampling with the
  log-probs recorded, the reference pass, one clipped policy-gradient step, the KL measurement
  of the trust region, the stage record and a checkpoint); its CPU is the stage's own
  ``cpu_seconds`` in ``metrics.jsonl``.
- TRL: ``GRPOTrainer.train`` for ``max_steps = 1`` (generation, the loss and its backward pass,
  the optimiser step), with ``beta = 0`` (no reference model: teamtr's GRPO keeps none either),
  ``num_iterations = 1`` and without gradient checkpointing (TRL's default is on, which would
  cost it a second forward pass); its CPU is ``time.process_time`` around ``train``.

Model loading is outside both clocks. The repeats alternate teamtr, TRL, teamtr, TRL, ... in
one process, so that both see the same machine; the figure is the ratio of the medians.

TRL is not a dependency of teamtr. ``make peers`` builds ``.venv-peers`` (teamtr, TRL 1.16 and
CoMLRL 1.4 with their own dependencies, the CPU torch pinned):

    make peers
    OMP_NUM_THREADS=1 .venv-peers/bin/python bench/peer_grpo_step.py --repeats 2 \\
        --json results/peer_grpo_step.json
    OMP_NUM_THREADS=1 .venv-peers/bin/python bench/peer_grpo_step.py --repeats 2 --bf16 \\
        --json results/peer_grpo_step_bf16.json   # both in bfloat16
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from graded_rollouts import AlternatingRewards, alternating  # noqa: E402
from trl_grpo import grpo_config, trainable_by_trl  # noqa: E402

from llm.common.config import RunConfig, load_config  # noqa: E402
from llm.models.loading import load_model, load_tokenizer  # noqa: E402
from llm.training.builder import build  # noqa: E402
from llm.training.train import train  # noqa: E402

CONFIG = ROOT / "configs" / "compare" / "grpo.toml"


def step_config(scratch: Path, seed: int, source: str, dtype: str = "float32") -> RunConfig:
    config = load_config(CONFIG)
    return dataclasses.replace(
        config,
        model=dataclasses.replace(config.model, source=source, sources=()),
        sampler=dataclasses.replace(config.sampler, seed=seed),
        stage=dataclasses.replace(config.stage, stages=1),
        run=dataclasses.replace(
            config.run,
            output_dir=str(scratch),
            name=f"teamtr-{seed}",
            seed=seed,
            eval_every=0,
            checkpoint_every=1,
            threads=1,
            time_budget_minutes=0.0,
            dtype=dtype,
        ),
    )


def first_prompts(config: RunConfig, tokenizer: Any) -> list[str]:
    """The first batch's problems as teamtr's single agent sees them, as text that
    ``tokenizer`` (as TRL calls it) turns back into teamtr's token ids."""
    parts = build(config, progress=False)
    episodes = parts.sampler.new_episodes()
    ids = [parts.chat.context(e, 0) for e in episodes[:: config.sampler.group_size]]
    prompts = [tokenizer.decode(i, skip_special_tokens=False) for i in ids]
    # TRL tokenises a text prompt itself: the ids must be teamtr's, or the work differs.
    if any(tokenizer(p)["input_ids"] != i for p, i in zip(prompts, ids, strict=True)):
        raise SystemExit("TRL's tokenisation of the prompts differs from teamtr's")
    return prompts


def teamtr_step(config: RunConfig) -> dict[str, Any]:
    parts = build(config, progress=False)
    parts.sampler = AlternatingRewards(
        parts.chat, parts.sampler.router, parts.sampler.task, parts.sampler.settings
    )
    run_dir = train(config, progress=False, parts=parts)
    record = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    (update,) = record["updates"]
    return {
        "cpu_seconds": record["cpu_seconds"],
        "generated_tokens": record["generated_tokens"],
        "updated": bool(update["kept"]),
    }


def trl_step(
    config: RunConfig,
    prompts: list[str],
    tokenizer: Any,
    scratch: Path,
    seed: int,
    bf16: bool = False,
) -> dict[str, Any]:
    from datasets import Dataset
    from trl import GRPOTrainer

    s = config.sampler
    model = load_model(config.model.source, seed=seed)
    model = trainable_by_trl(model)
    model.train()
    tokens: list[int] = []

    def reward(completions, **_) -> list[float]:
        return alternating(len(completions))

    def count_tokens(completion_ids, **_) -> list[float]:
        tokens.extend(len(c) for c in completion_ids)
        return [0.0] * len(completion_ids)

    args = grpo_config(
        config,
        str(scratch / f"trl-{seed}"),
        seed,
        per_device_train_batch_size=s.prompts_per_batch * s.group_size,
        max_steps=1,
        bf16=bf16,  # TRL's mixed precision: float32 weights, bfloat16 autocast
        reward_weights=[1.0, 0.0],
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward, count_tokens],
        args=args,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tokenizer,
        peft_config=config.lora.peft_config(),
    )
    started = time.process_time()
    trainer.train()
    return {"cpu_seconds": time.process_time() - started, "generated_tokens": sum(tokens)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="steps of each, alternating")
    parser.add_argument("--source", default="smollm2", help='"smollm2" or "tiny" (a check)')
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument(
        "--bf16",
        action="store_true",
        help="both in bfloat16: teamtr [run] dtype = bfloat16, TRL GRPOConfig(bf16=True)",
    )
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    torch.set_num_threads(1)
    runs: dict[str, list[dict[str, Any]]] = {"teamtr": [], "trl": []}
    tokenizer = load_tokenizer(args.source)
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        for repeat in range(args.repeats):
            dtype = "bfloat16" if args.bf16 else "float32"
            config = step_config(scratch, seed=repeat, source=args.source, dtype=dtype)
            prompts = first_prompts(config, tokenizer)
            runs["teamtr"].append(teamtr_step(config))
            runs["trl"].append(trl_step(config, prompts, tokenizer, scratch, repeat, args.bf16))
            print(
                f"repeat {repeat}: teamtr {runs['teamtr'][-1]['cpu_seconds']:.1f} CPU-s "
                f"({runs['teamtr'][-1]['generated_tokens']} tokens), "
                f"TRL {runs['trl'][-1]['cpu_seconds']:.1f} CPU-s "
                f"({runs['trl'][-1]['generated_tokens']} tokens)",
                flush=True,
            )
    medians = {k: statistics.median(r["cpu_seconds"] for r in v) for k, v in runs.items()}
    result = {
        "command": " ".join(["bench/peer_grpo_step.py", *(argv or sys.argv[1:])]),
        "source": args.source,
        "threads": 1,
        "bf16": args.bf16,
        "runs": runs,
        "median_cpu_seconds": medians,
        "teamtr_over_trl": medians["teamtr"] / medians["trl"],
    }
    print(
        f"one GRPO step, median of {args.repeats}: teamtr {medians['teamtr']:.1f} CPU-s, "
        f"TRL GRPOTrainer {medians['trl']:.1f} CPU-s, teamtr / TRL = "
        f"{result['teamtr_over_trl']:.2f}"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
