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


def _train(args: argparse.Namespace) -> int:
    import dataclasses

    from llm.train import TrainingInterrupted, placement_of, resume, train

    try:
        if args.resume:
            if args.name:
                raise ConfigError("--name cannot be combined with --resume")
            run_dir = resume(args.resume, progress=not args.no_progress)
        else:
            config = load_config(args.config)
            placement_of(config, args.config)  # an absent device fails before anything loads
            if args.name:
                run = dataclasses.replace(config.run, name=args.name)
                config = dataclasses.replace(config, run=run)
            run_dir = train(config, Path(args.config).stem, progress=not args.no_progress)
    except TrainingInterrupted as stop:
        print(
            f"interrupted: state saved in {stop.checkpoint}; continue with "
            f"`teamtr train --resume {stop.run_dir}`",
            file=sys.stderr,
        )
        return INTERRUPTED
    print(f"run directory: {run_dir}")
    return 0


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
            return _train(args)
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
    ) as error:
        print(f"error: {error}", file=sys.stderr)
        return BAD_INPUT


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
