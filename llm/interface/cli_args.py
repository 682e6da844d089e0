"""Argument types of the ``teamtr`` language-model commands: each number has a range.

Shared by ``llm.interface.cli`` (``train``, ``eval``) and ``llm.interface.swap`` (``swap``); argparse turns the
``ArgumentTypeError`` they raise into a one-line error naming the option.
"""

from __future__ import annotations

import argparse
import math


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
