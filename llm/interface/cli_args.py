"""What every ``teamtr`` language-model command shares: how its parser is made, its exit codes,
``--check``, ``--real``, ``--set``, and argument types in which each number has a range.

Each command's module (``train_command``, ``eval_command``, ``swap``, ``chat``, ``export``,
``plot``) makes its own parser with ``add_command``; ``llm.interface.cli`` only gathers them.
argparse turns the ``ArgumentTypeError`` the types raise into a one-line error naming the
option. ``add_set_option`` gives a command ``--set SECTION.KEY=VALUE``, in one line wherever a
command reads a config.
"""

from __future__ import annotations

import argparse
import math
import textwrap
from typing import Any

from llm.common.config import ConfigError, Override, parse_override

RUN_FAILED = 1
BAD_INPUT = 2
INTERRUPTED = 130
"""The exit codes of a command besides 0 (``llm.interface.cli`` says when each is given)."""


def add_command(
    commands: Any, name: str, summary: str, description: str, examples: str
) -> argparse.ArgumentParser:
    """A subcommand: ``summary`` in the list of commands, ``description`` and ``examples``
    (lines under an ``examples:`` heading) in its own ``--help``."""
    return commands.add_parser(
        name,
        help=summary,
        description=textwrap.fill(description, 88),  # raw: the examples keep their lines
        epilog=examples,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def add_check_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--check",
        action="store_true",
        help="check arguments, config, data and paths, then exit without loading a model",
    )


def add_real_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--real",
        action="store_true",
        help="with --check: also load the real model, play one batch of dialogues and say "
        "how many groups earned differing rewards (the only ones training learns from)",
    )


def integer_at_least(lowest: int, highest: int | None = None):
    """An argparse type: an integer >= ``lowest`` (and <= ``highest``, where a larger value
    would only exhaust the memory or the patience)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < lowest:
            raise argparse.ArgumentTypeError(f"must be >= {lowest}, got {value}")
        if highest is not None and value > highest:
            raise argparse.ArgumentTypeError(f"must be <= {highest}, got {value}")
        return value

    return parse


def positive_number(text: str) -> float:
    """An argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def _override(text: str) -> Override:
    try:
        return parse_override(text)
    except ConfigError as error:  # argparse shows an ArgumentTypeError's own message
        raise argparse.ArgumentTypeError(str(error).removeprefix(f"--set {text}: ")) from None


def add_set_option(parser: argparse.ArgumentParser, example: str = "stage.stages=1") -> None:
    """``--set SECTION.KEY=VALUE`` (repeatable) on a command that reads a config: one key
    changed without a file of one's own (TRL's parser and Hydra's overrides do the same).
    The values arrive as ``args.set`` (a list of ``llm.common.config.Override``) for
    ``load_config(path, args.set)``, which checks them by the rules a file's keys follow.
    ``example``: a key the command's help shows (one that changes what that command does)."""
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        type=_override,
        metavar="SECTION.KEY=VALUE",
        help=f"override one config key, its value written as in TOML, e.g. --set {example} "
        "(repeatable; checked as the file's keys are)",
    )
