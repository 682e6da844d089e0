"""Checks made before the first expensive step, so that bad input never costs a model load.

Each raises ``ConfigError`` (exit code 2) with one message naming the option or key, the path
or value, and what is expected: where a run directory or a results file will go (a directory
that can be created and written, with some free space), whether a run name is one path
component (``llm.common.config.check_run_name``), and whether the longest dialogue fits the
model's context window.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from llm.common.config import ConfigError, check_run_name

__all__ = [
    "MIN_FREE_BYTES",
    "check_run_name",
    "require_context_fits",
    "require_writable_directory",
    "require_writable_file",
]

MIN_FREE_BYTES = 64 * 2**20
"""Free space a run directory's file system must have at the start: a floor that catches an
(almost) full disk before the model loads. It is not a promise: a checkpoint of the default
config holds three adapters of 4,884,480 float32 parameters (19.5 MB each) and two Adam moments
for each, about 176 MB, so a run can still fill a disk later; that ends it cleanly (exit 1)."""


def _nearest_existing(path: Path) -> Path:
    """``path`` or its closest ancestor that exists (what a ``mkdir -p`` would start from)."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _probe_writable(directory: Path, where: str) -> None:
    """Create and remove a file in ``directory``: the only test that sees read-only mounts,
    permissions and full disks alike."""
    try:
        descriptor, name = tempfile.mkstemp(prefix=".teamtr-probe-", dir=directory)
    except OSError as error:
        raise ConfigError(f"{where}: {directory} is not writable ({error.strerror})") from None
    os.close(descriptor)
    os.unlink(name)


def require_writable_directory(path: Path, where: str, min_free: int = 0) -> None:
    """``path`` is, or can be created as, a directory this process can write in."""
    start = _nearest_existing(path)
    if not start.is_dir():
        raise ConfigError(f"{where}: {start} is not a directory (a file is in the way)")
    _probe_writable(start, where)
    if min_free:
        free = shutil.disk_usage(start).free
        if free < min_free:
            raise ConfigError(
                f"{where}: only {free / 2**20:.1f} MB free on {start}; a run needs at least "
                f"{min_free / 2**20:.0f} MB"
            )


def require_writable_file(path: Path, where: str) -> None:
    """``path`` can be written as a file: not a directory, its directory creatable and writable."""
    if path.is_dir():
        raise ConfigError(f"{where}: {path} is a directory; give a file path such as {path}/x.json")
    if path.exists() and not path.is_file():
        raise ConfigError(f"{where}: {path} is not a regular file")
    require_writable_directory(path.parent, where)


def require_context_fits(
    context_length: int,
    prompt_lengths: Iterable[int],
    per_turn_overhead: int,
    turns: int,
    max_new_tokens: int,
    where: str,
) -> None:
    """The longest dialogue (prompt, then ``turns`` messages of at most ``max_new_tokens`` each
    with their headers) must fit the model's positions: past them a model does not fail, it
    computes garbage, slowly."""
    longest_prompt = max(prompt_lengths, default=0)
    longest = longest_prompt + turns * (per_turn_overhead + max_new_tokens)
    if longest > context_length:
        raise ConfigError(
            f"{where}: the longest dialogue needs {longest} tokens (prompt {longest_prompt} + "
            f"{turns} turns x ({max_new_tokens} new + {per_turn_overhead} format)) but the model "
            f"has {context_length} positions; lower [sampler] max_new_tokens or turns, or "
            "shorten the questions"
        )
