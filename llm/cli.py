"""``teamtr train``, ``teamtr eval`` and ``teamtr swap`` for language-model teams.

``teamtr.cli`` forwards these subcommands here with ``argv`` starting at the subcommand. Bad
input (config, data file, missing or unreadable model, an unusable run directory) prints one
``error:`` line naming the file and what is expected and exits with code 2, without a traceback
and without leaving a run directory behind. Ctrl-C during ``train`` saves a checkpoint, prints
how to resume, and exits with code 130.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from llm.agents import LoraTeam
from llm.checkpoint import RunDirectoryError
from llm.config import ConfigError, load_config
from llm.devices import DEVICE_CHOICES, DEVICE_PATTERN
from llm.distributed import DistributedSetupError, launched_by_torchrun, rank_from_environment
from llm.loading import IncompatibleTeamError, ModelNotAvailableError
from llm.tasks import TaskDataError, load_jsonl

BAD_INPUT = 2
INTERRUPTED = 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="teamtr", description="Language-model teams.")
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train a team from a TOML config")
    start = train.add_mutually_exclusive_group(required=True)
    start.add_argument("--config", help="TOML file (see configs/default.toml)")
    start.add_argument(
        "--resume", metavar="DIR", help="continue the run in DIR from its newest valid checkpoint"
    )
    train.add_argument("--name", help="run directory name (overrides [run] name)")
    train.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    train.add_argument(
        "--device",
        help='override [run] device, e.g. "cpu" to resume on a CPU a run trained on a GPU',
    )
    train.add_argument(
        "--nproc",
        type=int,
        metavar="N",
        help="data-parallel on N local processes: starts `torchrun --nproc-per-node N -m teamtr "
        "train ...` (gloo on the CPU, NCCL on CUDA; see llm/distributed.py)",
    )
    evaluate = commands.add_parser("eval", help="evaluate a trained or untrained team")
    source = evaluate.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", help="run directory of `teamtr train`")
    source.add_argument("--config", help="TOML config: evaluate the untrained team")
    evaluate.add_argument("--step", type=int, help="checkpoint stage (default: the latest)")
    evaluate.add_argument(
        "--data",
        help='JSONL of {"question", "answer"} (default: the config\'s built-in held-out set)',
    )
    evaluate.add_argument("--json", required=True, help="where to write the results")
    evaluate.add_argument("--samples", type=int, default=1, help="K: adds pass@K and majority vote")
    evaluate.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    from llm.swap import add_arguments as add_swap_arguments

    add_swap_arguments(
        commands.add_parser(
            "swap", help="replace one agent by another adapter, directly or after Stage-0 alignment"
        )
    )
    return parser


def _train_config(args: argparse.Namespace, world_size: int):
    """The config a ``train`` command runs, checked for ``world_size`` processes before any
    process group or model exists (so that a bad setup stops every rank at once)."""
    import dataclasses

    from llm.distributed import check_world
    from llm.train import placement_of, resumable_config

    if args.resume:
        if args.name:
            raise ConfigError("--name cannot be combined with --resume")
        config = resumable_config(Path(args.resume), world_size)
        source = str(Path(args.resume) / "config.json")
    else:
        config = load_config(args.config)
        source = args.config
        if args.name:
            config = dataclasses.replace(
                config, run=dataclasses.replace(config.run, name=args.name)
            )
    if args.device is not None:
        if not DEVICE_PATTERN.fullmatch(args.device):
            raise ConfigError(f"--device: must be {DEVICE_CHOICES}, got {args.device!r}")
        config = dataclasses.replace(
            config, run=dataclasses.replace(config.run, device=args.device)
        )
        source = "--device"
    placement_of(config, source)  # an absent device fails before anything loads
    if world_size > 1 or launched_by_torchrun():
        check_world(config, world_size, source)
    return config


def _train(args: argparse.Namespace, argv: list[str]) -> int:
    from llm.distributed import (
        WorldSpec,
        launch,
        start_process_group,
        stop_process_group,
    )
    from llm.train import TrainingInterrupted, resume, train

    if args.nproc is not None:
        if args.nproc < 1:
            raise ConfigError(f"--nproc: must be >= 1, got {args.nproc}")
        if launched_by_torchrun():
            raise ConfigError("--nproc starts torchrun itself; do not combine it with torchrun")
        _train_config(args, args.nproc)
        return launch(args.nproc, _without_nproc(argv[1:]))
    collective = None
    try:
        if launched_by_torchrun():
            spec = WorldSpec.from_environment()
            config = _train_config(args, spec.world_size)
            start_process_group(spec, config.run.device)
            from llm.distributed import ProcessGroupCollective

            collective = ProcessGroupCollective()
        else:
            config = _train_config(args, 1)
        progress = not args.no_progress
        if args.resume:
            run_dir = resume(
                args.resume, progress=progress, collective=collective, device=args.device
            )
        else:
            stem = Path(args.config).stem
            run_dir = train(config, stem, progress=progress, collective=collective)
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
            stop_process_group()
    if rank_from_environment() == 0:
        print(f"run directory: {run_dir}")
    return 0


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


def _eval(args: argparse.Namespace) -> int:
    from llm.checkpoint import load_policies, run_format
    from llm.evaluation import evaluate_team
    from llm.train import build

    if args.run:
        run_dir = Path(args.run)
        run_format(run_dir)  # a foreign or newer run directory fails before anything loads
        config = load_config(run_dir / "config.json")
        parts = build(config)
        team = LoraTeam(
            parts.team.backbone, load_policies(run_dir, args.step, config.team.n_agents)
        )
    else:
        config = load_config(args.config)
        parts = build(config)
        team = parts.team
    if args.samples < 1:
        raise ConfigError(f"--samples: must be >= 1, got {args.samples}")
    problems = load_jsonl(args.data) if args.data else parts.test_problems
    if not problems:
        raise ConfigError("no evaluation problems: pass --data or use a config with a test set")
    result = evaluate_team(
        team, parts.sampler, problems, samples=args.samples, progress=not args.no_progress
    )
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return 0


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "train":
            return _train(args, argv)
        if args.command == "eval":
            return _eval(args)
        from llm.swap import run_swap

        return run_swap(args)
    except (
        ConfigError,
        TaskDataError,
        ModelNotAvailableError,
        IncompatibleTeamError,
        RunDirectoryError,
        DistributedSetupError,
    ) as error:
        if rank_from_environment() == 0:  # every rank stops; one says why
            print(f"error: {error}", file=sys.stderr)
        return BAD_INPUT


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
