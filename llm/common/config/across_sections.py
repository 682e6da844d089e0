"""The rules across sections: keys of different sections that must agree.

Each rule takes the whole config and raises ``SettingError`` naming the section and key its
message is about; ``check_consistent`` runs them all, in the order of ``CROSS_SECTION_RULES``,
and turns the first broken one into a ``ConfigError`` at that key's line. The rules of one
section live in ``llm.common.rules``.
"""

from __future__ import annotations

from collections.abc import Callable

from llm.common.config.locator import ConfigError, Locator
from llm.common.config.schema import RunConfig
from llm.common.rules import (
    MAX_BUILTIN_TEST_SET,
    MAX_POSITIONS,
    READY_MADE_REWARDS,
    SettingError,
    reward_names,
)
from llm.common.settings import DEFAULT_MESSAGE_TOKENS, DEFAULT_ROLE_PROMPTS

DEFAULT_ROLES_HINT = (
    " (the default roles are the solver and the answerer of a two-agent team: write one role "
    "prompt per agent, or role_prompts = [] for none)"
)


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


def check_consistent(config: RunConfig, locate: Locator) -> None:
    """Every rule across sections (``CROSS_SECTION_RULES``); the first broken one raises
    ``ConfigError`` at its key's line."""
    for rule in CROSS_SECTION_RULES:
        try:
            rule(config)
        except SettingError as error:
            raise ConfigError(f"{locate(error.section, error.key)}: {error.message}") from None
