"""``teamtr train``: its parser, the checks a run passes before any model loads, and the run
itself, in one process, under torchrun, or launching torchrun (``--nproc``).

Exit codes and the shape of every error are those of ``llm.interface.cli``; a data-parallel run
stops every rank on bad input, and rank 0 says why.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from llm.common.command_faults import (
    TrainingInterrupted,
    launched_by_torchrun,
    rank_from_environment,
)
from llm.common.config import ConfigError, check_run_name, load_config
from llm.common.rules import DEVICE_CHOICES, DEVICE_PATTERN
from llm.interface.cli_args import (
    INTERRUPTED,
    RUN_FAILED,
    add_check_flag,
    add_command,
    add_real_flag,
    add_set_option,
)

EXAMPLES = """examples:
  teamtr train --config default                        # the run to start with (SmolLM2, relay)
  teamtr train --config my_team.toml --check           # config, data and reward; no real model
  teamtr train --config my_team.toml --check --real    # ... and one batch of the real model
  teamtr train --config smoke --set stage.stages=1 --name try
  teamtr train --resume runs/try                       # continue from its newest checkpoint"""


def add_parser(commands: Any) -> None:
    """``teamtr train``'s options: where the run starts (a config or a run to resume), its name
    and place, its seed, device and processes, ``--set``, ``--check`` and ``--real``."""
    train = add_command(
        commands,
        "train",
        "train a team from a TOML config",
        "Train a team of language-model agents (LoRA adapters on one base model) that take "
        "turns in one dialogue, with KL trust-region updates, for [stage] stages; writes a "
        "run directory (docs/runs.md).",
        EXAMPLES,
    )
    start = train.add_mutually_exclusive_group(required=True)
    start.add_argument(
        "--config",
        help="TOML file, or the name of a shipped config: default (the run to start with), "
        "reference (every key, with its meaning), smoke (a tiny random model, seconds), "
        "chain/chain4_teamtr, ... (llm/configs/, which configs/ links to)",
    )
    start.add_argument(
        "--resume", metavar="DIR", help="continue the run in DIR from its newest valid checkpoint"
    )
    train.add_argument("--name", help="run directory name (overrides [run] name)")
    train.add_argument(
        "--output-dir", help="parent of the run directory (overrides [run] output_dir)"
    )
    train.add_argument(
        "--seed",
        type=int,
        help="overrides [run] seed and [sampler] seed (one seed for the repeats of a comparison)",
    )
    train.add_argument("--no-progress", action="store_true", help="hide progress bars and lines")
    train.add_argument(
        "--device",
        help='override [run] device, e.g. "cpu" to resume on a CPU a run trained on a GPU',
    )
    train.add_argument(
        "--nproc",
        type=int,
        metavar="N",
        help="data-parallel on N local processes: starts `torchrun --nproc-per-node N -m teamtr "
        "train ...` (gloo on the CPU, NCCL on CUDA; see llm/training/distributed.py)",
    )
    add_set_option(train)
    add_check_flag(train)
    add_real_flag(train)


def _train_config(args: argparse.Namespace, world_size: int):
    """The config a ``train`` command runs, checked for ``world_size`` processes before any
    process group or model exists (so that a bad setup stops every rank at once)."""
    import dataclasses

    if args.resume is not None:
        if args.name or args.seed is not None or args.output_dir is not None:
            raise ConfigError("--name, --seed and --output-dir cannot be combined with --resume")
        from llm.training.train import resumable_config

        config = resumable_config(Path(args.resume), world_size, args.set)
        source = str(Path(args.resume) / "config.json")
    else:
        config = load_config(args.config, args.set)
        source = args.config
        if args.name is not None:
            check_run_name(args.name, "--name")
            config = dataclasses.replace(
                config, run=dataclasses.replace(config.run, name=args.name)
            )
        if args.output_dir is not None:
            config = dataclasses.replace(
                config, run=dataclasses.replace(config.run, output_dir=args.output_dir)
            )
        if args.seed is not None:
            if not 0 <= args.seed < 2**31:
                raise ConfigError(f"--seed: must lie in [0, 2**31), got {args.seed}")
            config = dataclasses.replace(
                config,
                run=dataclasses.replace(config.run, seed=args.seed),
                sampler=dataclasses.replace(config.sampler, seed=args.seed),
            )
    if args.device is not None:
        if not DEVICE_PATTERN.fullmatch(args.device):
            raise ConfigError(f"--device: must be {DEVICE_CHOICES}, got {args.device!r}")
        config = dataclasses.replace(
            config, run=dataclasses.replace(config.run, device=args.device)
        )
        source = "--device"
    # torch from here on: a bad argument or config above ends the command before it loads
    from llm.training.builder import placement_of
    from llm.training.distributed import check_world

    placement = placement_of(config, source)  # an absent device fails before anything loads
    if world_size > 1 or launched_by_torchrun():
        check_world(config, world_size, source)
    if config.run.placement != "spread" or placement.device.type == "cpu":
        from llm.models.memory import require_memory

        # Ranks on the CPU share one memory; on CUDA each has a device of its own.
        ranks = world_size if placement.device.type == "cpu" else 1
        require_memory(config, str(placement.device), placement.dtype.itemsize, source, ranks)
    return config


def _checked(args: argparse.Namespace, config) -> int:
    """``train --check``: what a new run checks before its model loads (a resumed run's
    checks were made by ``_train_config``)."""
    from llm.training.builder import configured_task
    from llm.training.task_check import check_task
    from llm.training.train import check_training, user_code

    if args.resume is None:
        check_training(config, Path(args.config).stem, task_check=False)
        if user_code(config):
            # One's own task played on a tiny random model: its reward and metric called on
            # real dialogues, before the real model would load.
            for line in check_task(configured_task(config), config).lines():
                print(line)
    if args.real:
        for line in _real_signal(config, progress=not args.no_progress):
            print(line)
    return 0


def _real_signal(config, progress: bool) -> list[str]:
    """``--check --real``: one batch of the real model's dialogues, as the first stage would
    draw it, and how many of its groups earned differing rewards (only those teach GRPO
    anything): what a tiny random model cannot tell."""
    import time

    from llm.training.builder import build
    from llm.training.stages.console import messages_cut

    parts = build(config, progress=progress)
    started = time.perf_counter()
    try:
        rollouts = parts.sampler.sample(parts.team)
    finally:
        parts.sampler.close()  # a server engine stops with the check
    settings = parts.sampler.settings
    cut, messages = messages_cut(rollouts.episodes, parts.sampler)
    kept = len(rollouts.episodes) // settings.group_size
    seconds = f"{time.perf_counter() - started:.1f} s"
    drawn = rollouts.groups_drawn
    if drawn > kept:  # dynamic sampling drew more groups than the batch keeps
        seconds += f"; dynamic sampling drew {drawn} groups for these {kept}"
    lines = [
        f"real model: {len(rollouts.episodes)} dialogues in {kept} groups of "
        f"{settings.group_size} ({seconds}): {rollouts.held_signal_groups} groups with "
        f"differing rewards, mean reward {rollouts.mean_reward:.2f}, {cut} of {messages} "
        "messages cut at max_new_tokens"
    ]
    if not rollouts.held_signal_groups:
        lines.append(
            "warning: no group had differing rewards: a stage like this learns nothing "
            "(a reward that never varies, messages cut by [sampler] max_new_tokens, or a "
            "task too hard for the model)"
        )
    return lines


def run_train(args: argparse.Namespace, argv: list[str]) -> int:
    """``teamtr train``: a new or resumed run, checked first (``--check`` stops there)."""
    if args.real and not args.check:
        raise ConfigError("--real: only with --check (`teamtr train --config FILE --check --real`)")
    if args.nproc is not None:
        return _launch(args, argv)
    collective = None
    try:
        if launched_by_torchrun():
            from llm.training.distributed import (
                ProcessGroupCollective,
                WorldSpec,
                start_process_group,
            )

            spec = WorldSpec.from_environment()
            config = _train_config(args, spec.world_size)
            if args.check:
                return _checked(args, config)
            start_process_group(spec, config.run.device)
            collective = ProcessGroupCollective()
        else:
            config = _train_config(args, 1)
            if args.check:
                return _checked(args, config)
        from llm.training.train import resume, train

        progress = not args.no_progress
        if args.resume is not None:
            run_dir = resume(
                args.resume,
                progress=progress,
                collective=collective,
                device=args.device,
                overrides=args.set,
            )
        else:
            stem = Path(args.config).stem
            run_dir = train(config, stem, progress=progress, collective=collective)
    except RuntimeError as error:
        if collective is None or not _lost_a_peer(error):
            raise
        # A peer rank died (killed, out of memory): the collectives of this one fail with a
        # backend traceback several dozen lines long. One line each says what happened.
        print(
            f"error: rank {collective.rank}: a peer process of the run stopped "
            f"({_first_line(error)}); resume from the last checkpoint with "
            f"`teamtr train --resume RUN_DIR --nproc {collective.world_size}`",
            file=sys.stderr,
        )
        return RUN_FAILED
    except TrainingInterrupted as stop:
        if rank_from_environment() == 0:
            world = "" if collective is None else f" --nproc {collective.world_size}"
            print(
                f"interrupted: state saved in {stop.checkpoint}; continue with "
                f"`teamtr train --resume {stop.run_dir}{world}`",
                file=sys.stderr,
            )
        return INTERRUPTED
    finally:
        if collective is not None:
            from llm.training.distributed import stop_process_group

            stop_process_group()
    if rank_from_environment() == 0:
        print(f"run directory: {run_dir}")
    return 0


def _launch(args: argparse.Namespace, argv: list[str]) -> int:
    """``train --nproc N``: the config checked for N processes, then torchrun started with
    this command line (without ``--nproc``) on N local processes."""
    from llm.training.distributed import launch

    if args.nproc < 1:
        raise ConfigError(f"--nproc: must be >= 1, got {args.nproc}")
    if launched_by_torchrun():
        raise ConfigError("--nproc starts torchrun itself; do not combine it with torchrun")
    config = _train_config(args, args.nproc)
    if args.check:
        return _checked(args, config)
    return launch(args.nproc, _without_nproc(argv[1:]))


def _lost_a_peer(error: RuntimeError) -> bool:
    """Whether a collective failed because another rank went away (torch's distributed
    errors, or the gloo backend's own)."""
    import torch.distributed as dist

    text = str(error).lower()
    return isinstance(error, dist.DistError) or any(
        marker in text for marker in ("gloo", "connection closed", "connection reset")
    )


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return (lines[0] if lines else type(error).__name__)[:200]


def _without_nproc(argv: list[str]) -> list[str]:
    """``argv`` without ``--nproc N`` / ``--nproc=N`` (what each rank is started with)."""
    kept, skip = [], False
    for argument in argv:
        if skip:
            skip = False
        elif argument == "--nproc":
            skip = True
        elif not argument.startswith("--nproc="):
            kept.append(argument)
    return kept
