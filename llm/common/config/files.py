"""Reading a config file: TOML (with its ``extends`` chain) or a run directory's JSON, found by
path or by the name of a shipped config, with ``--set`` values applied last and the task's
folder made absolute.

``load_config`` is the entry point; every failure, from a missing file to a cycle of
``extends``, is a one-line ``ConfigError`` naming the file.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
import typing
from pathlib import Path
from typing import Any

from llm.common.config.coercion import config_from_dict
from llm.common.config.locator import ConfigError
from llm.common.config.overrides import Override, with_overrides
from llm.common.config.schema import RunConfig

EXTENDS = "extends"
"""Top-level TOML key: the path (relative to the file) of a config whose values this one
overrides key by key; e.g. ``extends = "../default.toml"`` plus the few keys that differ."""


def _merged(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    merged = {name: dict(section) for name, section in base.items()}
    for name, section in overrides.items():
        if isinstance(section, dict) and isinstance(merged.get(name), dict):
            merged[name].update(section)
        else:
            merged[name] = section
    return merged


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    try:
        return path.read_bytes().decode("utf-8")
    except OSError as error:
        raise ConfigError(f"{path}: cannot read: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not UTF-8 text (byte {error.start})") from None


def _parse(path: Path, text: str) -> Any:
    try:
        return json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as error:
        raise ConfigError(f"{path}: cannot parse: {error}") from None
    except RecursionError:
        raise ConfigError(f"{path}: cannot parse: nested too deeply") from None


def _read_toml_chain(path: Path, seen: tuple[Path, ...]) -> tuple[dict[str, Any], str]:
    """A TOML file's data with its ``extends`` chain resolved, and the file's own text."""
    text = _read_text(path)
    data = _parse(path, text)
    parent = data.pop(EXTENDS, None)
    if parent is None:
        return data, text
    if not isinstance(parent, str):
        raise ConfigError(f"{path}: {EXTENDS} must be a path string, got {parent!r}")
    parent_path = _parent_config(path, parent)
    if parent_path in seen:
        raise ConfigError(f"{path}: {EXTENDS} = {parent!r} makes a cycle")
    base, base_text = _read_toml_chain(parent_path, (*seen, parent_path))
    config_from_dict(base, str(parent_path), base_text)  # the parent is valid on its own
    task = base.get("task")
    if isinstance(task, dict) and _reads_files(task):
        # The parent names the task's code or data: they lie next to the parent (or in the
        # folder it names, relative to itself), not to the file that extends it (a child may
        # name a directory of its own).
        named = task.get("directory", "")
        if isinstance(named, str):
            base["task"] = {**task, "directory": str((parent_path.parent / named).resolve())}
    return _merged(base, data), text


def _parent_config(path: Path, parent: str) -> Path:
    """The file ``extends = parent`` (in ``path``) names: a path relative to ``path``'s folder
    where one exists (an existing path always wins), else a shipped config of that name, as
    ``--config`` finds one (``extends = "smoke"`` from any folder)."""
    local = path.parent / parent
    if local.exists():
        return local.resolve()
    shipped = packaged_config(Path(parent))
    if shipped is None:
        raise ConfigError(
            f"{path}: {EXTENDS} = {parent!r}: no such config file (looked for {local} and for a "
            f"shipped config of that name; the shipped configs: {', '.join(packaged_config_names())})"
        )
    return shipped.resolve()


def _reads_files(task: dict[str, Any]) -> bool:
    """Whether a ``[task]`` table names code or data files of its own folder."""
    environment = str(task.get("environment", ""))
    return task.get("kind") in ("python", "dataset") or bool(
        task.get("reward") or task.get("metric") or ":" in environment
    )


PACKAGED_CONFIGS = Path(__file__).resolve().parents[2] / "configs"
"""The configs that ship with the package (``configs/`` in a clone is a link to this folder)."""


def packaged_config_names() -> list[str]:
    """The names of the packaged configs, e.g. ``default`` and ``chain/chain4_teamtr``."""
    return sorted(
        path.relative_to(PACKAGED_CONFIGS).with_suffix("").as_posix()
        for path in PACKAGED_CONFIGS.rglob("*.toml")
    )


def _packaged_path(path: Path) -> Path:
    """Where the shipped config named ``path`` would be (``configs/`` prefix and ``.toml``
    suffix optional)."""
    parts = path.parts[1:] if path.parts[:1] == ("configs",) and len(path.parts) > 1 else path.parts
    packaged = PACKAGED_CONFIGS.joinpath(*parts)
    return packaged if packaged.suffix == ".toml" else packaged.with_name(packaged.name + ".toml")


def packaged_config(path: Path) -> Path | None:
    """The shipped config named ``path`` (``smoke``, ``chain/chain4_teamtr``), None if none."""
    if path.is_absolute() or ".." in path.parts or not path.parts:
        return None
    packaged = _packaged_path(path)
    return packaged if packaged.is_file() else None


def find_config(name: str | Path) -> Path:
    """The TOML file ``name`` stands for: the path itself where it exists (an existing path
    always wins), else the packaged config of that name (``default``, ``chain/chain4_teamtr``,
    with or without ``.toml``, also as ``configs/default.toml`` outside a clone), so that an
    installed package runs its shipped configs from any folder.

    Raises ``ConfigError`` with one line saying where it looked and which names there are.
    """
    path = Path(name)
    if path.exists():
        return path
    names = ", ".join(packaged_config_names())
    if path.is_absolute() or ".." in path.parts:
        raise ConfigError(
            f"{path}: no such config file (a path, so not a packaged config; the packaged "
            f"configs, in {PACKAGED_CONFIGS}: {names})"
        )
    packaged = packaged_config(path)
    if packaged is not None:
        return packaged
    raise ConfigError(
        f"{path}: no such config file (looked for {path} in {Path.cwd()} and for "
        f"{_packaged_path(path)}; "
        f"the packaged configs, in {PACKAGED_CONFIGS}: {names})"
    )


def with_task_directory(config: RunConfig, path: Path) -> RunConfig:
    """``config`` with ``[task] directory`` made absolute where the task reads code or data
    files of its own: the folder of the config file ``path`` when unset, or the one it names
    relative to that folder. A run directory's
    config.json keeps it, so a resumed run finds the same modules and files."""
    if not _reads_files(dataclasses.asdict(config.task)):
        return config  # a built-in task reads no code and no file of its own folder
    folder = path.resolve().parent
    directory = str((folder / config.task.directory).resolve())
    return dataclasses.replace(config, task=dataclasses.replace(config.task, directory=directory))


def load_config(path: str | Path, overrides: typing.Sequence[Override] = ()) -> RunConfig:
    """Read and validate a TOML (or a run directory's resolved JSON) configuration.

    ``path`` is a file, or the name of a packaged config (``find_config``: ``default``,
    ``chain/chain4_teamtr``). A TOML file may start with ``extends = "other.toml"`` (or the
    name of a shipped config, ``extends = "smoke"``): its values then override those of the
    other file (itself validated first), section by section and key by key. ``overrides``
    (``--set``, ``parse_override``) replace single keys last, checked as the file's are.
    """
    path = Path(path)
    overridden = frozenset((section, key) for section, key, _ in overrides)
    if path.suffix != ".json":
        path = find_config(path)
        data, text = _read_toml_chain(path, (path.resolve(),))
        data = with_overrides(data, overrides)
        config = config_from_dict(data, str(path), text, overridden)
        return with_task_directory(config, path)
    text = _read_text(path)
    data = _parse(path, text)
    if overrides and isinstance(data, dict):
        data = with_overrides(data, overrides)
    return config_from_dict(data, str(path), text, overridden)
