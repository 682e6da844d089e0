"""``llm.build_team``: the four parts ``teamtr.run_stage`` takes, for a language-model team.

The same call trains a tabular team and a language-model team::

    team, sampler, updater, penalty = llm.build_team(source="tiny", n_agents=2)
    report, team = teamtr.run_stage(team, sampler, updater, teamtr.StageConfig(), penalty)

Settings come from a ``RunConfig``, a TOML file (``configs/reference.toml`` documents every key),
or keyword arguments named after the config's keys (``source``, ``n_agents``, ``group_size``,
``max_new_tokens``, ...), which override the file's or the defaults' values.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, NamedTuple

from llm.agents import LoraTeam
from llm.config import ConfigError, Locator, RunConfig, check_consistent, load_config
from llm.sampler import DialogueSampler
from llm.updater import TrustRegionUpdater
from teamtr.penalty import EpisodicPenalty

SECTIONS: tuple[str, ...] = ("model", "lora", "team", "task", "sampler", "updater", "run")
"""The config sections whose keys ``build_team`` accepts as keyword arguments (the stage
settings are the ``teamtr.StageConfig`` given to ``run_stage``)."""


class TeamParts(NamedTuple):
    """What ``teamtr.run_stage`` needs besides a ``StageConfig``."""

    team: LoraTeam
    sampler: DialogueSampler
    updater: TrustRegionUpdater
    penalty: EpisodicPenalty
    """The episodic penalty of Thm 3.4 with the dialogue's horizon (turns per episode)."""


def configured(config: RunConfig, settings: dict[str, Any]) -> RunConfig:
    """``config`` with each keyword replaced in the one section that has that key.

    The keywords of one section are applied together (``n_agents=3, role_prompts=()`` is one
    consistent change), then the whole config is checked as a loaded file would be."""
    sections = {name: getattr(config, name) for name in SECTIONS}
    changes: dict[str, dict[str, Any]] = {}
    for key, value in settings.items():
        owners = [name for name, section in sections.items() if key in _fields(section)]
        if len(owners) != 1:
            where = "no config section" if not owners else f"sections {owners}"
            raise ConfigError(f"build_team: {key!r} names {where}; use a key of {list(SECTIONS)}")
        changes.setdefault(owners[0], {})[key] = value
    for name, values in changes.items():
        try:
            sections[name] = dataclasses.replace(sections[name], **values)
        except (TypeError, ValueError) as error:
            written = ", ".join(f"{key} = {value!r}" for key, value in values.items())
            raise ConfigError(f"build_team: [{name}] {written}: {error}") from None
    result = dataclasses.replace(config, **sections)
    check_consistent(result, Locator("build_team"))
    return result


def _fields(section: Any) -> set[str]:
    return {field.name for field in dataclasses.fields(section)}


def build_team(config: RunConfig | str | Path | None = None, /, **settings: Any) -> TeamParts:
    """Team, sampler, updater and penalty of a language-model team, ready for ``run_stage``.

    ``config``: a ``RunConfig``, the path of a TOML config, or None for the defaults (the real
    SmolLM2-135M-Instruct); ``settings``: config keys to override, e.g. ``source="tiny"``.
    """
    from llm.train import build

    if config is None:
        config = RunConfig()
    elif not isinstance(config, RunConfig):
        config = load_config(config)
    parts = build(configured(config, settings))
    return TeamParts(
        parts.team, parts.sampler, parts.updater, EpisodicPenalty(parts.config.sampler.turns)
    )
