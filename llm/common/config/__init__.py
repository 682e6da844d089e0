"""Run configuration: a TOML file whose sections map onto frozen dataclasses.

Every field is documented where it is defined (``LoraSettings``, ``SamplerSettings``,
``UpdaterSettings`` in ``llm.common.settings``, the other sections in ``schema``);
``configs/reference.toml`` lists them all (the shipped configs live in ``llm/configs/``,
``PACKAGED_CONFIGS``, and are found by name). Unknown sections or keys, wrong types, non-finite
numbers and out-of-range values raise ``ConfigError`` naming the file, the line (for TOML), the
section and key, and what is expected; the CLI turns that into exit code 2. ``ConfigError`` is
the only exception the parser raises on any input.

The modules, in the order a file goes through them:

- ``files``: ``load_config``: finding the file (or a shipped config), its ``extends`` chain,
  the ``--set`` values, the task's folder;
- ``overrides``: ``--set SECTION.KEY=VALUE``, the keys a resumed run may change, ``--name``;
- ``coercion``: each value to its field's type, each section built, ``config_from_dict``;
- ``schema``: the sections, their fields and what each one means;
- ``across_sections``: the rules that no section can check alone;
- ``locator``: ``ConfigError`` and the file, line and key it names.
"""

from llm.common.config.across_sections import (
    CROSS_SECTION_RULES,
    builtin_test_set_fits,
    check_consistent,
)
from llm.common.config.coercion import DERIVED_KEYS, RENAMED_KEYS, config_from_dict
from llm.common.config.files import (
    EXTENDS,
    PACKAGED_CONFIGS,
    find_config,
    load_config,
    packaged_config,
    packaged_config_names,
    with_task_directory,
)
from llm.common.config.locator import ConfigError, Locator, did_you_mean
from llm.common.config.overrides import (
    RESUMABLE_KEYS,
    Override,
    check_run_name,
    parse_override,
    require_resumable_overrides,
)
from llm.common.config.schema import (
    TASK_KINDS,
    ModelSettings,
    RunConfig,
    RunSettings,
    StageSettings,
    TaskSettings,
    TeamSettings,
)
from llm.common.settings import LoraSettings, SamplerSettings, UpdaterSettings

__all__ = [
    "CROSS_SECTION_RULES",
    "DERIVED_KEYS",
    "EXTENDS",
    "PACKAGED_CONFIGS",
    "RENAMED_KEYS",
    "RESUMABLE_KEYS",
    "TASK_KINDS",
    "ConfigError",
    "Locator",
    "LoraSettings",
    "ModelSettings",
    "Override",
    "RunConfig",
    "RunSettings",
    "SamplerSettings",
    "StageSettings",
    "TaskSettings",
    "TeamSettings",
    "UpdaterSettings",
    "builtin_test_set_fits",
    "check_consistent",
    "check_run_name",
    "config_from_dict",
    "did_you_mean",
    "find_config",
    "load_config",
    "packaged_config",
    "packaged_config_names",
    "parse_override",
    "require_resumable_overrides",
    "with_task_directory",
]
