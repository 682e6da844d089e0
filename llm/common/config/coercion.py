"""From parsed TOML or JSON to a checked ``RunConfig``: each value coerced to its field's
annotation, each section built (its own rules run in ``__post_init__``), then the rules across
sections (``llm.common.config.across_sections``).

Coercion is strict where TOML is loose: a bool is not a number, an integer is not a string, a
number must be finite, a ``Literal`` takes only its own values, and a table must survive JSON
(a run directory stores its config as JSON). Every error names its key through the
``Locator``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from typing import Any, Literal

from llm.common.config.across_sections import check_consistent
from llm.common.config.locator import ConfigError, Locator, did_you_mean
from llm.common.config.schema import RunConfig
from llm.common.rules import SettingError


def _coerce(value: Any, annotation: Any, where: str) -> Any:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        if isinstance(value, bool) or not any(value == a and type(value) is type(a) for a in args):
            raise ConfigError(f"{where}: expected one of {list(args)}, got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        # Try the options that take a value of this shape (a list or a scalar), so that the
        # message speaks of what was written: radius = nan is "not finite", not "not a list".
        is_list = isinstance(value, list | tuple)
        fitting = [a for a in args if (typing.get_origin(a) is tuple) == is_list] or list(args)
        first_error: ConfigError | None = None
        for option in fitting:
            try:
                return _coerce(value, option, where)
            except ConfigError as error:
                first_error = first_error or error
        assert first_error is not None
        raise first_error
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table of keys, got {value!r}")
        try:  # a run directory stores its config as JSON: the values must survive that
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):
            raise ConfigError(
                f"{where}: expected strings, numbers, booleans, lists and tables, got {value!r}"
            ) from None
        return dict(value)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return tuple(_coerce(v, args[0], where) for v in value)
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{where}: expected a finite number, got {value!r}")
        return float(value)
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if annotation is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    if annotation is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    return value


RENAMED_KEYS: dict[tuple[str, str], str] = {("stage", "update_order"): "order"}
"""Keys of older configs (and run directories) read under their current name."""
DERIVED_KEYS: dict[tuple[str, str], str] = {("stage", "seed"): "[run] seed"}
"""Fields that are not keys of their own: the loader sets them from the key named here."""


def _section(cls: type, data: Any, name: str, locate: Locator) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{locate(name)}: expected a table of keys, got {data!r}")
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls) if (name, f.name) not in DERIVED_KEYS]
    values = {}
    for written, value in data.items():
        key: str = RENAMED_KEYS.get((name, str(written)), str(written))
        if key != written and key in data:
            raise ConfigError(
                f"{locate(name, written)}: {written!r} is the old name of {key!r}; give one"
            )
        where = locate(name, written)
        if (name, key) in DERIVED_KEYS:
            raise ConfigError(f"{where}: not a key of its own; it is {DERIVED_KEYS[(name, key)]}")
        if key not in known:
            raise ConfigError(
                f"{where}: unknown key {key!r}{did_you_mean(key, known)} (known keys: "
                f"{', '.join(known)})"
            )
        values[key] = _coerce(value, hints[key], where)
    try:
        return cls(**values)
    except SettingError as error:  # every rule of one section (llm.common.rules) names its key
        written = next((w for w in data if RENAMED_KEYS.get((name, w), w) == error.key), error.key)
        raise ConfigError(f"{locate(name, written)}: {error.message}") from None
    except (ValueError, TypeError) as error:
        raise ConfigError(f"{locate(name)}: {error}") from None


def config_from_dict(
    data: Any, source: str, text: str = "", overridden: frozenset[tuple[str, str]] = frozenset()
) -> RunConfig:
    """Validate parsed TOML/JSON ``data``; ``text`` (the file's text) lets messages give lines;
    ``overridden``: the (section, key) pairs given by ``--set`` (their errors name it)."""
    locate = Locator(source, text, overridden)
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a table of sections, got {type(data).__name__}")
    hints = typing.get_type_hints(RunConfig)
    sections = {}
    for name, value in data.items():
        if name not in hints:
            raise ConfigError(
                f"{locate.place(name)}: unknown section [{name}]{did_you_mean(name, hints)} "
                f"(known: {', '.join(hints)})"
            )
        sections[name] = _section(hints[name], value, name, locate)
    config = RunConfig(**sections)
    check_consistent(config, locate)
    return config
