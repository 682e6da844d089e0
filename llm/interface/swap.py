"""``teamtr swap``: replace one agent of a trained team by another adapter (THEORY.md §2, Stage-0).

A swap reads a run directory, puts a new adapter π_pre in agent k's slot of the team in its
checkpoint (directly, or after ``llm.update.adapter_alignment.align_adapter`` has projected it
into E KL(π‖π_cur) ≤ δ0 on probe dialogues of the current team), and writes a new run
directory:

- ``config.json``: the source run's config (same base model, LoRA shape, task), with
  ``[stage] stages`` replaced when ``--stages`` is given;
- ``checkpoints/stage_N``: the source checkpoint's state with agent k's adapter replaced and agent
  k's Adam state dropped (its moments belong to the replaced adapter's trajectory); the other
  agents' adapters and optimiser states, the RNG states and the metrics so far are kept, so
  ``teamtr train --resume`` continues at stage N and ``teamtr eval --run`` evaluates the swapped
  team;
- ``swap.json``: what was swapped for what, and the alignment's measurements.

The new adapter comes from another run directory (agent ``--model-agent``, default k, of its
newest checkpoint), a ``.safetensors`` file of slot-independent LoRA tensors (as in checkpoints),
or a PEFT adapter directory (``adapter_model.safetensors``). It must fit the run's LoRA slot:
the team shares one base model, so a different base model cannot be swapped in.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from safetensors.torch import load_file

from llm.common.command_faults import RunFailed
from llm.common.config import ConfigError, RunConfig, load_config
from llm.conversation.dialogue import Episode
from llm.models.adapter_folder import ADAPTER_FILE
from llm.models.agents import AdapterWeights, LoraTeam
from llm.problems.tasks import Problem, load_jsonl
from llm.training.checkpoint import (
    LEGACY_FORMAT,
    ResumePoint,
    RunDirectoryError,
    load_policies,
    read_checkpoint,
    run_format,
    stage_directories,
    write_atomically,
    write_checkpoint,
)
from llm.update.adapter_alignment import (
    AlignmentError,
    AlignmentResult,
    AlignmentSettings,
    align_adapter,
)
from llm.update.updater import TrustRegionUpdater

if TYPE_CHECKING:  # the builder loads torch models: imported where a swap runs
    from llm.training.builder import Components

SWAP_RECORD = "swap.json"


class SwapError(ConfigError):
    """A swap cannot be done as asked; the CLI prints the message and exits with code 2."""


@dataclass(frozen=True)
class NewAdapter:
    """π_pre and where it came from."""

    weights: AdapterWeights
    description: dict[str, Any]


# -- reading the inputs ------------------------------------------------------------------------
def _run_config(run_dir: Path, what: str) -> RunConfig:
    if not run_dir.is_dir():
        raise SwapError(f"{what} {run_dir}: no such run directory")
    try:
        run_format(run_dir)
    except RunDirectoryError as error:
        raise SwapError(f"{what}: {error}") from None
    return load_config(run_dir / "config.json")


def _checkpoint_stage(run_dir: Path, step: int | None) -> int:
    available = stage_directories(run_dir)
    if not available:
        raise SwapError(f"{run_dir}: no checkpoints to swap into")
    stages = [int(path.name.removeprefix("stage_")) for path in available]
    if step is None:
        return stages[-1]
    if step not in stages:
        raise SwapError(f"{run_dir}: no checkpoint stage_{step} (have {stages})")
    return step


def read_resume_point(
    run_dir: Path,
    stage: int,
    team: LoraTeam,
    updater: TrustRegionUpdater,
    sampler_rng: np.random.Generator,
) -> ResumePoint:
    """The source run's state at ``stage``. A legacy run (adapters only) gets the team's
    adapters, no optimiser state, fresh RNG states and its metrics lines so far."""
    directory = run_dir / "checkpoints" / f"stage_{stage}"
    if run_format(run_dir) != LEGACY_FORMAT:
        try:
            return read_checkpoint(directory)
        except RunDirectoryError as error:
            raise SwapError(str(error)) from None
    policies = load_policies(run_dir, stage, team.n_agents)
    metrics = run_dir / "metrics.jsonl"
    lines = tuple(metrics.read_text().splitlines()[:stage]) if metrics.is_file() else ()
    point = ResumePoint.capture(stage, team, updater, sampler_rng, lines, 0.0)
    return dataclasses.replace(point, policies=policies, optimizer_states={})


def _load_tensors(path: Path) -> AdapterWeights:
    try:
        return AdapterWeights(load_file(str(path)))
    except Exception as error:  # safetensors raises several types on a bad file
        raise SwapError(f"{path}: not a readable safetensors adapter ({error})") from None


def load_new_adapter(
    model: Path, agent: int, model_agent: int | None, config: RunConfig
) -> NewAdapter:
    """π_pre from a run directory, a .safetensors file or a PEFT adapter directory."""
    if not model.exists():
        raise SwapError(f"--model {model}: no such file or directory")
    if model.is_dir() and (model / "config.json").is_file():
        other = _run_config(model, "--model")
        index = agent if model_agent is None else model_agent
        if not 0 <= index < other.team.n_agents:
            raise SwapError(
                f"--model-agent {index}: the model run has agents 0..{other.team.n_agents - 1}"
            )
        theirs, ours = other.model.source_of(index), config.model.source_of(agent)
        if (theirs, other.lora) != (ours, config.lora):
            raise SwapError(
                f"--model {model}: agent {index}'s base model {theirs!r} / LoRA {other.lora} "
                f"differ from agent {agent}'s {ours!r} / {config.lora} in the run; only "
                "adapters of the same shape fit"
            )
        stage = _checkpoint_stage(model, None)
        try:
            policies = load_policies(model, stage, other.team.n_agents)
        except RunDirectoryError as error:
            raise SwapError(f"--model: {error}") from None
        return NewAdapter(
            policies[index],
            {"kind": "run", "path": str(model), "agent": index, "checkpoint": f"stage_{stage}"},
        )
    if model_agent is not None:
        raise SwapError("--model-agent applies only when --model is a run directory")
    if model.is_dir():
        if not (model / ADAPTER_FILE).is_file():
            raise SwapError(
                f"--model {model}: a directory without config.json (a run) or "
                f"{ADAPTER_FILE} (a PEFT adapter)"
            )
        return NewAdapter(_load_tensors(model / ADAPTER_FILE), {"kind": "peft", "path": str(model)})
    return NewAdapter(_load_tensors(model), {"kind": "safetensors", "path": str(model)})


def probe_problems(config: RunConfig, path: str | None, count: int, seed: int) -> list[Problem]:
    """The probe prompts: a JSONL file's first ``count``, or ``count`` training-split draws."""
    from llm.training.builder import problem_sources

    if count < 1:
        raise SwapError(f"--probe-size must be >= 1, got {count}")
    if path is not None:
        return load_jsonl(path)[:count]
    draw, _, _ = problem_sources(config)
    return draw(np.random.default_rng(seed), count)


def probe_dialogues(parts, team: LoraTeam, problems: list[Problem], seed: int) -> list[Episode]:
    """One dialogue per probe prompt, sampled by the current team at the policy's temperature:
    agent k's token contexts in them are states s ~ d_{π_cur} (THEORY.md, Stage-0)."""
    rng = np.random.default_rng(seed)
    episodes = [parts.sampler.open_episode(p, int(rng.integers(2**31))) for p in problems]
    played, _ = parts.sampler.play(team, episodes)
    return played


# -- the swap ----------------------------------------------------------------------------------
def _check_fits(new: AdapterWeights, current: AdapterWeights, model: str) -> None:
    if new.tensors.keys() != current.tensors.keys():
        missing = sorted(current.tensors.keys() - new.tensors.keys())[:3]
        extra = sorted(new.tensors.keys() - current.tensors.keys())[:3]
        raise SwapError(
            f"--model {model}: its LoRA tensors do not match the run's slot "
            f"(missing e.g. {missing}, unexpected e.g. {extra})"
        )
    for key, tensor in current.tensors.items():
        if new.tensors[key].shape != tensor.shape:
            raise SwapError(
                f"--model {model}: tensor {key} has shape {tuple(new.tensors[key].shape)}, "
                f"the run's slot {tuple(tensor.shape)}"
            )


def _output_directory(run_dir: Path, agent: int, aligned: bool, out: str | None) -> Path:
    target = (
        Path(out)
        if out
        else run_dir.with_name(f"{run_dir.name}-swap{agent}-{'aligned' if aligned else 'direct'}")
    )
    if target.exists():
        raise SwapError(f"--out {target}: already exists (choose another directory)")
    return target


def write_swapped_run(
    target: Path, config: RunConfig, point: ResumePoint, record: dict[str, Any]
) -> None:
    """Create the new run directory as a training run does (``llm.training.rundir``): written whole in a
    locked temporary sibling (config, format marker, checkpoint, metrics, swap record, each
    written atomically) and renamed into place."""
    from llm.training.rundir import create_run_directory

    def fill(directory: Path) -> None:
        write_checkpoint(directory, point)
        metrics = "".join(line + "\n" for line in point.metrics_lines)
        write_atomically(directory / "metrics.jsonl", metrics.encode())
        write_atomically(directory / SWAP_RECORD, json.dumps(record, indent=2).encode() + b"\n")

    create_run_directory(target, config, fill).release()


def run_swap(args: argparse.Namespace) -> int:
    """``teamtr swap``: see the module docstring. Bad input raises SwapError (exit code 2)."""
    from llm.training.builder import build, require_dialogues_fit
    from llm.training.preflight import require_writable_directory

    run_dir = Path(args.run)
    config = _run_config(run_dir, "--run")
    n_agents = config.team.n_policies
    if not 0 <= args.agent < n_agents:
        raise SwapError(f"--agent {args.agent}: the run has agents 0..{n_agents - 1}")
    if args.align and not args.delta0 > 0:
        raise SwapError(f"--delta0 must be > 0, got {args.delta0}")
    stage = _checkpoint_stage(run_dir, args.step)
    if args.stages is not None:
        if args.stages <= stage:
            raise SwapError(f"--stages {args.stages}: must exceed the checkpoint's stage {stage}")
        stages = dataclasses.replace(config.stage, stages=args.stages)
        config = dataclasses.replace(config, stage=stages)
    target = _output_directory(run_dir, args.agent, args.align, args.out)
    require_writable_directory(target.parent, "--out")
    new = load_new_adapter(Path(args.model), args.agent, args.model_agent, config)
    problems = (
        probe_problems(config, args.probe, args.probe_size, args.probe_seed) if args.align else []
    )
    if getattr(args, "check", False):
        return 0

    parts = build(config, progress=False)
    require_dialogues_fit(parts.chat, parts.positions, problems, config, "--probe")
    try:
        point = read_resume_point(run_dir, stage, parts.team, parts.updater, parts.sampler.rng)
    except RunDirectoryError as error:
        raise SwapError(f"--run: {error}") from None
    team = LoraTeam(parts.team.backbone, point.policies)
    current = team.agent(args.agent)
    _check_fits(new.weights, current, args.model)

    policy, alignment, probe = new.weights, None, None
    if args.align:
        policy, alignment, probe = _aligned(args, parts, team, new.weights, problems, config)

    optimizer_states = {k: v for k, v in point.optimizer_states.items() if k != args.agent}
    swapped = dataclasses.replace(
        point,
        policies=team.with_agent(args.agent, policy).policies,
        optimizer_states=optimizer_states,
        finished=False,  # the swapped team has not been trained: resuming continues from here
    )
    record = _swap_record(args, run_dir, stage, new.description, alignment, probe)
    try:
        write_swapped_run(target, config, swapped, record)
    except OSError as error:  # checked writable before; the disk filled up or the path went
        raise RunFailed(f"--out {target}: cannot write the new run: {error.strerror}") from None
    print(json.dumps({"run_directory": str(target), **record}))
    return 0


def _aligned(
    args: argparse.Namespace,
    parts: Components,
    team: LoraTeam,
    weights: AdapterWeights,
    problems: list[Problem],
    config: RunConfig,
) -> tuple[AdapterWeights, AlignmentResult, dict[str, Any]]:
    """Stage 0 (THEORY.md, the plug-and-play swap): the new adapter moved towards the old one's
    behaviour on the probe's dialogues, within ``--delta0``."""
    episodes = probe_dialogues(parts, team, problems, args.probe_seed)
    settings = AlignmentSettings(
        delta0=args.delta0, learning_rate=args.align_lr, steps=args.align_steps
    )
    try:
        alignment = align_adapter(
            team, args.agent, weights, parts.chat, episodes, settings, config.sampler
        )
    except AlignmentError as error:
        raise SwapError(f"alignment: {error}") from None
    probe = {
        "source": args.probe or "training split",
        "prompts": len(problems),
        "seed": args.probe_seed,
    }
    return alignment.policy, alignment, probe


def _swap_record(
    args: argparse.Namespace,
    run_dir: Path,
    stage: int,
    new_adapter: dict[str, Any],
    alignment: AlignmentResult | None,
    probe: dict[str, Any] | None,
) -> dict[str, Any]:
    """What the new run's swap.json says of the swap: its source, the adapter, the mode."""
    return {
        "source_run": str(run_dir),
        "source_checkpoint": f"stage_{stage}",
        "agent": args.agent,
        "new_adapter": new_adapter,
        "mode": "aligned" if args.align else "direct",
        "delta0": args.delta0 if args.align else None,
        "probe": probe,
        "alignment": alignment.summary() if alignment else None,
        "changed_agents": [args.agent],
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
    }
