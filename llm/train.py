"""Training runs: build a team from a config, run stages of the core loop, log and checkpoint.

Every scheme goes through ``teamtr.stage.run_stage``; the single-agent GRPO baseline is the
same loop with ``n_agents = 1`` (one adapter speaks every turn).

Nothing is lost on a crash: at the start of every stage the run's whole state is held as a
``llm.checkpoint.ResumePoint`` (team snapshots are immutable values, so this is cheap), written
to disk every ``checkpoint_every`` stages, after the last one, and when the run is interrupted
(SIGINT/SIGTERM) or fails. ``resume`` rebuilds the run from its directory and replays from the
newest valid checkpoint; the result is bit-identical to an uninterrupted run (timings aside).
The run directory appears only after the config, the model and the data have loaded, so bad
input leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from llm.agents import Backbone, LoraBackbone, LoraTeam, SeparateBackbone
from llm.checkpoint import (
    ResumePoint,
    RunDirectoryError,
    latest_checkpoint,
    load_policies,
    require_resumable,
    write_atomically,
    write_checkpoint,
    write_run_marker,
)
from llm.collective import Collective
from llm.config import ConfigError, RunConfig, load_config
from llm.devices import DeviceNotAvailableError, Placement, agent_devices, resolve_placement
from llm.dialogue import ChatFormat
from llm.distributed import (
    ShardedSampler,
    agree,
    check_world,
    effective_shards,
    record_world,
    replicas_agree,
    require_same_world,
)
from llm.evaluation import evaluate_team
from llm.loading import (
    ModelNotAvailableError,
    load_model,
    load_tokenizer,
    require_shared_tokenizer,
)
from llm.router import make_router
from llm.sampler import DialogueRollouts, DialogueSampler
from llm.tasks import ArithmeticSuite, Problem, load_jsonl
from llm.updater import TrustRegionUpdater, non_finite_quantity
from teamtr.config import StageConfig
from teamtr.penalty import EpisodicPenalty
from teamtr.reports import StageReport, UpdateRecord
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
    collective: Collective | None = None
    """Set when the rollouts are sharded (``llm.distributed``): data parallelism, or a single
    process with ``[run] rollout_shards`` > 1."""

    @property
    def writes_files(self) -> bool:
        """Whether this process writes the run's files (rank 0 of a data-parallel run)."""
        return self.collective is None or self.collective.is_main


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


def seed_everything(seed: int) -> None:
    """Seed the global generators, so that a rebuilt run starts from the same state."""
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 (library code may draw from the global generator)
    torch.manual_seed(seed)


def load_base_model(source: str, seed: int = 0, placement: Placement | None = None):
    """Tokenizer and base model; any failure to read the files is a ModelNotAvailableError."""
    where = placement or Placement(torch.device("cpu"), torch.float32)
    try:
        tokenizer = load_tokenizer(source)
        model = load_model(
            source, vocab_size=len(tokenizer), seed=seed, dtype=where.dtype, device=where.device
        )
        return tokenizer, model
    except ModelNotAvailableError:
        raise
    except Exception as error:  # transformers/gguf/safetensors raise many types on bad files
        raise ModelNotAvailableError(
            f"model source {source!r}: cannot be loaded ({type(error).__name__}: {error}); "
            "expected a Hugging Face model directory, a .gguf file, or 'tiny'/'smollm2'"
        ) from None


def placement_of(config: RunConfig, source: str = "") -> Placement:
    """The run's device and dtype; an absent device is a ConfigError naming ``[run] device``
    (and ``source``, the config file, when given)."""
    try:
        return resolve_placement(config.run.device, config.run.dtype)
    except DeviceNotAvailableError as error:
        raise ConfigError(f"{source + ': ' if source else ''}[run] device: {error}") from None


def build_backbone(config: RunConfig):
    """The tokenizer and the team's backbone: LoRA slots on one base model, or, when
    ``[model] sources`` lists one source per agent, one base model per agent."""
    seed = config.run.seed
    placement = placement_of(config)
    if not config.model.sources:
        tokenizer, base = load_base_model(config.model.source, seed, placement)
        backbone: Backbone = LoraBackbone.create(base, config.team.n_agents, config.lora, seed=seed)
        return tokenizer, backbone
    # Agent k's model gets seed + k so that random ("tiny") members of a team differ.
    sources = config.model.sources
    devices = agent_devices(placement, len(sources), config.run.placement == "spread")
    loaded = [
        load_base_model(source, seed + k, replace(placement, device=devices[k]))
        for k, source in enumerate(sources)
    ]
    tokenizers = [tokenizer for tokenizer, _ in loaded]
    require_shared_tokenizer(list(config.model.sources), tokenizers)
    backbone = SeparateBackbone.create([model for _, model in loaded], config.lora, seed=seed)
    return tokenizers[0], backbone


def build(config: RunConfig, collective: Collective | None = None) -> Components:
    """A run's components; ``collective``: this process's rank in a data-parallel run."""
    if config.run.threads:
        torch.set_num_threads(config.run.threads)
    seed_everything(config.run.seed)
    tokenizer, backbone = build_backbone(config)
    chat = ChatFormat.from_tokenizer(
        tokenizer, config.team.n_agents, config.team.system_prompt, config.team.role_prompts
    )
    router = make_router(config.team.router, config.team.n_agents, config.team.speaking_order)
    draw, test = problem_sources(config)
    shards = effective_shards(config, collective.world_size if collective else 1)
    if collective is None and shards == 1:
        sampler = DialogueSampler(chat, router, draw, config.sampler)
        updater = TrustRegionUpdater(
            chat, config.updater, config.sampler.temperature, config.sampler.score_chunk
        )
        return Components(config, chat, backbone.initial_team(), sampler, updater, test)
    together = collective or Collective()
    check_world(config, together.world_size)
    sampler = ShardedSampler(chat, router, draw, config.sampler, shards=shards, collective=together)
    updater = TrustRegionUpdater(
        chat,
        config.updater,
        config.sampler.temperature,
        config.sampler.score_chunk,
        collective=together,
    )
    return Components(config, chat, backbone.initial_team(), sampler, updater, test, together)


def stage_metrics(stage: int, report: StageReport, seconds: float) -> dict[str, Any]:
    calls: tuple[DialogueRollouts, ...] = report.sampled_rollouts
    first = calls[0] if calls else None
    return {
        "stage": stage,
        "scheme": report.scheme,
        "order": list(report.order),
        "certificate": report.certificate,
        "train_reward": first.mean_reward if first else None,
        "train_parse_failure_rate": first.parse_failure_rate if first else None,
        # TeamTR samples again after every update: the intermediate teams' rewards, in order.
        "rollout_rewards": [c.mean_reward for c in calls],
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
                "non_finite": non_finite_quantity(r.update),
                "penalty": r.penalty,
                "certificate": r.certificate,
            }
            for r in report.records
        ],
    }


# -- run directories and checkpoints ---------------------------------------------------------------
EVENTS = "events.jsonl"
"""Crash-related events (start, resume, skipped checkpoints, interrupt); timings differ between
runs, so they are kept out of metrics.jsonl, which an exact resume reproduces bit for bit."""
INTERRUPTED_EXIT_CODE = 130


class TrainingInterrupted(Exception):
    """SIGINT or SIGTERM stopped the run; its state was saved in ``checkpoint``."""

    def __init__(self, run_dir: Path, checkpoint: Path) -> None:
        super().__init__(f"interrupted; state saved in {checkpoint}")
        self.run_dir = run_dir
        self.checkpoint = checkpoint


def log_event(run_dir: Path, event: str, **fields: Any) -> None:
    with (run_dir / EVENTS).open("a") as handle:
        handle.write(json.dumps({"event": event, "time": f"{datetime.now():%FT%T}", **fields}))
        handle.write("\n")


def require_new_run_directory(run_dir: Path) -> None:
    if run_dir.exists():
        raise RunDirectoryError(
            f"{run_dir}: already exists; continue it with `teamtr train --resume {run_dir}` "
            "or choose another --name"
        )


def create_run_directory(run_dir: Path, config: RunConfig) -> None:
    """Write config and format marker into a temporary directory and rename it into place, so
    that a run directory either exists complete or not at all."""
    require_new_run_directory(run_dir)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    temporary = run_dir.with_name(f".{run_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir()
    write_atomically(temporary / "config.json", json.dumps(config.to_dict(), indent=2).encode())
    write_run_marker(temporary)
    os.replace(temporary, run_dir)


def load_team_from_checkpoint(team: LoraTeam, directory: Path) -> LoraTeam:
    """``team`` with the adapters of checkpoint ``directory`` (``run/checkpoints/stage_N``)."""
    step = int(directory.name.removeprefix("stage_"))
    policies = load_policies(directory.parent.parent, step, team.n_agents)
    return LoraTeam(team.backbone, policies)


@contextmanager
def signals_deferred(reraise: bool = True) -> Iterator[None]:
    """Hold SIGINT/SIGTERM while a checkpoint is written, so it is never cut short; a signal
    that arrived meanwhile is raised as KeyboardInterrupt afterwards (if ``reraise``)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = {
        number: signal.signal(number, lambda n, _frame: received.append(n))
        for number in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    if received and reraise:
        raise KeyboardInterrupt


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C: checkpoint and exit cleanly."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(_number: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# -- training --------------------------------------------------------------------------------------
def train(
    config: RunConfig,
    config_name: str = "run",
    progress: bool = True,
    collective: Collective | None = None,
) -> Path:
    """Run ``config.stage.stages`` stages in a new run directory; returns its path.

    ``collective``: this process's rank in a data-parallel run (``llm.distributed``).
    """
    name = config.run.name or f"{config_name}-{datetime.now():%Y%m%d-%H%M%S}"
    if collective is not None:
        name = collective.broadcast(name)  # rank 0's timestamp names the run
        world = collective.world_size
        shards = check_world(config, world)
        config = replace(config, run=replace(config.run, rollout_shards=shards))
    run_dir = Path(config.run.output_dir) / name
    if collective is None:
        require_new_run_directory(run_dir)
    else:
        agree(collective, _failure(require_new_run_directory, run_dir))
    parts = build(config, collective)  # model and data are loaded before anything is written
    if parts.writes_files:
        create_run_directory(run_dir, config)
        if collective is not None:
            record_world(run_dir, collective.world_size, config.run.rollout_shards)
        log_event(run_dir, "started")
    if collective is not None:
        collective.gather(None)  # every rank waits until the run directory exists
    start = ResumePoint.capture(0, parts.team, parts.updater, parts.sampler._rng, (), 0.0)
    return _run(parts, run_dir, start, progress)


def resume(
    run_dir: str | Path,
    progress: bool = True,
    collective: Collective | None = None,
    device: str | None = None,
) -> Path:
    """Continue a run from its newest valid checkpoint, exactly as if it had not stopped.

    A data-parallel run resumes with the number of processes it was started with. ``device``
    overrides the run's ``[run] device`` (checkpoints are read onto any device).
    """
    run_dir = Path(run_dir)
    config = resumable_config(run_dir, collective.world_size if collective else 1)
    if device is not None:
        config = replace(config, run=replace(config.run, device=device))
    parts = build(config, collective)
    latest = latest_checkpoint(run_dir)
    # Stopped before its first checkpoint: the rebuilt run is exactly the original start.
    point = latest.point or ResumePoint.capture(
        0, parts.team, parts.updater, parts.sampler._rng, (), 0.0
    )
    if parts.writes_files:
        log_event(
            run_dir,
            "resumed",
            checkpoint=latest.directory.name if latest.directory else None,
            stage=point.stage,
            skipped=list(latest.skipped),
        )
    if point.finished:
        if parts.writes_files:
            print(f"{run_dir}: already complete after {point.stage} stages; nothing to do")
        return run_dir
    return _run(parts, run_dir, point, progress)


def resumable_config(run_dir: Path, world_size: int) -> RunConfig:
    """The config of a run directory that can be resumed by ``world_size`` processes."""
    if not run_dir.is_dir():
        raise RunDirectoryError(f"{run_dir}: no such run directory")
    require_resumable(run_dir)
    require_same_world(run_dir, world_size)
    return load_config(run_dir / "config.json")


def _failure(check: Any, *args: Any) -> Exception | None:
    """The error ``check(*args)`` raises, if any (to be agreed on by every rank)."""
    try:
        check(*args)
    except (RunDirectoryError, ConfigError) as error:
        return error
    return None


class _NoWriter:
    """Stands in for TensorBoard's writer on ranks other than 0."""

    def add_scalar(self, *_args: Any) -> None:
        pass

    def close(self) -> None:
        pass


def _run(parts: Components, run_dir: Path, start: ResumePoint, progress: bool) -> Path:
    """Stages ``start.stage`` onwards; ``start`` is the state to continue from."""
    config = parts.config
    sampler_rng = parts.sampler._rng
    resume_point = start
    position = {"stage": start.stage, "updates_done": 0}
    writer = None

    def note_update(record: UpdateRecord) -> None:
        position["updates_done"] = record.position + 1

    writes = parts.writes_files
    together = parts.collective

    def save(point: ResumePoint) -> Path:
        if not writes:  # rank 0 saves; the others only say where
            return run_dir / "checkpoints" / f"stage_{point.stage}"
        with signals_deferred(reraise=False):
            return write_checkpoint(run_dir, point)

    try:
        from torch.utils.tensorboard import SummaryWriter
        from tqdm import tqdm

        team = start.restore(parts.team, parts.updater, sampler_rng)
        metrics_lines = list(start.metrics_lines)
        # Lines after the checkpoint belong to stages that will be run again.
        lines = "".join(x + "\n" for x in metrics_lines)
        if writes:
            write_atomically(run_dir / "metrics.jsonl", lines.encode())
        stage_config = StageConfig(
            scheme=config.stage.scheme,
            radius=config.stage.radius,
            order=config.stage.update_order,
            seed=config.run.seed,
            kl_tolerance=config.stage.kl_tolerance,
        )
        penalty = EpisodicPenalty(config.sampler.turns)
        # purge_step drops TensorBoard points of stages that are about to be run again.
        writer = (
            SummaryWriter(str(run_dir / "tensorboard"), purge_step=start.stage or None)
            if writes
            else _NoWriter()
        )
        stages = config.stage.stages
        budget_seconds = 60.0 * config.run.time_budget_minutes
        clock = time.process_time if config.run.budget_clock == "cpu" else time.perf_counter
        run_started = clock() - start.elapsed_seconds
        with (
            sigterm_interrupts(),
            (run_dir / "metrics.jsonl").open("a") if writes else open(os.devnull, "w") as metrics,
            tqdm(
                total=stages,
                initial=start.stage,
                desc=f"{config.stage.scheme} stages",
                disable=not progress or not writes,
            ) as bar,
        ):
            for stage in range(start.stage, stages):
                position.update(stage=stage, updates_done=0)
                started = time.perf_counter()
                report, team = run_stage(
                    team,
                    parts.sampler,
                    parts.updater,
                    stage_config,
                    penalty,
                    stage_index=stage,
                    on_update=note_update,
                )
                record = stage_metrics(stage, report, time.perf_counter() - started)
                elapsed = clock() - run_started
                out_of_time = budget_seconds > 0 and elapsed >= budget_seconds
                if together is not None:  # rank 0's clock decides for every rank
                    out_of_time = together.broadcast(out_of_time)
                    replicas_agree(together, team.policies)
                last = stage == stages - 1 or out_of_time
                if (
                    config.run.eval_every
                    and ((stage + 1) % config.run.eval_every == 0 or last)
                    and parts.test_problems
                ):
                    record["eval"] = evaluate_team(
                        team, parts.sampler, parts.test_problems, collective=together
                    )
                line = json.dumps(record)
                metrics.write(line + "\n")
                metrics.flush()
                metrics_lines.append(line)
                resume_point = ResumePoint.capture(
                    stage + 1,
                    team,
                    parts.updater,
                    sampler_rng,
                    tuple(metrics_lines),
                    clock() - run_started,
                    finished=last,
                )
                log_scalars(writer, stage, record)
                if writes and (
                    last
                    or (
                        config.run.checkpoint_every
                        and (stage + 1) % config.run.checkpoint_every == 0
                    )
                ):
                    with signals_deferred():
                        write_checkpoint(run_dir, resume_point)
                bar.set_postfix(
                    reward=f"{record['train_reward']:.2f}", cert=f"{report.certificate:.3g}"
                )
                bar.update(1)
                if last:
                    break
    except KeyboardInterrupt:
        checkpoint = save(resume_point)
        if writes:
            log_event(
                run_dir,
                "interrupted",
                **position,
                checkpoint=checkpoint.name,
                resumes_at={"stage": resume_point.stage, "update": 0},
            )
        raise TrainingInterrupted(run_dir, checkpoint) from None
    except RunDirectoryError:  # the checkpoint does not fit the run: nothing new to save
        raise
    except Exception as error:
        checkpoint = save(resume_point)
        if writes:
            log_event(run_dir, "failed", **position, error=repr(error), checkpoint=checkpoint.name)
        raise
    finally:
        if writer is not None:
            writer.close()
    return run_dir


def log_scalars(writer: Any, stage: int, record: dict[str, Any]) -> None:
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
