"""Argument types of the ``teamtr`` language-model commands: each number has a range.

Shared by ``llm.interface.cli`` (``train``, ``eval``) and ``llm.interface.swap`` (``swap``); argparse turns the
``ArgumentTypeError`` they raise into a one-line error naming the option. ``add_set_option``
gives a command ``--set SECTION.KEY=VALUE``, in one line wherever a command reads a config.
"""

from __future__ import annotations

import argparse
import math

from llm.common.config import ConfigError, Override, parse_override


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
