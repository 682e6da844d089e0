"""Assembly: the parts of a language-model run, built from a ``RunConfig``, in one place.

``build(config)`` assembles, in this order (data first: it is cheap, and a bad line must not
cost a model load):

1. the problems (``problem_sources``): how training problems are drawn, the held-out set, and
   the training problems known in advance; every data line is read and checked;
2. the process: CPU threads (``[run] threads``) and the global seeds (``seed_everything``);
3. the models (``build_backbone``): device and dtype (``placement_of``), the tokenizer and the
   base model (or one base model per agent, spread over the GPUs with ``[run] placement``), and
   the LoRA backbone of the team;
4. the chat format of the team's dialogues;
5. the router, the initial team, the sampler, the check that the longest dialogue of the
   problems fits the context its engine serves (``require_dialogues_fit``), the engine's start
   (a server engine's server) and the trust-region updater (sharded over a ``Collective`` in a
   data-parallel run, ``llm.training.distributed``).

It returns them as ``Components``. The command line (``teamtr train``, ``eval``, ``swap``),
the run driver (``llm.training.train``), the benchmarks and the studies all build through here, and so
does the public ``llm.build_team``, which returns the four parts ``teamtr.run_stage`` takes.
The same call trains a tabular team and a language-model team::

    team, sampler, updater, penalty = llm.build_team(source="tiny", n_agents=2)
    report, team = teamtr.run_stage(team, sampler, updater, teamtr.StageConfig(), penalty)

Settings come from a ``RunConfig``, a TOML file (``configs/reference.toml`` documents every key),
or keyword arguments named after the config's keys (``source``, ``n_agents``, ``group_size``,
``max_new_tokens``, ...), which override the file's or the defaults' values.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from llm.common.collective import Collective
from llm.common.config import (
    ConfigError,
    Locator,
    RunConfig,
    builtin_test_set_fits,
    check_consistent,
    load_config,
)
from llm.common.devices import DeviceNotAvailableError, Placement, agent_devices, resolve_placement
from llm.common.progress import library_bars, on_terminal
from llm.common.rules import SettingError
from llm.conversation.dialogue import ChatFormat
from llm.conversation.router import make_router
from llm.models.agents import Backbone, LoraBackbone, LoraTeam, SeparateBackbone
from llm.models.loading import (
    ModelNotAvailableError,
    load_model,
    load_tokenizer,
    require_shared_tokenizer,
)
from llm.problems.configured import build_task
from llm.problems.task import Task, TaskError
from llm.problems.tasks import Problem
from llm.sampling.sampler import DialogueSampler
from llm.training.distributed import ShardedSampler, check_world, effective_shards
from llm.training.preflight import require_context_fits
from llm.update.updater import TrustRegionUpdater
from teamtr.penalty import EpisodicPenalty


@dataclass
class Components:
    """Everything a run needs, built once from a config."""

    config: RunConfig
    chat: ChatFormat
    team: LoraTeam
    sampler: DialogueSampler
    updater: TrustRegionUpdater
    test_problems: list[Problem]
    positions: int
    """The context window every dialogue must fit: the positions of the shortest base model of
    the team, or fewer where the engine serves fewer (``Engine.context_limit``)."""
    collective: Collective | None = None
    """Set when the rollouts are sharded (``llm.training.distributed``): data parallelism, or a single
    process with ``[run] rollout_shards`` > 1."""

    @property
    def writes_files(self) -> bool:
        """Whether this process writes the run's files (rank 0 of a data-parallel run)."""
        return self.collective is None or self.collective.is_main


def configured_task(config: RunConfig) -> Task:
    """The run's task (``llm.problems.configured``: a built-in one, a data file, or one's own
    code); every data line is read and checked, every module imported."""
    task = config.task
    try:  # a config built in Python has not been through the loader's checks
        builtin_test_set_fits(config)
    except SettingError as error:
        raise ConfigError(f"[{error.section}] {error.key}: {error.message}") from None
    try:
        return build_task(task, config.team.n_agents)
    except (ConfigError, TaskError):
        raise
    except ValueError as error:
        if task.kind not in ("arithmetic", "private_notes"):
            raise
        # Few distinct problems exist when note_max ** n_agents is small.
        raise ConfigError(
            f"[task] eval_size: {task.eval_size} distinct held-out problems cannot be drawn "
            f"for this task ({task.kind}): {error}; lower eval_size or raise [task] note_max"
        ) from None


def problem_sources(config: RunConfig):
    """How training problems are drawn, the held-out problems, and the training problems
    known in advance (a file's; none for the procedural tasks, whose questions are as short
    as their held-out ones): the run's task (``configured_task``) taken apart."""
    task = configured_task(config)
    return task.draw, list(task.test), list(task.known_train)


def role_settings(task: Task) -> dict[str, Any]:
    """The config keys a task's roles set (``Task.roles``: system prompt, role prompts,
    message lengths), as ``configured`` takes them."""
    roles = task.roles
    if roles is None:
        return {}
    settings: dict[str, Any] = {}
    if roles.system_prompt is not None:
        settings["system_prompt"] = roles.system_prompt
    if roles.role_prompts is not None:
        settings["role_prompts"] = tuple(roles.role_prompts)
    if roles.max_new_tokens is not None:
        tokens = roles.max_new_tokens
        settings["max_new_tokens"] = tokens if isinstance(tokens, int) else tuple(tokens)
    return settings


def with_roles(config: RunConfig, task: Task) -> RunConfig:
    """``config`` with the roles the task is written for in place of ``[team]``'s and
    ``[sampler]``'s, checked again."""
    settings = role_settings(task)
    return configured(config, settings, f"the roles of task {task.name!r}") if settings else config


def seed_everything(seed: int) -> None:
    """Seed the global generators, so that a rebuilt run starts from the same state."""
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 (library code may draw from the global generator)
    torch.manual_seed(seed)


def load_base_model(source: str, seed: int = 0, placement: Placement | None = None):
    """Tokenizer and base model; any failure to read the files is a ModelNotAvailableError."""
    where = placement or Placement(torch.device("cpu"), torch.float32)
    try:
        tokenizer = load_tokenizer(source)
        model = load_model(
            source, vocab_size=len(tokenizer), seed=seed, dtype=where.dtype, device=where.device
        )
        return tokenizer, model
    except ModelNotAvailableError:
        raise
    except Exception as error:  # transformers/gguf/safetensors raise many types on bad files
        raise ModelNotAvailableError(
            f"model source {source!r}: cannot be loaded ({type(error).__name__}: {error}); "
            "expected a Hugging Face model directory, a .gguf file, or 'tiny'/'smollm2'"
        ) from None


def placement_of(config: RunConfig, source: str = "") -> Placement:
    """The run's device and dtype; an absent device is a ConfigError naming ``[run] device``
    (and ``source``, the config file, when given)."""
    try:
        return resolve_placement(config.run.device, config.run.dtype)
    except DeviceNotAvailableError as error:
        raise ConfigError(f"{source + ': ' if source else ''}[run] device: {error}") from None


def build_backbone(config: RunConfig, progress: bool = True):
    """The tokenizer, the team's backbone (LoRA slots on one base model, or, when ``[model]
    sources`` lists one source per agent, one base model per agent) and the number of
    positions every base model has."""
    seed = config.run.seed
    placement = placement_of(config)
    with library_bars(progress and on_terminal()):  # no carriage-return frames in a log
        if not config.model.sources:
            loaded = [load_base_model(config.model.source, seed, placement)]
        else:
            # Agent k's model gets seed + k so that random ("tiny") members of a team differ.
            sources = config.model.sources
            devices = agent_devices(placement, len(sources), config.run.placement == "spread")
            loaded = [
                load_base_model(source, seed + k, replace(placement, device=devices[k]))
                for k, source in enumerate(sources)
            ]
    positions = min(getattr(m.config, "max_position_embeddings", 2**62) for _, m in loaded)
    if not config.model.sources:
        tokenizer, base = loaded[0]
        backbone: Backbone = LoraBackbone.create(
            base, config.team.n_policies, config.lora, seed=seed
        )
        return tokenizer, backbone, positions
    tokenizers = [tokenizer for tokenizer, _ in loaded]
    require_shared_tokenizer(list(config.model.sources), tokenizers)
    backbone = SeparateBackbone.create([model for _, model in loaded], config.lora, seed=seed)
    return tokenizers[0], backbone, positions


def require_dialogues_fit(
    chat: ChatFormat,
    positions: int,
    problems: Sequence[Problem],
    config: RunConfig,
    where: str,
    model_positions: int | None = None,
) -> None:
    """Exit 2 unless the longest dialogue of ``problems`` fits ``positions``: the context the
    run's engine serves, which is ``model_positions`` (the model's) or fewer."""
    overhead = max(len(h) for h in chat.headers) + 1 + len(chat.closing)  # header, stop, closing
    if model_positions is not None and positions < model_positions:
        where = (
            f'{where} (engine = "{config.sampler.engine}" serves contexts of {positions} '
            f"tokens; the model has {model_positions} positions)"
        )
    require_context_fits(
        positions,
        (len(chat.encode_prompt(q)) for q in {p.question for p in problems}),
        overhead,
        config.sampler.turns,
        config.sampler.longest_message,
        where,
    )


def build(
    config: RunConfig,
    collective: Collective | None = None,
    progress: bool = True,
    task: Task | None = None,
) -> Components:
    """A run's components: data first (cheap, and a bad line must not cost a model load), then
    the models; ``collective``: this process's rank in a data-parallel run; ``task``: the task
    to train on, in place of the one ``[task]`` names."""
    task = task or configured_task(config)
    config = with_roles(config, task)
    test, train_problems = list(task.test), list(task.known_train)
    if config.run.threads:
        torch.set_num_threads(config.run.threads)
    seed_everything(config.run.seed)
    tokenizer, backbone, positions = build_backbone(config, progress)
    chat = ChatFormat.from_tokenizer(
        tokenizer,
        config.team.n_agents,
        config.team.system_prompt,
        config.team.role_prompts,
        config.team.policy_of,
    )
    router = make_router(config.team.router, config.team.n_agents, config.team.speaking_order)
    team = backbone.initial_team()
    chunk = config.sampler.score_chunk
    shards = effective_shards(config, collective.world_size if collective else 1)
    where = "[sampler] max_new_tokens"
    if collective is None and shards == 1:
        sampler = DialogueSampler(chat, router, task, config.sampler)
        limit = sampler.engine.context_limit(positions)
        require_dialogues_fit(chat, limit, [*train_problems, *test], config, where, positions)
        sampler.engine.start(team, tokenizer, positions, config.run.threads)
        updater = TrustRegionUpdater(chat, config.updater, score_chunk=chunk)
        return Components(config, chat, team, sampler, updater, test, limit)
    if config.sampler.engine != "hf":  # one server per run, not yet one per process
        raise ConfigError('[sampler] engine = "vllm" needs one process: no rollout_shards')
    require_dialogues_fit(chat, positions, [*train_problems, *test], config, where)
    together = collective or Collective()
    check_world(config, together.world_size)
    sampler = ShardedSampler(chat, router, task, config.sampler, shards=shards, collective=together)
    updater = TrustRegionUpdater(chat, config.updater, score_chunk=chunk, collective=together)
    return Components(config, chat, team, sampler, updater, test, positions, together)


# -- llm.build_team: the four parts of teamtr.run_stage -------------------------------------
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


def configured(config: RunConfig, settings: dict[str, Any], where: str = "build_team") -> RunConfig:
    """``config`` with each keyword replaced in the one section that has that key.

    The keywords of one section are applied together (``n_agents=3, role_prompts=()`` is one
    consistent change), then the whole config is checked as a loaded file would be; errors
    begin with ``where``."""
    sections = {name: getattr(config, name) for name in SECTIONS}
    changes: dict[str, dict[str, Any]] = {}
    for key, value in settings.items():
        owners = [name for name, section in sections.items() if key in _fields(section)]
        if len(owners) != 1:
            owners_text = "no config section" if not owners else f"sections {owners}"
            raise ConfigError(
                f"{where}: {key!r} names {owners_text}; use a key of {list(SECTIONS)}"
            )
        changes.setdefault(owners[0], {})[key] = value
    for name, values in changes.items():
        try:
            sections[name] = dataclasses.replace(sections[name], **values)
        except (TypeError, ValueError) as error:
            written = ", ".join(f"{key} = {value!r}" for key, value in values.items())
            raise ConfigError(f"{where}: [{name}] {written}: {error}") from None
    result = dataclasses.replace(config, **sections)
    check_consistent(result, Locator(where))
    return result


def configured_for_task(
    config: RunConfig, settings: dict[str, Any], task: Task | None
) -> RunConfig:
    """``configured``, with the roles of ``task`` (where given) among the settings: a task's
    roles replace the run's (as ``with_roles``), so the two-agent default role prompts and
    message lengths are never checked against a team of another size."""
    return configured(config, {**settings, **(role_settings(task) if task else {})})


def _fields(section: Any) -> set[str]:
    return {field.name for field in dataclasses.fields(section)}


def build_team(
    config: RunConfig | str | Path | None = None, /, *, task: Task | None = None, **settings: Any
) -> TeamParts:
    """Team, sampler, updater and penalty of a language-model team, ready for ``run_stage``.

    ``config``: a ``RunConfig``, the path of a TOML config, or None for the defaults (the real
    SmolLM2-135M-Instruct); ``task``: an ``llm.Task`` of one's own, in place of ``[task]``'s;
    ``settings``: config keys to override, e.g. ``source="tiny"``.
    """
    if config is None:
        config = RunConfig()
    elif not isinstance(config, RunConfig):
        config = load_config(config)
    if task is not None and not isinstance(task, Task):
        raise TaskError(f"build_team: task must be an llm.Task, got {type(task).__name__}")
    parts = build(configured_for_task(config, settings, task), task=task)
    return TeamParts(
        parts.team, parts.sampler, parts.updater, EpisodicPenalty(parts.config.sampler.turns)
    )
