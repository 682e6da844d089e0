"""Training runs: build a team from a config, run stages of the core loop, log and checkpoint.

Every scheme goes through ``teamtr.stage.run_stage``; the single-agent GRPO baseline is the
same loop with ``n_agents = 1`` (one adapter speaks every turn).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from llm.agents import AdapterWeights, LoraBackbone, LoraTeam
from llm.config import RunConfig
from llm.dialogue import ChatFormat
from llm.evaluation import evaluate_team
from llm.loading import load_model, load_tokenizer
from llm.router import make_router
from llm.sampler import DialogueRollouts, DialogueSampler
from llm.tasks import ArithmeticSuite, Problem, load_jsonl
from llm.updater import TrustRegionUpdater
from teamtr.config import StageConfig
from teamtr.penalty import EpisodicPenalty
from teamtr.reports import StageReport
from teamtr.stage import run_stage


@dataclass
class Components:
    """Everything a run needs, built once from a config."""

    config: RunConfig
    chat: ChatFormat
    team: LoraTeam
    sampler: DialogueSampler
    updater: TrustRegionUpdater
    test_problems: list[Problem]


def problem_sources(config: RunConfig):
    task = config.task
    if task.kind == "jsonl":
        train = load_jsonl(task.train_file)
        test = load_jsonl(task.test_file) if task.test_file else []

        def draw(rng: np.random.Generator, count: int) -> list[Problem]:
            return [train[int(i)] for i in rng.integers(len(train), size=count)]

        return draw, test[: task.eval_size]
    suite = ArithmeticSuite(task.difficulty)
    return (
        lambda rng, count: suite.sample("train", count, rng),
        suite.fixed_set("test", task.eval_size, seed=task.eval_seed),
    )


def build(config: RunConfig) -> Components:
    if config.run.threads:
        torch.set_num_threads(config.run.threads)
    tokenizer = load_tokenizer(config.model.source)
    base = load_model(config.model.source, vocab_size=len(tokenizer), seed=config.run.seed)
    backbone = LoraBackbone.create(base, config.team.n_agents, config.lora, seed=config.run.seed)
    chat = ChatFormat.from_tokenizer(
        tokenizer, config.team.n_agents, config.team.system_prompt, config.team.role_prompts
    )
    router = make_router(config.team.router, config.team.n_agents, config.team.speaking_order)
    draw, test = problem_sources(config)
    sampler = DialogueSampler(chat, router, draw, config.sampler)
    updater = TrustRegionUpdater(
        chat, config.updater, config.sampler.temperature, config.sampler.score_chunk
    )
    return Components(config, chat, backbone.initial_team(), sampler, updater, test)


class RecordingSampler:
    """Delegates to a DialogueSampler and remembers what each call cost (for metrics)."""

    def __init__(self, inner: DialogueSampler) -> None:
        self.inner = inner
        self.calls: list[DialogueRollouts] = []

    def sample(self, team, *, previous=None, updated_agent=None):
        rollouts = self.inner.sample(team, previous=previous, updated_agent=updated_agent)
        self.calls.append(rollouts)
        return rollouts

    def importance_weighted(self, rollouts, team):
        return self.inner.importance_weighted(rollouts, team)


def stage_metrics(
    stage: int, report: StageReport, calls: list[DialogueRollouts], seconds: float
) -> dict[str, Any]:
    first = calls[0] if calls else None
    return {
        "stage": stage,
        "scheme": report.scheme,
        "order": list(report.order),
        "certificate": report.certificate,
        "train_reward": first.mean_reward if first else None,
        "train_parse_failure_rate": first.parse_failure_rate if first else None,
        "generated_tokens": sum(c.generated_tokens for c in calls),
        "reused_turns": sum(c.reused_turns for c in calls),
        "sampling_seconds": sum(c.wall_seconds for c in calls),
        "wall_seconds": seconds,
        "updates": [
            {
                "agent": r.agent,
                "kept": r.kept,
                "accepted": r.update.accepted,
                "surrogate": r.update.surrogate,
                "kl": r.update.kl,
                "kl_quantile": r.update.kl_quantile,
                "backtracks": r.update.backtracks,
                "penalty": r.penalty,
                "certificate": r.certificate,
            }
            for r in report.records
        ],
    }


def save_checkpoint(
    directory: Path, team: LoraTeam, updater: TrustRegionUpdater, stage: int, rng_state: dict
) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for index, policy in enumerate(team.policies):
        save_file(
            {k: v.contiguous() for k, v in policy.tensors.items()},
            directory / f"agent{index}.safetensors",
        )
    torch.save(
        {
            "optimizers": {k: o.state_dict() for k, o in updater.optimizers.items()},
            "torch_rng": torch.get_rng_state(),
            "sampler_rng": rng_state,
            "stage": stage,
        },
        directory / "state.pt",
    )


def load_team_from_checkpoint(team: LoraTeam, directory: Path) -> LoraTeam:
    policies = []
    for index in range(team.n_agents):
        path = directory / f"agent{index}.safetensors"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing adapter checkpoint")
        policies.append(AdapterWeights(load_file(str(path))))
    return LoraTeam(team.backbone, tuple(policies))


def checkpoint_directory(run_dir: Path, step: int | None) -> Path:
    checkpoints = sorted(
        (run_dir / "checkpoints").glob("stage_*"), key=lambda p: int(p.name.split("_")[1])
    )
    if not checkpoints:
        raise FileNotFoundError(f"{run_dir}: no checkpoints")
    if step is None:
        return checkpoints[-1]
    wanted = run_dir / "checkpoints" / f"stage_{step}"
    if not wanted.is_dir():
        raise FileNotFoundError(
            f"{wanted}: no such checkpoint (have {[p.name for p in checkpoints]})"
        )
    return wanted


def train(config: RunConfig, config_name: str = "run", progress: bool = True) -> Path:
    """Run ``config.stage.stages`` stages; returns the run directory."""
    from torch.utils.tensorboard import SummaryWriter
    from tqdm import tqdm

    name = config.run.name or f"{config_name}-{datetime.now():%Y%m%d-%H%M%S}"
    run_dir = Path(config.run.output_dir) / name
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(config.to_dict(), indent=2))
    parts = build(config)
    team = parts.team
    recorder = RecordingSampler(parts.sampler)
    stage_config = StageConfig(
        scheme=config.stage.scheme,
        radius=config.stage.radius,
        order=config.stage.update_order,
        seed=config.run.seed,
        kl_tolerance=config.stage.kl_tolerance,
    )
    penalty = EpisodicPenalty(config.sampler.turns)
    writer = SummaryWriter(str(run_dir / "tensorboard"))
    stages = config.stage.stages
    budget_seconds = 60.0 * config.run.time_budget_minutes
    run_started = time.perf_counter()
    with (
        (run_dir / "metrics.jsonl").open("a") as metrics,
        tqdm(total=stages, desc=f"{config.stage.scheme} stages", disable=not progress) as bar,
    ):
        for stage in range(stages):
            recorder.calls.clear()
            started = time.perf_counter()
            report, team = run_stage(
                team, recorder, parts.updater, stage_config, penalty, stage_index=stage
            )
            record = stage_metrics(stage, report, recorder.calls, time.perf_counter() - started)
            out_of_time = budget_seconds > 0 and time.perf_counter() - run_started >= budget_seconds
            last = stage == stages - 1 or out_of_time
            if (
                config.run.eval_every
                and ((stage + 1) % config.run.eval_every == 0 or last)
                and parts.test_problems
            ):
                record["eval"] = evaluate_team(team, parts.sampler, parts.test_problems)
            metrics.write(json.dumps(record) + "\n")
            metrics.flush()
            for key in (
                "certificate",
                "train_reward",
                "train_parse_failure_rate",
                "generated_tokens",
                "wall_seconds",
            ):
                if record[key] is not None:
                    writer.add_scalar(f"stage/{key}", record[key], stage)
            for update in record["updates"]:
                for key in ("surrogate", "kl", "backtracks"):
                    writer.add_scalar(f"agent{update['agent']}/{key}", update[key], stage)
            for key, value in record.get("eval", {}).items():
                writer.add_scalar(f"eval/{key}", value, stage)
            if config.run.checkpoint_every and (
                (stage + 1) % config.run.checkpoint_every == 0 or last
            ):
                save_checkpoint(
                    run_dir / "checkpoints" / f"stage_{stage + 1}",
                    team,
                    parts.updater,
                    stage + 1,
                    parts.sampler._rng.bit_generator.state,
                )
            bar.set_postfix(
                reward=f"{record['train_reward']:.2f}", cert=f"{report.certificate:.3g}"
            )
            bar.update(1)
            if last:
                break
    writer.close()
    return run_dir
