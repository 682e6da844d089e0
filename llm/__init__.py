"""teamtr's language-model backend (Hugging Face models taking turns in one shared context).

Public API (imported on first use, so ``import llm`` alone does not import torch):

- ``build_team(config_or_path=None, **settings) -> (team, sampler, updater, penalty)``: the
  parts ``teamtr.run_stage`` takes, e.g. ``llm.build_team(source="tiny", n_agents=2)``
- ``RunConfig`` and ``load_config``: the settings of a run, from TOML with file/key errors
- ``Task``, ``Problem``, ``Dialogue``, ``Roles``: a task of one's own (problems and a reward
  over finished dialogues), e.g. ``llm.build_team(task=llm.Task(train=[...], reward=score))``
- ``check_task(task, config=None)``: a task tried end to end on a tiny random model
- ``final_answer_reward``: the default reward (math-verify on the final message)
- ``load_team(path, step=None)``: the trained team of a run directory or export, as a
  ``TrainedTeam`` whose ``play(question, notes)`` returns a ``Dialogue``; ``save_team(team,
  path, ...)``: a team trained in Python written as an export (PEFT adapters, team.json)

Note: PyPI has an unrelated distribution that also installs a top-level ``llm``; install teamtr
in its own virtual environment (``make test`` / ``make demo`` create one in ``.venv``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llm.common.config import RunConfig, load_config
    from llm.export.export_folder import save_team
    from llm.export.trained_team import TrainedTeam, load_team
    from llm.problems.task import (
        Dialogue,
        RewardError,
        Roles,
        Task,
        TaskError,
        final_answer_reward,
    )
    from llm.problems.tasks import Problem
    from llm.training.builder import TeamParts, build_team
    from llm.training.task_check import TaskCheck, check_task

_PUBLIC = {
    "build_team": "llm.training.builder",
    "TeamParts": "llm.training.builder",
    "RunConfig": "llm.common.config",
    "load_config": "llm.common.config",
    "Task": "llm.problems.task",
    "Dialogue": "llm.problems.task",
    "Roles": "llm.problems.task",
    "RewardError": "llm.problems.task",
    "TaskError": "llm.problems.task",
    "final_answer_reward": "llm.problems.task",
    "Problem": "llm.problems.tasks",
    "check_task": "llm.training.task_check",
    "TaskCheck": "llm.training.task_check",
    "load_team": "llm.export.trained_team",
    "TrainedTeam": "llm.export.trained_team",
    "save_team": "llm.export.export_folder",
}
__all__ = [
    "Dialogue",
    "Problem",
    "RewardError",
    "Roles",
    "RunConfig",
    "Task",
    "TaskCheck",
    "TaskError",
    "TeamParts",
    "TrainedTeam",
    "build_team",
    "check_task",
    "final_answer_reward",
    "load_config",
    "load_team",
    "save_team",
]


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'llm' has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)
