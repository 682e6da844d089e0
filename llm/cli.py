"""``teamtr train``, ``teamtr eval`` and ``teamtr swap`` for language-model teams.

``teamtr.cli`` forwards these subcommands here with ``argv`` starting at the subcommand. Bad
input (config, data file, missing model) prints one ``error:`` line and exits with code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from llm.config import ConfigError, load_config
from llm.loading import ModelNotAvailableError
from llm.tasks import TaskDataError, load_jsonl

BAD_INPUT = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="teamtr", description="Language-model teams.")
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train a team from a TOML config")
    train.add_argument("--config", required=True, help="TOML file (see configs/default.toml)")
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
    commands.add_parser("swap", help="plug-and-play model swap (not available for LLM teams yet)")
    return parser


def _train(args: argparse.Namespace) -> int:
    import dataclasses

    from llm.train import train

    config = load_config(args.config)
    if args.name:
        config = dataclasses.replace(config, run=dataclasses.replace(config.run, name=args.name))
    run_dir = train(config, Path(args.config).stem, progress=not args.no_progress)
    print(f"run directory: {run_dir}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from llm.evaluation import evaluate_team
    from llm.train import build, checkpoint_directory, load_team_from_checkpoint

    if args.run:
        run_dir = Path(args.run)
        config = load_config(run_dir / "config.json")
        try:
            checkpoint = checkpoint_directory(run_dir, args.step)
        except FileNotFoundError as error:
            raise ConfigError(str(error)) from None
        parts = build(config)
        team = load_team_from_checkpoint(parts.team, checkpoint)
    else:
        config = load_config(args.config)
        parts = build(config)
        team = parts.team
    problems = load_jsonl(args.data) if args.data else parts.test_problems
    if not problems:
        raise ConfigError("no evaluation problems: pass --data or use a config with a test set")
    result = evaluate_team(team, parts.sampler, problems, samples=args.samples)
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
        print(
            "error: `teamtr swap` is not implemented for language-model teams yet", file=sys.stderr
        )
        return BAD_INPUT
    except (ConfigError, TaskDataError, ModelNotAvailableError) as error:
        print(f"error: {error}", file=sys.stderr)
        return BAD_INPUT


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
