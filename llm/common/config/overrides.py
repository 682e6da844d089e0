"""Values given on the command line instead of in the file: ``--set SECTION.KEY=VALUE``, the
keys a resumed run may change, and a run name given as ``--name``.

A ``--set`` value is parsed here and checked later by the same rules as a file's
(``llm.common.config.coercion.config_from_dict``), its errors naming the option.
"""

from __future__ import annotations

import re
import tomllib
import typing
from typing import Any

from llm.common.config.locator import ConfigError
from llm.common.rules import KEY_RULES

Override = tuple[str, str, Any]
"""One ``--set SECTION.KEY=VALUE``: the section, the key and the value, parsed as TOML."""


def parse_override(text: str) -> Override:
    """``SECTION.KEY=VALUE`` as (section, key, value); VALUE is a TOML value (``1``, ``0.05``,
    ``true``, ``[1, 2]``, ``"text"``), and a bare word that is not one is read as a string
    (``run.name=probe``), as Hydra and TRL's parser read theirs. What the value must be is
    checked later, by the same rules as a file's (``config_from_dict``)."""
    setting, equals, written = text.partition("=")
    section, dot, key = setting.strip().partition(".")
    if not equals or not dot or not section or not re.fullmatch(r"[A-Za-z_]\w*", key.strip()):
        raise ConfigError(f"--set {text}: expected SECTION.KEY=VALUE, e.g. stage.stages=1")
    written = written.strip()
    try:
        value = tomllib.loads(f"value = {written}")["value"]
    except tomllib.TOMLDecodeError:
        if not written or written[0] in "[{\"'":
            raise ConfigError(
                f"--set {text}: {written!r} is not a TOML value (a number, true/false, a "
                '"string", a [list] or an {inline = "table"})'
            ) from None
        value = written
    return section, key.strip(), value


RESUMABLE_KEYS = frozenset(
    {
        ("stage", "stages"),
        ("run", "time_budget_minutes"),
        ("run", "eval_every"),
        ("run", "checkpoint_every"),
        ("run", "keep_checkpoints"),
        ("run", "threads"),
        ("run", "device"),
        ("sampler", "engine_url"),
        ("sampler", "engine_key_variable"),
        ("sampler", "engine_trusted_network"),
        ("sampler", "engine_args"),
    }
)
"""The keys ``--set`` may change when a run resumes: how long it goes on, how often it is
evaluated and saved, where it runs. Every other key would make the resumed stages those of
another run than the one its checkpoints and metrics belong to."""


def require_resumable_overrides(overrides: typing.Sequence[Override]) -> None:
    """A ``ConfigError`` naming the first ``--set`` key a resumed run cannot change."""
    for section, key, _ in overrides:
        if (section, key) not in RESUMABLE_KEYS:
            allowed = ", ".join(f"{s}.{k}" for s, k in sorted(RESUMABLE_KEYS))
            raise ConfigError(
                f"--set {section}.{key}: cannot change when a run resumes (its checkpoints "
                f"were trained with the recorded value); a resumed run may change {allowed}"
            )


def with_overrides(data: dict[str, Any], overrides: typing.Sequence[Override]) -> dict[str, Any]:
    """``data`` with every ``--set`` value in place (the last of a key's wins)."""
    merged = dict(data)
    for section, key, value in overrides:
        table = merged.get(section, {})
        merged[section] = {**table, key: value} if isinstance(table, dict) else {key: value}
    return merged


def check_run_name(name: str, where: str) -> None:
    """A run directory name (``[run] name``'s rule, ``llm.common.rules``) for a name given
    elsewhere (``--name``); ``where`` names the option."""
    rule = KEY_RULES[("run", "name")]
    if not name or not rule.admits(name):  # in a config, "" means the default name
        raise ConfigError(f"{where}: {rule.expected}, got {name!r}")
