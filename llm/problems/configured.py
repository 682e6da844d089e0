"""The task a config's ``[task]`` section names, built before any model loads.

- ``kind = "arithmetic" | "jsonl" | "private_notes"``: the built-in tasks (``llm.problems.builtin``);
- ``kind = "dataset"``: a local JSON, JSONL, CSV or Parquet file read through Hugging Face
  ``datasets`` (``llm.problems.data_files``), its columns mapped by
  ``question_column``, ``answer_column`` and ``notes_columns``; every other column goes into
  ``Problem.metadata``;
- ``kind = "python"``: ``factory = "module:function"`` called with the ``[task.args]`` table as
  keyword arguments, returning a ``Task``;
- ``kind = "reasoning_gym"``: reasoning-gym's generators (``llm.problems.reasoning_gym_task``).

``reward`` (a ready-made reward of ``llm.rewards`` by its name, ``"module:function"``, or a
list of them summed with ``reward_weights``) and ``metric`` (``"module:function"``) replace the
task's own on any kind; a reward that grades answers (``exact_match``) is also the held-out
metric unless one is given. Modules
are looked up in ``[task] directory`` (the config file's folder unless set) first, then on
``sys.path``; data files relative to that folder. Every failure is a ``ConfigError`` or a
``TaskError`` of one line naming the key, the file, the function or the column.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from llm.common.config import ConfigError, TaskSettings
from llm.common.rules import reward_names
from llm.problems.builtin import arithmetic_task, jsonl_task, private_notes_task
from llm.problems.data_files import data_path, read_problems
from llm.problems.environment import EnvironmentFactory
from llm.problems.task import (
    Dialogue,
    Task,
    TaskError,
    environment_return,
    first_line,
    name_of,
    reference_parses,
    reported,
)
from llm.problems.tasks import Problem, TaskDataError
from llm.rewards.named import GRADING, REWARDS, Weighted, reward_named, weighted_range

FUNCTION_NAME = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


def build_task(settings: TaskSettings, n_agents: int = 2) -> Task:
    """The ``Task`` of a ``[task]`` section; ``n_agents``: ``[team] n_agents`` (one private
    number per agent unless ``note_holders`` says otherwise)."""
    if settings.kind == "environment":
        task = environment_games(settings, n_agents)
    elif settings.kind == "reasoning_gym":
        from llm.problems.reasoning_gym_task import reasoning_gym_task

        task = reasoning_gym_task(settings)
    elif settings.kind == "python":
        task = _from_factory(settings)
    elif settings.kind == "dataset":
        task = _from_dataset(settings)
    elif settings.kind == "jsonl":
        task = jsonl_task(settings.train_file, settings.test_file, settings.eval_size)
    elif settings.kind == "private_notes":
        task = private_notes_task(
            settings.note_holders or n_agents,
            settings.note_max,
            settings.phrasing,
            settings.note_answer,
            settings.eval_size,
            settings.eval_seed,
        )
    else:
        task = arithmetic_task(
            settings.difficulty, settings.phrasing, settings.eval_size, settings.eval_seed
        )
    changes: dict[str, Any] = {}
    if names := reward_names(settings):
        changes["reward"], grading = configured_reward(settings)
        changes["reward_range"] = weighted_range(names, settings.reward_weights)
        if grading is not None and not settings.metric:
            changes["metric"] = grading  # the held-out score: is the answer right?
    if settings.metric:
        changes["metric"] = load_function(settings.metric, settings.directory, "[task] metric")
    if settings.reward_range:
        changes["reward_range"] = tuple(settings.reward_range)
    if settings.format_reward:
        from llm.problems.task import FormatBonus

        changes["bonus"] = FormatBonus(settings.format_reward)
    if settings.environment and settings.kind != "environment":
        changes["environment"] = environment_factory(settings, n_agents)
    return dataclasses.replace(task, **changes) if changes else task


# -- environments --------------------------------------------------------------------------------
TEXTARENA = "textarena:"
TEXTARENA_ADAPTER_KEYS = ("players", "acting", "blind", "options")
"""``[task.environment_args]`` keys of the adapter (``TextArenaGame``); every other key is the
game's own."""


def environment_factory(settings: TaskSettings, n_agents: int) -> EnvironmentFactory:
    """The factory ``[task] environment`` names, with ``[task.environment_args]`` bound: the
    built-in "calculator", "textarena:<game id>", or "module:function" (called per dialogue)."""
    spec, args = settings.environment, dict(settings.environment_args)
    if spec == "calculator":
        from llm.problems.calculator import Calculator

        factory: Callable[..., Any] = Calculator
        args.setdefault("n_agents", n_agents)
    elif spec.startswith(TEXTARENA):
        from llm.problems.textarena_games import TextArenaGame, game_options

        factory = TextArenaGame
        game = spec[len(TEXTARENA) :]
        # The adapter's own keys; every other key is the game's (max_number = 10), checked
        # against the game's constructor here rather than at its first reset.
        adapter: dict[str, Any] = {
            key: args.pop(key) for key in TEXTARENA_ADAPTER_KEYS if key in args
        }
        options = {**adapter.pop("options", {}), **args}
        known = game_options(game)
        if known is not None and set(options) - known:
            unknown = sorted(set(options) - known)
            raise ConfigError(
                f"[task] environment_args: TextArena's {game} takes no {unknown}; its options: "
                f"{sorted(known)}, and the adapter's: {', '.join(TEXTARENA_ADAPTER_KEYS)}"
            )
        args = {"game": game, "n_agents": n_agents, "options": options, **adapter}
        if "acting" in args:
            args["acting"] = tuple(args["acting"])
    else:
        factory = load_function(spec, settings.directory, "[task] environment")
    try:
        inspect.signature(factory).bind(**args)
    except TypeError as error:
        raise ConfigError(
            f"[task] environment_args: {spec} takes no such arguments: {error}"
        ) from None
    bound = functools.partial(factory, **args)
    functools.update_wrapper(bound, factory)  # its name, in the messages of a failing call
    return bound


def environment_won(dialogue: Dialogue) -> float:
    """1 when the environment's rewards add up to a won game's (TextArena's reward of a win)."""
    from llm.problems.textarena_games import WIN_REWARD

    return float(environment_return(dialogue) >= WIN_REWARD)


environment_won.grading = True  # type: ignore[attr-defined]


def environment_games(settings: TaskSettings, n_agents: int) -> Task:
    """``kind = "environment"``: one problem per game seed, the environment's rewards the
    reward (TextArena's lie in [-1, 1]), a won game the held-out accuracy. The held-out games
    are seeds ``eval_seed`` .. ``eval_seed + eval_size - 1``; training draws any other seed."""
    from llm.problems.textarena_games import game_problems

    name = settings.environment.removeprefix(TEXTARENA)
    held_out = range(settings.eval_seed, settings.eval_seed + settings.eval_size)

    def draw(rng: np.random.Generator, count: int) -> list[Problem]:
        seeds: list[int] = []
        while len(seeds) < count:
            seed = int(rng.integers(2**31))
            if seed not in held_out:  # disjoint from the held-out games by construction
                seeds.append(seed)
        return game_problems(name, seeds)

    return Task(
        train=draw,
        test=game_problems(name, list(held_out)),
        reward=environment_return,
        metric=environment_won,
        name=name,
        split=lambda question: "test" if int(question.rsplit("#", 1)[-1]) in held_out else "train",
        grading=True,
        reward_range=(-1.0, 1.0),
        environment=environment_factory(settings, n_agents),
    )


# -- rewards -------------------------------------------------------------------------------------


def configured_reward(
    settings: TaskSettings,
) -> tuple[Callable[..., Any], Callable[..., Any] | None]:
    """The reward ``[task] reward`` names (a ready-made one of ``llm.rewards`` by its name, or
    "module:function"; a list is their ``Weighted`` sum with ``reward_weights``), and the
    first of them that grades an answer right or wrong (``llm.rewards.GRADING``), if any."""
    names = reward_names(settings)
    rewards = []
    for name in names:
        if name in REWARDS:
            try:
                rewards.append(reward_named(name, settings.reward_args.get(name)))
            except ValueError as error:
                raise ConfigError(f"[task] reward_args: {error}") from None
        else:
            rewards.append(load_function(name, settings.directory, "[task] reward"))
    grading = next((r for n, r in zip(names, rewards, strict=True) if n in GRADING), None)
    if len(rewards) == 1 and not settings.reward_weights:
        return rewards[0], grading
    weights = settings.reward_weights or (1.0,) * len(rewards)
    return Weighted(tuple(rewards), tuple(weights), names), grading


# -- code ----------------------------------------------------------------------------------------
def load_function(spec: str, directory: str, key: str) -> Callable[..., Any]:
    """The function ``spec`` ("module:function") names, its module found in ``directory``
    first, then on ``sys.path``; a ``ConfigError`` naming ``key`` when it cannot be had."""
    if not FUNCTION_NAME.fullmatch(spec):
        raise ConfigError(f'{key}: expected "module:function", got {spec!r}')
    module_name, function_name = spec.split(":")
    module = _import(module_name, directory, key)
    function = getattr(module, function_name, None)
    if function is None:
        raise ConfigError(
            f"{key}: module {module_name!r} ({getattr(module, '__file__', '?')}) has no "
            f"{function_name!r}"
        )
    if not callable(function):
        raise ConfigError(f"{key}: {spec} is a {type(function).__name__}, not a function")
    return function


def _import(module_name: str, directory: str, key: str) -> ModuleType:
    folder = Path(directory or ".")
    local = folder.joinpath(*module_name.split(".")).with_suffix(".py")
    try:
        if local.is_file():
            # The file next to the config, even when a module of that name was imported from
            # elsewhere before (two examples may both have a my_reward.py).
            # Read afresh every time: a run resumed in the same process after its reward was
            # fixed must not keep the broken one.
            sys.modules.pop(module_name, None)
            importlib.invalidate_caches()  # a file written since the last import is seen
            sys.path.insert(0, str(folder.resolve()))
            try:
                return importlib.import_module(module_name)
            finally:
                sys.path.remove(str(folder.resolve()))
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name != module_name.split(".")[0] and error.name != module_name:
            raise ConfigError(
                f"{key}: module {module_name!r} imports {error.name!r}, which is not installed"
            ) from None
        raise ConfigError(
            f"{key}: no module {module_name!r} (looked for {local} and on sys.path)"
        ) from None
    except ConfigError:
        raise
    except Exception as error:  # the user's module failed while it was imported
        text = first_line(error)
        raise ConfigError(
            f"{key}: importing {module_name!r} raised {type(error).__name__}: {text}"[:400]
        ) from None


def _from_factory(settings: TaskSettings) -> Task:
    factory = load_function(settings.factory, settings.directory, "[task] factory")
    with reported(f"[task] factory: {name_of(factory)}(**{settings.args!r:.80})"):
        task = factory(**settings.args)
    if not isinstance(task, Task):
        raise TaskError(
            f"[task] factory: {name_of(factory)} returned {type(task).__name__}, expected an "
            "llm.Task (train problems, test problems, reward)"
        )
    if settings.eval_size < len(task.test):
        task = dataclasses.replace(task, test=task.test[: settings.eval_size])
    return task


# -- data ----------------------------------------------------------------------------------------
def _from_dataset(settings: TaskSettings) -> Task:
    train = read_problems(settings, settings.train_file, "[task] train_file")
    test = (
        read_problems(settings, settings.test_file, "[task] test_file")
        if settings.test_file
        else []
    )
    if test and settings.eval_size > len(test):
        say_once(
            f"note: [task] eval_size = {settings.eval_size}, but [task] test_file "
            f"{data_path(settings.test_file, settings.directory)} has {len(test)} rows: the "
            f"held-out evaluation uses those {len(test)}"
        )
    test = test[: settings.eval_size]
    names = reward_names(settings)
    if not names or names == ("math_verify",):  # math-verify compares: check every answer
        for where, problems in (("train_file", train), ("test_file", test)):
            for problem in problems:
                if not reference_parses(problem.answer):
                    raise TaskDataError(
                        f"[task] {where}: {problem.origin}: answer {problem.answer!r:.40} is not "
                        "a number or expression math-verify can parse; give [task] reward = "
                        '"exact_match" (or another of llm.rewards, or "module:function") to '
                        "score answers of another kind"
                    )
    return Task(train, test, name=Path(settings.train_file).name)


_SAID: set[str] = set()


def say_once(line: str) -> None:
    """Print ``line`` to stderr once in this process (a task is read by the check and again
    by the run), and only in the process that reports (rank 0 of a data-parallel run)."""
    if line in _SAID or os.environ.get("RANK", "0") != "0":
        return
    _SAID.add(line)
    print(line, file=sys.stderr, flush=True)
