"""teamtr's language-model backend (Hugging Face models taking turns in one shared context).

Public API (imported on first use, so ``import llm`` alone does not import torch):

- ``build_team(config_or_path=None, **settings) -> (team, sampler, updater, penalty)``: the
  parts ``teamtr.run_stage`` takes, e.g. ``llm.build_team(source="tiny", n_agents=2)``
- ``RunConfig`` and ``load_config``: the settings of a run, from TOML with file/key errors

Note: PyPI has an unrelated distribution that also installs a top-level ``llm``; install teamtr
in its own virtual environment (``make test`` / ``make demo`` create one in ``.venv``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llm.common.config import RunConfig, load_config
    from llm.training.builder import TeamParts, build_team

_PUBLIC = {
    "build_team": "llm.training.builder",
    "TeamParts": "llm.training.builder",
    "RunConfig": "llm.common.config",
    "load_config": "llm.common.config",
}
__all__ = ["RunConfig", "TeamParts", "build_team", "load_config"]


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'llm' has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)
