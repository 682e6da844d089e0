"""``teamtr train``, ``eval``, ``swap``, ``chat``, ``export`` and ``plot`` for language-model teams.

``teamtr.cli`` forwards these subcommands here with ``argv`` starting at the subcommand. Each
command's module makes its own parser and runs it (``train_command``, ``eval_command``,
``swap_command``, ``chat``, ``export``, ``plot``); this module gathers the parsers and turns every
error into one line and an exit code. Everything that can be checked is checked before a model
loads: arguments (each number has a range), config, data files (every line, every answer),
paths to be written, the run lock. Exit codes (``docs/runs.md``):

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
import sys
from typing import NoReturn

from llm.common.command_faults import (
    DistributedSetupError,
    IncompatibleTeamError,
    ModelNotAvailableError,
    RunDirectoryError,
    RunFailed,
    leave_the_report_to_rank_zero,
    rank_from_environment,
)
from llm.common.config import ConfigError
from llm.interface import chat, eval_command, export, plot, swap_command, train_command
from llm.interface.cli_args import BAD_INPUT, RUN_FAILED
from llm.problems.tasks import TaskError

COMMANDS = (train_command, eval_command, swap_command, chat, export, plot)
"""The modules of the commands, in the order ``teamtr --help`` lists them; each has
``add_parser(commands)``."""


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line, like every other bad input."""

    def error(self, message: str) -> NoReturn:
        self.exit(BAD_INPUT, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="teamtr", description="Language-model teams.")
    commands = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(commands)
    return parser


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
    try:
        if args.command == "train":
            return train_command.run_train(args, argv)
        if args.command == "eval":
            return eval_command.run_eval(args)
        if args.command == "chat":
            return chat.run_chat(args)
        if args.command == "export":
            return export.run_export(args)
        if args.command == "plot":
            return plot.run_plot(args)
        return swap_command.run_swap(args)
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
