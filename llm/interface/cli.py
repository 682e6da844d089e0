"""``teamtr train``, ``teamtr eval`` and ``teamtr swap`` for language-model teams.

``teamtr.cli`` forwards these subcommands here with ``argv`` starting at the subcommand.
Everything that can be checked is checked before a model loads: arguments (each number has a
range), config, data files (every line, every answer), paths to be written, the run lock.
Exit codes (``docs/runs.md``):

- 0: done;
- 1: a run stopped on a fault of its surroundings (a full disk, its run directory deleted, a
  path it cannot write): one ``error:`` line, a "failed" event and, where the disk allows, a
  checkpoint to resume from;
- 2: bad input (an argument, config, data file, model, or an unusable or locked run
  directory): one ``error:`` line naming the file, line or option and what is expected, no
  traceback, and no run directory left behind;
- 130: interrupted (Ctrl-C, SIGTERM): a checkpoint was saved; the message says how to resume.

In a data-parallel run (``--nproc``, torchrun) every rank stops on bad input and rank 0 says why.

``--check`` runs every check of a command and exits 0 without loading a model.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path
from typing import Any, NoReturn

from llm.common.config import ConfigError, check_run_name, load_config
from llm.common.devices import DEVICE_CHOICES, DEVICE_PATTERN
from llm.interface.cli_args import add_set_option, integer_at_least
from llm.models.loading import IncompatibleTeamError, ModelNotAvailableError
from llm.problems.tasks import TaskError
from llm.training.checkpoint import RunDirectoryError
from llm.training.distributed import (
    DistributedSetupError,
    launched_by_torchrun,
    leave_the_report_to_rank_zero,
    rank_from_environment,
)

RUN_FAILED = 1
BAD_INPUT = 2
INTERRUPTED = 130
MAX_SAMPLES = 1024
"""Dialogues per question in ``teamtr eval``: pass@1024 is far past any use, and the count
multiplies the evaluation's memory and time."""


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line, like every other bad input."""

    def error(self, message: str) -> NoReturn:
        self.exit(BAD_INPUT, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def _check_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--check",
        action="store_true",
        help="check arguments, config, data and paths, then exit without loading a model",
    )


def _real_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--real",
        action="store_true",
        help="with --check: also load the real model, play one batch of dialogues and say "
        "how many groups earned differing rewards (the only ones training learns from)",
    )


EXAMPLES = {
    "train": """examples:
  teamtr train --config default                        # the run to start with (SmolLM2, relay)
  teamtr train --config my_team.toml --check           # config, data and reward; no real model
  teamtr train --config my_team.toml --check --real    # ... and one batch of the real model
  teamtr train --config smoke --set stage.stages=1 --name try
  teamtr train --resume runs/try                       # continue from its newest checkpoint""",
    "eval": """examples:
  teamtr eval --run runs/try --json results/try.json   # + results/try.transcripts.jsonl
  teamtr eval --run runs/try --step 2 --samples 8 --json step2.json
  teamtr eval --config default --json untrained.json   # the untrained team""",
    "swap": """examples:
  teamtr swap --run runs/a --agent 1 --model runs/b            # -> runs/a-swap1-direct
  teamtr swap --run runs/a --agent 1 --model runs/b --align    # Stage-0 alignment first""",
    "chat": """examples:
  teamtr chat --run runs/try --question "What is 12 + 30?"
  teamtr chat --run exported_team --question "..." --note "17" --note ""
  teamtr chat --run runs/try --set sampler.max_new_tokens=64   # questions from stdin""",
    "export": """examples:
  teamtr export --run runs/try --out exported_team
  teamtr export --run runs/try --step 2 --out team_step2 --merge""",
    "plot": """examples:
  teamtr plot --run runs/try                       # runs/try/curves.png
  teamtr plot --run runs/try --out try.png
  tensorboard --logdir runs                        # every run's scalars, live""",
}
"""Each subcommand's examples, shown under its ``--help``."""


def _command(commands: Any, name: str, summary: str, description: str) -> argparse.ArgumentParser:
    """A subcommand: ``summary`` in the list of commands, ``description`` and its examples
    in its own ``--help``."""
    return commands.add_parser(
        name,
        help=summary,
        description=textwrap.fill(description, 88),  # raw: the examples keep their lines
        epilog=EXAMPLES[name],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="teamtr", description="Language-model teams.")
    commands = parser.add_subparsers(dest="command", required=True)
    _train_parser(commands)
    _eval_parser(commands)
    from llm.interface.swap import add_arguments as add_swap_arguments

    swap = _command(
        commands,
        "swap",
        "replace one agent by another adapter, directly or after Stage-0 alignment",
        "Replace agent k of a trained team by another adapter and measure the team before "
        "and after, directly or after Stage-0 alignment of the newcomer (docs/llm_results.md).",
    )
    add_swap_arguments(swap)
    _check_flag(swap)
    from llm.interface.chat import add_arguments as add_chat_arguments
    from llm.interface.export import add_arguments as add_export_arguments

    add_chat_arguments(
        _command(
            commands,
            "chat",
            "ask a trained team a question",
            "One dialogue of a trained team (a run directory or an export) about a question "
            "of one's own, each turn printed with its speaker; without --question, questions "
            "are read from stdin, one a line.",
        )
    )
    add_export_arguments(
        _command(
            commands,
            "export",
            "write a trained team as PEFT adapters for vLLM",
            "Write a checkpoint as a folder that opens without teamtr: one PEFT adapter per "
            "agent, the tokenizer, team.json (how a dialogue is rendered), a model card with "
            "the lines that build the base, and the vLLM line that serves it from that folder "
            "(--with-base writes the base vLLM loads, a GGUF source's dequantised weights).",
        )
    )
    from llm.interface.plot import add_arguments as add_plot_arguments

    add_plot_arguments(
        _command(
            commands,
            "plot",
            "draw a run's training reward and held-out curve to a PNG",
            "Draw one run's training reward, held-out accuracy (or score) and certificate per "
            "stage from its metrics.jsonl, to a PNG; no model loads.",
        )
    )
    return parser


def _train_parser(commands: Any) -> None:
    """``teamtr train``'s options: where the run starts (a config or a run to resume), its name
    and place, its seed, device and processes, ``--set``, ``--check`` and ``--real``."""
    train = _command(
        commands,
        "train",
        "train a team from a TOML config",
        "Train a team of language-model agents (LoRA adapters on one base model) that take "
        "turns in one dialogue, with KL trust-region updates, for [stage] stages; writes a "
        "run directory (docs/runs.md).",
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
    _check_flag(train)
    _real_flag(train)


def _eval_parser(commands: Any) -> None:
    """``teamtr eval``'s options: the team (a run's checkpoint or a config's untrained team),
    its problems, the files written and the samples per question."""
    evaluate = _command(
        commands,
        "eval",
        "evaluate a trained or untrained team",
        "Play every held-out question (or those of --data) greedily, or --samples K times; "
        "write the accuracy (or score), its standard error and per-group tables to --json, "
        "and every dialogue to a transcripts file beside it.",
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
    _check_flag(evaluate)


def _train_config(args: argparse.Namespace, world_size: int):
    """The config a ``train`` command runs, checked for ``world_size`` processes before any
    process group or model exists (so that a bad setup stops every rank at once)."""
    import dataclasses

    from llm.training.builder import placement_of
    from llm.training.distributed import check_world
    from llm.training.train import resumable_config

    if args.resume is not None:
        if args.name or args.seed is not None or args.output_dir is not None:
            raise ConfigError("--name, --seed and --output-dir cannot be combined with --resume")
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


def _train(args: argparse.Namespace, argv: list[str]) -> int:
    from llm.training.distributed import WorldSpec, start_process_group, stop_process_group
    from llm.training.rundir import TrainingInterrupted
    from llm.training.train import resume, train

    if args.real and not args.check:
        raise ConfigError("--real: only with --check (`teamtr train --config FILE --check --real`)")
    if args.nproc is not None:
        return _launch(args, argv)
    collective = None
    try:
        if launched_by_torchrun():
            spec = WorldSpec.from_environment()
            config = _train_config(args, spec.world_size)
            if args.check:
                return _checked(args, config)
            start_process_group(spec, config.run.device)
            from llm.training.distributed import ProcessGroupCollective

            collective = ProcessGroupCollective()
        else:
            config = _train_config(args, 1)
            if args.check:
                return _checked(args, config)
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


def _write_results(path: Path, result: dict[str, Any]) -> None:
    """Write atomically: a full disk leaves the old file (or none), never half of one."""
    from llm.training.checkpoint import write_atomically
    from llm.training.rundir import RunFailed

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
    from llm.training.rundir import RunFailed

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, data)
    except OSError as error:
        raise RunFailed(
            f"{option} {path}: cannot write {what}: {error.strerror or error}"
        ) from None


def _eval(args: argparse.Namespace) -> int:
    from llm.evaluation.held_out_problems import evaluate_team_with_episodes, transcript_records
    from llm.models.agents import LoraTeam
    from llm.training.builder import build, problem_sources, require_dialogues_fit
    from llm.training.checkpoint import find_policies, run_format
    from llm.training.preflight import require_writable_file

    destination = Path(args.json)
    require_writable_file(destination, "--json")  # before the evaluation, not after it
    transcripts = Path(args.transcripts or transcripts_beside(destination))
    require_writable_file(transcripts, "--transcripts")
    if transcripts.resolve() == destination.resolve():
        raise ConfigError(f"--transcripts: {transcripts} is the --json file; give another path")
    found = None
    if args.run is not None:
        run_dir = Path(args.run)
        run_format(run_dir)  # a foreign or newer run directory fails before anything loads
        config = load_config(run_dir / "config.json", args.set)
        n_agents = config.team.n_policies
        found = find_policies(run_dir, args.step, n_agents)  # read and verified, no model
    else:
        config = load_config(args.config, args.set)
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
    from llm.training.rundir import RunFailed

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


def _located(error: Exception, args: argparse.Namespace) -> str:
    """The message, prefixed with the config file where it names a key but no file (a check
    made on the resolved config, after the file's own checks, e.g. "[task] eval_size: ...")."""
    message = str(error)
    config = getattr(args, "config", None)
    if isinstance(error, ConfigError | TaskError) and config and message.startswith("["):
        return f"{config}: {message}"
    return message


def main(argv: list[str]) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as stop:  # --help (0) or a bad argument (2, one line already printed)
        return stop.code if isinstance(stop.code, int) else BAD_INPUT
    from llm.training.rundir import RunFailed

    try:
        if args.command == "train":
            return _train(args, argv)
        if args.command == "eval":
            return _eval(args)
        if args.command == "chat":
            from llm.interface.chat import run_chat

            return run_chat(args)
        if args.command == "export":
            from llm.interface.export import run_export

            return run_export(args)
        if args.command == "plot":
            from llm.interface.plot import run_plot

            return run_plot(args)
        from llm.interface.swap import run_swap

        return run_swap(args)
    except (
        ConfigError,
        TaskError,
        ModelNotAvailableError,
        IncompatibleTeamError,
        RunDirectoryError,
        DistributedSetupError,
    ) as error:
        if rank_from_environment() == 0:  # every rank stops; one says why
            print(f"error: {_located(error, args)}", file=sys.stderr)
        leave_the_report_to_rank_zero()
        return BAD_INPUT
    except RunFailed as error:
        print(f"error: {error}", file=sys.stderr)
        return RUN_FAILED
    except OSError as error:  # found while reading the input (faults mid-run are RunFailed)
        where = f"{error.filename}: " if error.filename else ""
        if rank_from_environment() == 0:
            print(f"error: {where}{error.strerror or error}", file=sys.stderr)
        leave_the_report_to_rank_zero()
        return BAD_INPUT


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
