"""Every rule a setting of one section must follow, each written once, and the one function
that applies them (``check_section``, called by every settings class when it is built, from a
file or from Python alike).

A rule names the key its error points at: ``SettingError`` (``teamtr.config``) carries it, so
the config loader (``llm.common.config``) gives the file, line and key without reading the
message. Three kinds, from narrow to wide:

- ``KEY_RULES``: the range of one key (its type is its annotation, which the loader coerces
  and ``check_section`` holds a ``Literal`` to);
- ``SECTION_RULES``: keys of one section that must agree (``signal_groups`` at most
  ``prompts_per_batch``);
- rules across sections live beside the whole config
  (``llm.common.config.across_sections.CROSS_SECTION_RULES``).

This module imports neither torch nor the settings it checks (they import it).
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import math
import re
import typing
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from llm.common.trackers import TRACKERS
from teamtr.config import SettingError

__all__ = ["SettingError", "check_section"]

MAX_AGENTS = 64
"""Most agents (and private-notes holders) a team may have: each agent is an adapter (or a
model) in memory and a turn in every dialogue; far more only exhausts the memory."""
MAX_SEED = 2**31 - 1
"""Seeds lie in [0, 2**31): numpy's global seed takes [0, 2**32), and agent k's model of a
heterogeneous team is seeded with seed + k (the same range as ``--seed``)."""
MAX_POSITIONS = 2**20
"""No supported model has more positions: a dialogue of ``turns`` messages of at most
``max_new_tokens`` each must fit below this before any model is loaded (the model's own
context window is checked once it is)."""
MAX_INTEGER = 2**31 - 1
"""The ceiling of every integer key without a tighter one of its own."""
MAX_THREADS = 1024
MAX_LORA_RANK = 4096
MAX_BUILTIN_TEST_SET = 1000
"""Most distinct held-out questions drawn from the built-in tasks: difficulty 1 has 2 x 100
x 100 questions, a fifth of them held out, and a request near that count draws for minutes
before it fails."""

DEVICE_PATTERN = re.compile(r"auto|cpu|cuda|cuda:\d+|mps")
DEVICE_CHOICES = '"auto", "cpu", "cuda", "cuda:N" or "mps"'
RUN_NAME = re.compile(r"[A-Za-z0-9._+-]+")
FUNCTION_SPEC = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
READY_MADE_REWARDS = (
    "exact_match",
    "contains_answer",
    "math_verify",
    "format_regex",
    "length_penalty",
)
"""The rewards of ``llm.rewards`` a config names without a module (``[task] reward =
"exact_match"``); ``llm.rewards.REWARDS`` holds the functions, and a test holds the two equal."""
"""``module:function``, how a config names a factory, reward or metric."""


@dataclass(frozen=True)
class Rule:
    """The range one key must lie in, and how to say so."""

    admits: Callable[[Any], bool]
    expected: str


def _why(why: str) -> str:
    return f" ({why})" if why else ""


def at_least(lowest: int, why: str = "") -> Rule:
    return Rule(lambda v: v >= lowest, f"must be >= {lowest}{_why(why)}")


def positive(why: str = "") -> Rule:
    return Rule(lambda v: v > 0, f"must be > 0{_why(why)}")


def between(lowest: int, highest: int, why: str = "") -> Rule:
    return Rule(
        lambda v: lowest <= v <= highest, f"must be >= {lowest} and <= {highest}{_why(why)}"
    )


def open_unit_interval(why: str = "") -> Rule:
    return Rule(lambda v: 0 < v < 1, f"must lie in (0, 1){_why(why)}")


def seed() -> Rule:
    return between(0, MAX_SEED, "a seed")


def function_name(what: str) -> Rule:
    return Rule(
        lambda v: not v or FUNCTION_SPEC.fullmatch(v) is not None,
        f'must be "module:function" ({what}) or empty',
    )


def _as_tuple(value: str | tuple[str, ...]) -> tuple[str, ...]:
    return value if isinstance(value, tuple) else (value,)


def reward_names(task: Any) -> tuple[str, ...]:
    """The rewards ``[task] reward`` names, one or a list ("" = none: the task's own)."""
    return tuple(name for name in _as_tuple(task.reward) if name)


def _is_reward_name(name: str) -> bool:
    return name in READY_MADE_REWARDS or FUNCTION_SPEC.fullmatch(name) is not None


def _reward_meant(value: str | tuple[str, ...]) -> str:
    """``"; did you mean 'exact_match'?"`` for a misspelt ready-made reward, else ""."""
    for name in _as_tuple(value):
        if name and not _is_reward_name(name):
            close = difflib.get_close_matches(name, READY_MADE_REWARDS, n=1)
            if close:
                return f"; did you mean {close[0]!r}?"
    return ""


def _lengths(value: int | tuple[int, ...]) -> tuple[int, ...]:
    return value if isinstance(value, tuple) else (value,)


KEY_RULES: dict[tuple[str, str], Rule] = {
    ("lora", "rank"): between(1, MAX_LORA_RANK, "r, the LoRA rank"),
    ("lora", "alpha"): positive("the LoRA scale alpha / r"),
    ("team", "n_agents"): between(1, MAX_AGENTS, "n, the number of agents"),
    ("task", "difficulty"): Rule(
        lambda v: (
            v in (1, 2, 3)
            if isinstance(v, int)
            else bool(v) and set(v) <= {1, 2, 3} and len(set(v)) == len(v)
        ),
        "must be 1, 2 or 3, or a non-empty list of distinct ones (a mix)",
    ),
    ("task", "eval_size"): at_least(1),
    ("task", "note_max"): at_least(1, "the private numbers are 1..note_max"),
    ("task", "note_holders"): between(0, MAX_AGENTS, "0 = one per agent"),
    ("task", "eval_seed"): seed(),
    ("task", "format_reward"): Rule(
        lambda v: 0 <= v <= 1, "must lie in [0, 1] (0 = off; a bonus below a correct answer's 1)"
    ),
    ("task", "factory"): function_name("a function returning an llm.Task"),
    ("task", "reward"): Rule(
        lambda v: v == "" or all(_is_reward_name(name) for name in _as_tuple(v)),
        'must be a reward of llm.rewards ("' + '", "'.join(READY_MADE_REWARDS) + '"), '
        '"module:function" (a function scoring an llm.Dialogue), a list of them, or empty',
    ),
    ("task", "metric"): function_name("a function scoring a held-out llm.Dialogue"),
    ("task", "reward_range"): Rule(
        lambda v: v == () or (len(v) == 2 and all(map(math.isfinite, v)) and v[0] < v[1]),
        "must be [low, high], two finite numbers low < high, or empty (the reward's own)",
    ),
    ("sampler", "prompts_per_batch"): at_least(1),
    ("sampler", "group_size"): at_least(2, "G: GRPO needs a baseline within each group"),
    ("sampler", "held_out_group_size"): at_least(1, "dialogues per held-out problem"),
    ("sampler", "turns"): at_least(1, "H, turns per dialogue"),
    ("sampler", "max_new_tokens"): Rule(
        lambda v: bool(_lengths(v)) and all(1 <= x <= MAX_POSITIONS for x in _lengths(v)),
        f"must be >= 1 and <= {MAX_POSITIONS} (one value, or a list of one per agent; no "
        "supported model has more positions)",
    ),
    ("sampler", "temperature"): positive("the policy is softmax(logits / T)"),
    ("sampler", "a_max"): positive("A_max, the advantage clip"),
    ("sampler", "score_chunk"): at_least(1),
    ("sampler", "seed"): seed(),
    ("sampler", "signal_groups"): at_least(0, "0 = off"),
    ("sampler", "max_draws"): at_least(0, "extra groups a batch may draw"),
    ("sampler", "kept_contexts_mb"): at_least(0, "MiB for kept keys and values; 0 = off"),
    ("sampler", "engine_url"): Rule(
        lambda v: v == "" or re.fullmatch(r"https?://[^\s/]+(:\d+)?/?", v) is not None,
        'must be "http://host:port" (a vLLM server) or empty',
    ),
    ("sampler", "engine_key_variable"): Rule(
        lambda v: v == "" or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v) is not None,
        "must name an environment variable (the key itself never goes in a config) or be empty",
    ),
    ("updater", "learning_rate"): positive(),
    ("updater", "steps"): at_least(1),
    ("updater", "clip_eps"): positive(),
    ("updater", "quantile"): open_unit_interval(),
    ("updater", "shrink"): open_unit_interval("learning-rate factor per backtrack"),
    ("updater", "max_backtracks"): at_least(0),
    ("updater", "ratio_tolerance"): positive(),
    ("updater", "tis_cap"): Rule(lambda v: v >= 1, "must be >= 1 (C of min(pi/mu, C))"),
    ("stage", "stages"): at_least(1),
    ("run", "eval_every"): at_least(0, "0 = never"),
    ("run", "checkpoint_every"): at_least(0, "0 = only the last stage and on interrupt"),
    ("run", "keep_checkpoints"): at_least(0, "0 = keep every checkpoint"),
    ("run", "threads"): between(0, MAX_THREADS, "0 = torch's default"),
    ("run", "seed"): seed(),
    ("run", "time_budget_minutes"): at_least(0, "0 = no budget"),
    ("run", "rollout_shards"): at_least(0, "0 = one per process"),
    ("run", "name"): Rule(
        # One plain path component (no "/", "..", "~"): a run never writes outside output_dir.
        lambda v: not v or (RUN_NAME.fullmatch(v) is not None and v not in (".", "..")),
        "must be a plain directory name (letters, digits, . _ + -)",
    ),
    ("run", "report_to"): Rule(
        lambda v: set(v) <= set(TRACKERS) and len(set(v)) == len(v),
        'must be a list of distinct trackers: "' + '", "'.join(TRACKERS) + '" (or [] for none)',
    ),
    ("run", "device"): Rule(
        lambda v: DEVICE_PATTERN.fullmatch(v) is not None, f"must be {DEVICE_CHOICES}"
    ),
}
"""The range of each key that has one. An integer key not listed here (or listed with a lower
bound only) must also be at most ``MAX_INTEGER``."""


@dataclass(frozen=True)
class SectionRule:
    """Keys of one section that must agree; the error names ``key``."""

    section: str
    key: str
    broken: Callable[[Any], str | None]
    """The settings -> what is wrong (the message after the key), or None."""


def _signal_groups_fit_the_batch(sampler: Any) -> str | None:
    if sampler.signal_groups <= sampler.prompts_per_batch:
        return None
    return (
        f"must lie in 0..prompts_per_batch ({sampler.prompts_per_batch}; 0 = off), "
        f"got {sampler.signal_groups}"
    )


def _a_file_task_names_its_file(task: Any) -> str | None:
    if task.kind in ("jsonl", "dataset") and not task.train_file:
        return f'kind = "{task.kind}" needs train_file'
    return None


def _a_python_task_names_its_factory(task: Any) -> str | None:
    if task.kind == "python" and not task.factory:
        return 'kind = "python" needs factory = "module:function"'
    return None


def _args_only_for_a_factory(task: Any) -> str | None:
    if task.args and task.kind != "python":
        return f'must be empty unless kind = "python", got {task.args!r}'
    return None


def _one_weight_per_reward(task: Any) -> str | None:
    rewards = reward_names(task)
    if task.reward_weights and len(task.reward_weights) != len(rewards):
        return (
            f"needs one weight per reward ({len(rewards)}: {list(rewards)}), got "
            f"{list(task.reward_weights)}"
        )
    return None


def _arguments_name_a_ready_made_reward(task: Any) -> str | None:
    for name, arguments in task.reward_args.items():
        if name not in READY_MADE_REWARDS or name not in _as_tuple(task.reward):
            return (
                f"names the rewards of [task] reward it gives arguments to, from "
                f"{list(READY_MADE_REWARDS)}; got {name!r}"
            )
        if not isinstance(arguments, dict):
            return f"{name} = a table of keyword arguments, got {arguments!r}"
    return None


def _engine_key_needs_the_server_engine(key: str) -> Callable[[Any], str | None]:
    """The rule that ``[sampler] key`` (engine_url, engine_args) is set only with the server."""

    def broken(sampler: Any) -> str | None:
        if sampler.engine != "vllm" and getattr(sampler, key):
            return 'is for engine = "vllm" (the server); engine = "hf" samples in this process'
        return None

    return broken


def _a_key_variable_needs_an_engine_url(sampler: Any) -> str | None:
    if sampler.engine_key_variable and not sampler.engine_url:
        return (
            "names the key of a server at engine_url; a server teamtr starts has a key of its own"
        )
    return None


def _plain_http_stays_on_this_machine(sampler: Any) -> str | None:
    parts = urllib.parse.urlsplit(sampler.engine_url)
    if parts.scheme != "http" or sampler.engine_trusted_network or _loopback(parts.hostname):
        return None
    return (
        f"is plain HTTP to {parts.hostname}, another machine: the key and every prompt would "
        "cross the network in clear; use https:// (a TLS proxy in front of vLLM), or set "
        "engine_trusted_network = true where the network between is private"
    )


def _loopback(host: str | None) -> bool:
    """Whether ``host`` is this machine: ``localhost`` or a loopback address."""
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it may resolve anywhere
        return False


def _an_environment_task_names_its_environment(task: Any) -> str | None:
    if task.kind == "environment" and not task.environment:
        return (
            'kind = "environment" plays an environment\'s games: name it ("calculator", '
            '"textarena:<game id>" or "module:function")'
        )
    return None


def _a_reasoning_gym_task_names_its_datasets(task: Any) -> str | None:
    if task.kind == "reasoning_gym" and not task.datasets:
        return 'kind = "reasoning_gym" needs datasets = [<reasoning-gym dataset names>]'
    if task.datasets and task.kind != "reasoning_gym":
        return f'are for kind = "reasoning_gym", got kind = {task.kind!r}'
    if not task.partial_credit and task.kind != "reasoning_gym":
        return (
            f'partial_credit = false is for kind = "reasoning_gym" (its verifiers\' partial '
            f"credit), got kind = {task.kind!r}"
        )
    if len(set(task.datasets)) < len(task.datasets):
        return (
            f"must name each dataset once (dataset_weights weighs one), got {list(task.datasets)}"
        )
    return None


def _one_weight_per_dataset(task: Any) -> str | None:
    if task.dataset_weights and len(task.dataset_weights) != len(task.datasets):
        return (
            f"needs one weight per dataset ({len(task.datasets)}: {list(task.datasets)}), got "
            f"{list(task.dataset_weights)}"
        )
    if any(not (math.isfinite(w) and w > 0) for w in task.dataset_weights):
        return f"must be finite and > 0, got {list(task.dataset_weights)}"
    return None


def _dataset_options_are_tables(task: Any) -> str | None:
    for name, options in task.dataset_args.items():
        if not isinstance(options, dict):
            return f"{name} = a table of the dataset's options, got {options!r}"
    return None


def _environment_args_need_an_environment(task: Any) -> str | None:
    if task.environment_args and not task.environment:
        return "are the keyword arguments of [task] environment, which is not set"
    return None


SECTION_RULES: tuple[SectionRule, ...] = (
    SectionRule("sampler", "signal_groups", _signal_groups_fit_the_batch),
    SectionRule("sampler", "engine_key_variable", _a_key_variable_needs_an_engine_url),
    SectionRule("sampler", "engine_url", _engine_key_needs_the_server_engine("engine_url")),
    SectionRule("sampler", "engine_url", _plain_http_stays_on_this_machine),
    SectionRule("sampler", "engine_args", _engine_key_needs_the_server_engine("engine_args")),
    SectionRule("task", "train_file", _a_file_task_names_its_file),
    SectionRule("task", "factory", _a_python_task_names_its_factory),
    SectionRule("task", "args", _args_only_for_a_factory),
    SectionRule("task", "reward_weights", _one_weight_per_reward),
    SectionRule("task", "reward_args", _arguments_name_a_ready_made_reward),
    SectionRule("task", "environment", _an_environment_task_names_its_environment),
    SectionRule("task", "environment_args", _environment_args_need_an_environment),
    SectionRule("task", "datasets", _a_reasoning_gym_task_names_its_datasets),
    SectionRule("task", "dataset_weights", _one_weight_per_dataset),
    SectionRule("task", "dataset_args", _dataset_options_are_tables),
)


def largest_integer(value: Any) -> int | None:
    """The largest integer in ``value`` (an integer or a tuple of them), if it holds any."""
    items = value if isinstance(value, tuple) else (value,)
    numbers = [v for v in items if isinstance(v, int) and not isinstance(v, bool)]
    return max(numbers) if numbers else None


_LITERALS: dict[type, dict[str, tuple[Any, ...]]] = {}


def _literal_choices(cls: type) -> dict[str, tuple[Any, ...]]:
    """The fields of ``cls`` annotated with a plain ``Literal`` and their choices (once per
    class)."""
    if cls not in _LITERALS:
        hints = typing.get_type_hints(cls)
        _LITERALS[cls] = {
            f.name: typing.get_args(hints[f.name])
            for f in dataclasses.fields(cls)
            if typing.get_origin(hints[f.name]) is Literal
        }
    return _LITERALS[cls]


def check_section(settings: Any, section: str) -> None:
    """Raise ``SettingError`` (with ``section`` and the key) for the first rule ``settings``
    (a frozen dataclass of that section) breaks: a ``Literal`` outside its choices, a key
    outside its range (``KEY_RULES``, ``MAX_INTEGER``), keys that disagree (``SECTION_RULES``)."""
    for key, choices in _literal_choices(type(settings)).items():
        value = getattr(settings, key)
        if value not in choices:
            raise SettingError(key, f"must be one of {list(choices)}, got {value!r}", section)
    for field in dataclasses.fields(settings):
        value = getattr(settings, field.name)
        rule = KEY_RULES.get((section, field.name))
        if rule is not None and not rule.admits(value):
            hint = _reward_meant(value) if (section, field.name) == ("task", "reward") else ""
            raise SettingError(field.name, f"{rule.expected}, got {value!r}{hint}", section)
        largest = largest_integer(value)
        if largest is not None and largest > MAX_INTEGER:
            raise SettingError(field.name, f"must be <= {MAX_INTEGER}, got {value!r}", section)
    for section_rule in SECTION_RULES:
        if section_rule.section == section:
            wrong = section_rule.broken(settings)
            if wrong is not None:
                raise SettingError(section_rule.key, wrong, section)
