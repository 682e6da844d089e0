"""The options every study shares, ``--seeds``, ``--radius``, ``--json`` and ``--plot``, defined
and checked once.

A study adds them with the ``add_*`` functions and checks them, next to its own options, in its
``run`` before any work: each ``*_problem`` function returns ``None`` for a good value and
otherwise one line that names the option, and ``refuse`` prints that line and returns exit code
2. The checks run in ``run``, not as argparse types, so that a bad value is one line on stderr
and a return value (``teamtr.cli.main`` returns it), as for every other bad input.

Seeds come in two kinds: a count (``--seeds 24``: seeds 0..23, one per instance, the tabular
studies and ``llm-scaling``) and a list (``--seeds 0 1 2``: ``seed-study``). Either way every
seed is a valid numpy and torch seed, 0..2^31-1.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from teamtr.trust_region import radius_error

SEED_LIMIT = 2**31 - 1
"""The largest seed: numpy's and torch's generators take 0..2^31-1 everywhere."""

RADIUS_HELP = "delta_i, the per-agent KL radius of Thm 3.4"


def add_json(parser: argparse.ArgumentParser, help: str = "write the results here") -> None:
    """``--json PATH``: the study's result document (its folder is made when written)."""
    parser.add_argument("--json", type=Path, default=None, help=help)


def add_plot(parser: argparse.ArgumentParser, help: str = "draw the figure here (PNG)") -> None:
    """``--plot PATH``: the study's figure (its folder is made when drawn)."""
    parser.add_argument("--plot", type=Path, default=None, help=help)


def add_radius(parser: argparse.ArgumentParser, default: float, help: str = RADIUS_HELP) -> None:
    """``--radius DELTA``: the per-agent trust-region radius, a finite number > 0."""
    parser.add_argument("--radius", type=float, default=default, help=help)


def add_seed_count(parser: argparse.ArgumentParser, default: int, help: str) -> None:
    """``--seeds N``: the study runs seeds 0..N-1 (or from a first seed the study adds)."""
    parser.add_argument("--seeds", type=int, default=default, help=help)


def add_seed_list(parser: argparse.ArgumentParser, default: Sequence[int], help: str) -> None:
    """``--seeds S [S ...]``: the study runs exactly these seeds."""
    parser.add_argument("--seeds", type=int, nargs="+", default=list(default), help=help)


def seed_count_problem(count: int, first: int = 0, first_flag: str = "--first-seed") -> str | None:
    """None if ``--seeds count`` from ``first`` (seeds first..first+count-1) are at least one
    seed, all in 0..2^31-1; else why not."""
    if count < 1:
        return f"--seeds must be >= 1, got {count}"
    if not 0 <= first <= SEED_LIMIT:
        return f"{first_flag} must lie in 0..2^31-1, got {first}"
    if first + count - 1 > SEED_LIMIT:
        return f"--seeds {count} from seed {first} passes the last seed, 2^31-1"
    return None


def seed_list_problem(seeds: Iterable[int], flag: str = "--seeds") -> str | None:
    """None if every seed lies in 0..2^31-1, else the first that does not."""
    for seed in seeds:
        if not 0 <= seed <= SEED_LIMIT:
            return f"{flag}: every seed must lie in 0..2^31-1, got {seed}"
    return None


def radius_problem(value: float, flag: str = "--radius") -> str | None:
    """None if ``value`` is a valid radius, else why not: the core's one rule
    (``teamtr.trust_region.check_radius``, which ``StageConfig`` applies), its message after
    the option's name."""
    problem = radius_error(value)
    return None if problem is None else f"{flag}: {problem}"


def output_problem(path: Path | None, flag: str) -> str | None:
    """None if a file can be written at ``path`` (its missing folders made first), else why not.

    Checked before a study starts, so that a long study does not end in an unwritable path.
    """
    if path is None:
        return None
    if path.is_dir():
        return f"{flag}: {path} is a folder; give the path of a file"
    existing = path.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{flag}: {existing} is not a folder, so {path} cannot be written"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{flag}: cannot write in {existing}"
    return None


def first_problem(*problems: str | None) -> str | None:
    """The first of ``problems`` that is not None (checks listed in the order of the options)."""
    return next((problem for problem in problems if problem is not None), None)


def prepared(path: Path) -> Path:
    """``path`` with its folder made (for ``--json`` and ``--plot`` files)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def refuse(prog: str, problem: str) -> int:
    """Print the one line of a bad option and return exit code 2."""
    print(f"error: {prog}: {problem}", file=sys.stderr)
    return 2
