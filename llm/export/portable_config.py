"""``run_config.json`` of an export: the run's config with every path of the exporting machine
cut to its last part, so that an export names nothing of the machine it was written on."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any


def portable_name(text: str) -> str:
    """A path of this machine by its last part (``/home/me/models/m.gguf`` -> ``m.gguf``);
    anything else as it is."""
    if len(text) > 1 and text.startswith(("/", "~")):
        return Path(text).name
    return text


PATH_KEYS = {
    "model": ("source", "sources"),
    "task": ("directory", "train_file", "test_file"),
    "run": ("output_dir",),
}
"""The keys of a run's config that hold paths (``llm.common.config``); every other string
(prompts, names, rewards' arguments) is kept as written, even where it starts with "/"."""


def portable(config: dict[str, Any]) -> dict[str, Any]:
    """A run's config (as JSON) with every path of this machine cut to its last part, so that
    an export names nothing of the machine it was written on: the values of ``PATH_KEYS``, and
    those of ``[task] args`` (a factory's own keywords) that name a file or folder that exists
    here. A loaded export reads only the team's keys from it (roles, router, lengths); a task
    rebuilt from it finds its files next to the config, where ``[task] directory`` (then
    empty) puts them."""
    cut = copy.deepcopy(config)
    for section, keys in PATH_KEYS.items():
        table = cut.get(section)
        if not isinstance(table, dict):
            continue
        for key in keys:
            if key in table:
                table[key] = _portable_paths(table[key], lambda text: True)
    task = cut.get("task")
    if isinstance(task, dict):
        directory = config["task"].get("directory")
        if isinstance(directory, str) and portable_name(directory) != directory:
            task["directory"] = ""  # the folder of the config, wherever the export lies
        if "args" in task:
            task["args"] = _portable_paths(task["args"], _exists_here)
    return cut


def _exists_here(text: str) -> bool:
    return Path(text).expanduser().exists()


def _portable_paths(value: Any, is_path: Callable[[str], bool]) -> Any:
    """``value`` with each string that ``is_path`` takes for a path cut by ``portable_name``,
    in lists and tables too."""
    if isinstance(value, dict):
        return {key: _portable_paths(item, is_path) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_portable_paths(item, is_path) for item in value]
    if isinstance(value, str) and is_path(value):
        return portable_name(value)
    return value
