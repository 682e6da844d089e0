"""``teamtr eval``: its parser, and one evaluation of a trained team (a run's checkpoint) or an
untrained one (a config), written to a results file and a transcripts file beside it.

Every path to be written is checked before the team loads; each file is written atomically.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from llm.common.command_faults import RunFailed
from llm.common.config import ConfigError, load_config
from llm.interface.cli_args import add_check_flag, add_command, add_set_option, integer_at_least

MAX_SAMPLES = 1024
"""Dialogues per question in ``teamtr eval``: pass@1024 is far past any use, and the count
multiplies the evaluation's memory and time."""
EXAMPLES = """examples:
  teamtr eval --run runs/try --json results/try.json   # + results/try.transcripts.jsonl
  teamtr eval --run runs/try --step 2 --samples 8 --json step2.json
  teamtr eval --config default --json untrained.json   # the untrained team"""


def add_parser(commands: Any) -> None:
    """``teamtr eval``'s options: the team (a run's checkpoint or a config's untrained team),
    its problems, the files written and the samples per question."""
    evaluate = add_command(
        commands,
        "eval",
        "evaluate a trained or untrained team",
        "Play every held-out question (or those of --data) greedily, or --samples K times; "
        "write the accuracy (or score), its standard error and per-group tables to --json, "
        "and every dialogue to a transcripts file beside it.",
        EXAMPLES,
    )
    source = evaluate.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", help="run directory of `teamtr train`")
    source.add_argument(
        "--config", help="TOML config, or a shipped config's name: evaluate the untrained team"
    )
    evaluate.add_argument(
        "--step", type=integer_at_least(0), help="checkpoint stage (default: the latest)"
    )
    evaluate.add_argument(
        "--data",
        help="JSON, JSONL, CSV or Parquet file, columns mapped as the run's [task] maps them "
        "(default: the config's held-out set)",
    )
    from llm.interface.eval_data import add_arguments as add_data_arguments

    add_data_arguments(evaluate)
    evaluate.add_argument("--json", required=True, help="the results file to write")
    evaluate.add_argument(
        "--transcripts",
        help="JSONL file of every dialogue: question, notes, turns, parsed answer, reward "
        "(default: beside --json, its name ending .transcripts.jsonl)",
    )
    evaluate.add_argument(
        "--samples",
        type=integer_at_least(1, MAX_SAMPLES),
        default=1,
        help=f"K: adds pass@K and majority vote (at most {MAX_SAMPLES})",
    )
    evaluate.add_argument("--no-progress", action="store_true", help="hide progress bars and lines")
    add_set_option(evaluate)
    add_check_flag(evaluate)


def _write_results(path: Path, result: dict[str, Any]) -> None:
    """Write atomically: a full disk leaves the old file (or none), never half of one."""
    from llm.training.checkpoint import write_atomically

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps(result, indent=2).encode() + b"\n")
    except OSError as error:  # checked writable before; the disk filled up or the path went
        raise RunFailed(
            f"--json {path}: cannot write the results: {error.strerror or error}; they were "
            f"{json.dumps(result)}"
        ) from None


def transcripts_beside(results: Path) -> Path:
    """The default transcripts file of an evaluation written to ``results``."""
    return results.with_name(results.stem + ".transcripts.jsonl")


def _write_file(path: Path, data: bytes, option: str, what: str) -> None:
    """Write atomically, as ``_write_results``; a failure names the option and the file."""
    from llm.training.checkpoint import write_atomically

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, data)
    except OSError as error:
        raise RunFailed(
            f"{option} {path}: cannot write {what}: {error.strerror or error}"
        ) from None


def run_eval(args: argparse.Namespace) -> int:
    """``teamtr eval``: the team plays the problems; the results and transcripts are written."""
    from llm.training.preflight import require_writable_file

    destination = Path(args.json)
    require_writable_file(destination, "--json")  # before the evaluation, not after it
    transcripts = Path(args.transcripts or transcripts_beside(destination))
    require_writable_file(transcripts, "--transcripts")
    if transcripts.resolve() == destination.resolve():
        raise ConfigError(f"--transcripts: {transcripts} is the --json file; give another path")
    found = None
    if args.run is None:  # a config read before torch is: a typo in it ends the command at once
        config = load_config(args.config, args.set)
    from llm.evaluation.held_out_problems import evaluate_team_with_episodes, transcript_records
    from llm.models.agents import LoraTeam
    from llm.training.builder import build, problem_sources, require_dialogues_fit
    from llm.training.checkpoint import find_policies, run_format

    if args.run is not None:
        run_dir = Path(args.run)
        run_format(run_dir)  # a foreign or newer run directory fails before anything loads
        config = load_config(run_dir / "config.json", args.set)
        n_agents = config.team.n_policies
        found = find_policies(run_dir, args.step, n_agents)  # read and verified, no model
    if args.data is not None:
        from llm.interface.eval_data import evaluation_problems

        problems = evaluation_problems(config, args)
    else:
        problems = problem_sources(config)[1]
    if not problems:
        raise ConfigError("no evaluation problems: pass --data or use a config with a test set")
    if args.check:
        return 0
    parts = build(config, progress=not args.no_progress)
    require_dialogues_fit(parts.chat, parts.positions, problems, config, "--data")
    team = parts.team if found is None else LoraTeam(parts.team.backbone, found.policies)
    evaluation = evaluate_team_with_episodes(
        team, parts.sampler, problems, samples=args.samples, progress=not args.no_progress
    )
    records = transcript_records(evaluation, args.samples, parts.chat.message_text)
    result: dict[str, Any] = dict(evaluation.metrics)
    unwritten: RunFailed | None = None
    try:
        _write_file(
            transcripts,
            "".join(json.dumps(record) + "\n" for record in records).encode(),
            "--transcripts",
            "the transcripts",
        )
        result["transcripts"] = str(transcripts)
    except RunFailed as error:  # the results are still written (or printed) below
        result["transcripts"] = None
        unwritten = error
    if found is not None:
        result["run"] = str(args.run)
        result["checkpoint"] = found.directory.name
        result["skipped_checkpoints"] = list(found.skipped)
    else:
        result["checkpoint"] = None  # the untrained team of --config
    _write_results(destination, result)
    print(json.dumps(result))
    if unwritten is not None:
        raise unwritten
    return 0
