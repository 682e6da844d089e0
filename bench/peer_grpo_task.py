"""TRL's ``GRPOTrainer`` trained on a teamtr config's task, for a CPU budget: the TRL arm of an
equal-CPU comparison with a teamtr team and single agent on the same problems and reward.

The work: the config's model (``[model] source``, float32, one torch thread) with one LoRA
adapter of its ``[lora]``, its single agent's prompt (system prompt and question, rendered as
teamtr renders the first turn of a one-agent team, so that the token ids are teamtr's), its
task's training problems (drawn by ``Task.draw`` from ``--seed``) and its reward
(``Task.returns`` on a one-turn dialogue whose message is the completion). GRPO groups of
``[sampler] group_size`` completions of at most ``[sampler] max_new_tokens`` at its temperature,
``prompts_per_batch`` prompts a step, one Adam step of ``[updater] learning_rate`` a batch
(``beta = 0``: no reference model, ``num_iterations = 1``). Training stops after the step during
which this process's CPU time passed ``--cpu-minutes`` (teamtr's ``[run] budget_clock = "cpu"``).

The held-out problems are the task's own, each answered greedily (one turn, the same prompt and
length) before and after training and scored by ``Task.score``: the held-out accuracy of
``teamtr eval`` on the same config's single agent.

TRL is not a dependency of teamtr. ``make peers`` builds ``.venv-peers``; reasoning-gym's tasks
need ``.venv-peers/bin/pip install reasoning-gym==0.1.25`` there too:

    OMP_NUM_THREADS=1 .venv-peers/bin/python bench/peer_grpo_task.py \\
        --config reasoning/chain_sum_single --seed 0 --cpu-minutes 30 \\
        --json results/reasoning_gym/trl/chain_sum-s0.json
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trl_grpo import grpo_config, trainable_by_trl  # noqa: E402

from llm.common.config import ConfigError, RunConfig, load_config, parse_override  # noqa: E402
from llm.models.loading import load_model, load_tokenizer  # noqa: E402
from llm.problems.task import Dialogue, Task  # noqa: E402
from llm.problems.tasks import Problem  # noqa: E402
from llm.training.builder import build, configured_task  # noqa: E402

TRAIN_PROMPTS = 20_000
"""Training problems drawn up front: more than any CPU budget here consumes."""


def prompts_of(
    config: RunConfig, problem_lists: list[list[Problem]], tokenizer: Any
) -> list[list[str]]:
    """Each problem's first-turn context as teamtr's single agent sees it, as text that
    ``tokenizer`` (as TRL calls it) turns back into teamtr's token ids. teamtr's components
    (its model and kept-context memory) are built once for this and let go before TRL loads."""
    parts = build(config, progress=False)
    rendered = []
    for problems in problem_lists:
        ids = [parts.chat.context(parts.sampler.open_episode(p, 0), 0) for p in problems]
        prompts = [tokenizer.decode(i, skip_special_tokens=False) for i in ids]
        if any(tokenizer(p)["input_ids"] != i for p, i in zip(prompts[:64], ids, strict=False)):
            raise SystemExit("TRL's tokenisation of the prompts differs from teamtr's")
        rendered.append(prompts)
    parts.sampler.close()
    del parts
    gc.collect()
    return rendered


def held_out_accuracy(
    model: Any, tokenizer: Any, task: Task, prompts: list[str], max_new_tokens: int
) -> dict[str, float]:
    """Greedy one-turn answers to the held-out problems, scored by the task's metric."""
    model.eval()
    scores = []
    with torch.no_grad():
        for problem, prompt in zip(task.test, prompts, strict=True):
            ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
            out = model.generate(
                ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0
            )
            message = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
            scores.append(task.score(Dialogue(problem, (message,), (0,))))
    model.train()
    mean = float(np.mean(scores))
    return {
        "accuracy": mean,
        "standard_error": math.sqrt(mean * (1 - mean) / len(scores)),
        "n": len(scores),
    }


class CpuBudget:
    """A TRL callback: stop after the step during which the process's CPU time passed the
    budget (teamtr's ``time_budget_minutes`` on the ``"cpu"`` clock)."""

    def __init__(self, seconds: float) -> None:
        from transformers import TrainerCallback

        budget = self

        class Stop(TrainerCallback):
            def on_step_end(self, args, state, control, **_):  # noqa: ANN001
                budget.steps = state.global_step
                if time.process_time() - budget.started >= seconds:
                    control.should_training_stop = True
                return control

        self.callback = Stop()
        self.started = time.process_time()
        self.steps = 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="a one-agent teamtr config")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpu-minutes", type=float, required=True)
    parser.add_argument("--source", default="", help="replace [model] source (tiny: a check)")
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="replace one key of the config, as `teamtr train --set` does (repeatable)",
    )
    parser.add_argument(
        "--skip-untrained",
        action="store_true",
        help="do not score the untrained model (it is `teamtr eval`'s score of the same config)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    try:
        config = load_config(args.config, [parse_override(text) for text in args.overrides])
    except ConfigError as error:
        parser.error(str(error))
    if args.source:
        config = dataclasses.replace(
            config, model=dataclasses.replace(config.model, source=args.source, sources=())
        )
    if config.team.n_agents != 1 or config.sampler.turns != 1:
        parser.error("--config: a one-agent, one-turn config (reasoning/<name>_single)")
    task = configured_task(config)
    s = config.sampler
    tokenizer = load_tokenizer(config.model.source)
    train = task.draw(np.random.default_rng(args.seed), TRAIN_PROMPTS)
    train_prompts, test_prompts = prompts_of(config, [train, list(task.test)], tokenizer)

    from datasets import Dataset
    from trl import GRPOTrainer

    model = load_model(config.model.source, seed=args.seed)
    model = trainable_by_trl(model)
    tokens: list[int] = []

    def reward(completions, index, completion_ids, **_) -> list[float]:  # noqa: ANN001
        tokens.extend(len(c) for c in completion_ids)
        return [
            task.returns(Dialogue(train[i], (c,), (0,))).value
            for c, i in zip(completions, index, strict=True)
        ]

    budget = CpuBudget(args.cpu_minutes * 60)
    with tempfile.TemporaryDirectory() as scratch:
        grpo = grpo_config(
            config,
            scratch,
            args.seed,
            # One group a forward pass, the batch's groups accumulated into one Adam step (TRL
            # generates the whole batch at once and normalises the loss over all its tokens):
            # the same step as one pass over the batch, without all its logits in memory at once.
            per_device_train_batch_size=s.group_size,
            gradient_accumulation_steps=s.prompts_per_batch,
            max_steps=TRAIN_PROMPTS // s.prompts_per_batch,
        )
        data = Dataset.from_dict({"prompt": train_prompts, "index": list(range(len(train)))})
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[reward],
            args=grpo,
            train_dataset=data,
            processing_class=tokenizer,
            peft_config=config.lora.peft_config(),
            callbacks=[budget.callback],
        )
        untrained = (
            None
            if args.skip_untrained
            else held_out_accuracy(trainer.model, tokenizer, task, test_prompts, s.longest_message)
        )
        budget.started = time.process_time()
        trainer.train()
        cpu_seconds = time.process_time() - budget.started
        trained = held_out_accuracy(trainer.model, tokenizer, task, test_prompts, s.longest_message)
    result = {
        "command": " ".join(["bench/peer_grpo_task.py", *(argv or sys.argv[1:])]),
        "config": args.config,
        "seed": args.seed,
        "source": config.model.source,
        "cpu_seconds": cpu_seconds,
        "steps": budget.steps,
        "generated_tokens": sum(tokens),
        "untrained": untrained,
        "trained": trained,
    }
    print(
        f"TRL GRPOTrainer on {args.config}, seed {args.seed}: held out "
        f"{'not scored' if untrained is None else format(untrained['accuracy'], '.3f')} -> "
        f"{trained['accuracy']:.3f} in {budget.steps} steps, "
        f"{cpu_seconds / 60:.1f} CPU-minutes"
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
