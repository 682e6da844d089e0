"""Every config rule is written once (``llm.common.rules``, ``CROSS_SECTION_RULES``) and its
error carries the key: each rule is broken here, once from a file (the message names the file,
the line and the key) and, for the rules of one section, once from Python (the same key and
message, by the same rule)."""

from __future__ import annotations

import inspect
import typing

import pytest
from llm_test_support import teamtr

import llm.common.config.across_sections as across_sections
from llm.common.config import CROSS_SECTION_RULES, ConfigError, RunConfig, load_config
from llm.common.rules import KEY_RULES, SECTION_RULES, SettingError

SECTIONS = typing.get_type_hints(RunConfig)

BAD_VALUES: dict[tuple[str, str], str] = {
    ("lora", "rank"): "0",
    ("lora", "alpha"): "0.0",
    ("team", "n_agents"): "0",
    ("task", "difficulty"): "4",
    ("task", "eval_size"): "0",
    ("task", "note_max"): "0",
    ("task", "note_holders"): "65",
    ("task", "eval_seed"): "-1",
    ("task", "format_reward"): "2.0",
    ("task", "factory"): '"no_colon"',
    ("task", "reward"): '"rewards.score"',
    ("task", "metric"): '"a:b:c"',
    ("task", "reward_range"): "[1.0, 0.0]",
    ("sampler", "prompts_per_batch"): "0",
    ("sampler", "group_size"): "1",
    ("sampler", "held_out_group_size"): "0",
    ("sampler", "turns"): "0",
    ("sampler", "max_new_tokens"): "0",
    ("sampler", "temperature"): "0.0",
    ("sampler", "a_max"): "0.0",
    ("sampler", "score_chunk"): "0",
    ("sampler", "seed"): "-1",
    ("sampler", "signal_groups"): "-1",
    ("sampler", "max_draws"): "-1",
    ("sampler", "kept_contexts_mb"): "-1",
    ("sampler", "engine_url"): '"localhost:8000"',
    ("sampler", "engine_key_variable"): '"not a name"',
    ("updater", "learning_rate"): "0.0",
    ("updater", "steps"): "0",
    ("updater", "clip_eps"): "0.0",
    ("updater", "quantile"): "1.0",
    ("updater", "shrink"): "1.0",
    ("updater", "max_backtracks"): "-1",
    ("updater", "ratio_tolerance"): "0.0",
    ("updater", "tis_cap"): "0.5",
    ("stage", "stages"): "0",
    ("run", "eval_every"): "-1",
    ("run", "checkpoint_every"): "-1",
    ("run", "keep_checkpoints"): "-1",
    ("run", "threads"): "2000",
    ("run", "seed"): "-1",
    ("run", "time_budget_minutes"): "-1.0",
    ("run", "rollout_shards"): "-1",
    ("run", "name"): '"a/b"',
    ("run", "device"): '"tpu"',
    ("run", "report_to"): '["tensorboard", "wandb"]',
}

SECTION_BREAKS: dict[tuple[str, str], str] = {
    ("sampler", "signal_groups"): "[sampler]\nsignal_groups = 5\n",
    ("sampler", "engine_url"): '[sampler]\nengine_url = "http://127.0.0.1:8000"\n',
    ("sampler", "engine_key_variable"): '[sampler]\nengine = "vllm"\nengine_key_variable = "KEY"\n',
    ("sampler", "engine_args"): "[sampler]\nengine_args = { max_model_len = 512 }\n",
    ("task", "train_file"): '[task]\nkind = "jsonl"\n',
    ("task", "factory"): '[task]\nkind = "python"\n',
    ("task", "args"): "[task]\neval_size = 5\n[task.args]\nn = 1\n",
    ("task", "reward_weights"): '[task]\nreward = ["exact_match"]\nreward_weights = [1.0, 2.0]\n',
    ("task", "reward_args"): '[task]\nreward = "exact_match"\n[task.reward_args.nonesuch]\nx = 1\n',
    ("task", "environment"): '[task]\nkind = "environment"\n',
    ("task", "environment_args"): "[task]\neval_size = 5\n[task.environment_args]\nn = 1\n",
    ("task", "datasets"): '[task]\nkind = "reasoning_gym"\n',
    ("task", "dataset_weights"): (
        '[task]\nkind = "reasoning_gym"\ndatasets = ["leg_counting"]\ndataset_weights = [1, 2]\n'
    ),
    ("task", "dataset_args"): (
        '[task]\nkind = "reasoning_gym"\ndatasets = ["a"]\ndataset_args = {a = 1}\n'
    ),
}

CROSS_BREAKS: dict[str, tuple[str, str, str]] = {
    "one_model_source_per_agent": ('[model]\nsources = ["tiny"]\n', "model", "sources"),
    "one_role_prompt_per_agent": (
        '[team]\nn_agents = 3\nrole_prompts = ["a", "b"]\n[sampler]\nturns = 3\nmax_new_tokens = 8\n',
        "team",
        "role_prompts",
    ),
    "note_holders_cover_the_team": (
        "[team]\nn_agents = 3\nrole_prompts = []\n[sampler]\nturns = 3\nmax_new_tokens = 8\n"
        '[task]\nkind = "private_notes"\nnote_holders = 2\n',
        "task",
        "note_holders",
    ),
    "speaking_order_names_agents": (
        '[team]\nrouter = "handoff"\nspeaking_order = [0, 1]\n',
        "team",
        "speaking_order",
    ),
    "one_message_length_per_agent": (
        "[sampler]\nmax_new_tokens = [8, 8, 8]\n",
        "sampler",
        "max_new_tokens",
    ),
    "a_shared_adapter_has_one_base_model": (
        '[model]\nsources = ["tiny", "tiny"]\n[team]\nshared_adapter = true\n',
        "team",
        "shared_adapter",
    ),
    "spread_placement_has_models_to_spread": ('[run]\nplacement = "spread"\n', "run", "placement"),
    "dynamic_sampling_is_not_sharded": (
        "[sampler]\nsignal_groups = 1\n[run]\nrollout_shards = 2\n",
        "sampler",
        "signal_groups",
    ),
    "shards_are_whole_groups": ("[run]\nrollout_shards = 3\n", "run", "rollout_shards"),
    "every_agent_speaks": ("[sampler]\nturns = 1\n", "sampler", "turns"),
    "dialogues_fit_a_model": (
        "[sampler]\nmax_new_tokens = 1000000\n",
        "sampler",
        "max_new_tokens",
    ),
    "builtin_test_set_fits": ("[task]\neval_size = 1001\n", "task", "eval_size"),
    "one_radius_per_adapter": ("[stage]\nradius = [0.1, 0.1, 0.1]\n", "stage", "radius"),
    "update_order_names_adapters": ("[stage]\norder = [0, 3]\n", "stage", "order"),
    "penalty_form_is_measured": ('[stage]\npenalty_form = "tv"\n', "stage", "penalty_form"),
    "a_measured_reward_has_a_range": (
        '[task]\nreward = "my_reward:score"\n[stage]\ncertificate_groups = 4\n',
        "task",
        "reward_range",
    ),
}


def load_error(tmp_path, text: str) -> str:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    return str(caught.value)


def test_every_rule_is_broken_by_a_test_below():
    assert set(BAD_VALUES) == set(KEY_RULES)
    assert set(SECTION_BREAKS) == {(r.section, r.key) for r in SECTION_RULES}
    assert set(CROSS_BREAKS) == {rule.__name__ for rule in CROSS_SECTION_RULES}


def test_a_settings_class_checks_itself_through_the_rules_alone():
    """No settings class writes a rule of its own: each ``__post_init__`` hands itself to
    ``check_section`` (StageSettings first to the core's ``StageConfig``, whose rules are the
    core's), so a rule exists once for files and for Python alike."""
    for section, cls in SECTIONS.items():
        source = inspect.getsource(cls.__post_init__)
        assert f'check_section(self, "{section}")' in source, section
        assert "raise" not in source, section


@pytest.mark.parametrize(("section", "key"), sorted(KEY_RULES))
def test_a_value_out_of_range_names_file_line_and_key(tmp_path, section, key):
    written = BAD_VALUES[(section, key)]
    message = load_error(tmp_path, f"[{section}]\n{key} = {written}\n")
    assert message.startswith(f"{tmp_path / 'c.toml'}:2: [{section}] {key}: "), message
    assert KEY_RULES[(section, key)].expected in message


@pytest.mark.parametrize(("section", "key"), sorted(KEY_RULES))
def test_the_same_rule_holds_a_setting_built_in_python(section, key):
    import tomllib

    value = tomllib.loads(f"v = {BAD_VALUES[(section, key)]}")["v"]
    with pytest.raises(SettingError) as caught:
        SECTIONS[section](**{key: value})
    assert (caught.value.section, caught.value.key) == (section, key)
    assert caught.value.message.startswith(KEY_RULES[(section, key)].expected)


@pytest.mark.parametrize(("section", "key"), sorted(SECTION_BREAKS))
def test_keys_of_one_section_that_disagree_name_the_key(tmp_path, section, key):
    message = load_error(tmp_path, SECTION_BREAKS[(section, key)])
    assert f"[{section}] {key}: " in message, message


@pytest.mark.parametrize("name", sorted(CROSS_BREAKS))
def test_a_rule_across_sections_names_its_key_and_line(tmp_path, monkeypatch, name):
    text, section, key = CROSS_BREAKS[name]
    message = load_error(tmp_path, text)
    lines = text.splitlines()
    header = lines.index(f"[{section}]") if f"[{section}]" in lines else None
    written = [i for i, line in enumerate(lines, 1) if line.startswith(f"{key} =")]
    if header is not None and written:
        assert f"c.toml:{written[-1]}: [{section}] {key}: " in message, message
    else:  # a default value: no line to name
        assert f"c.toml: [{section}] {key}: " in message, message
    # This rule and no other refuses the file: without it the file loads.
    others = tuple(r for r in CROSS_SECTION_RULES if r.__name__ != name)
    monkeypatch.setattr(across_sections, "CROSS_SECTION_RULES", others)
    load_config(tmp_path / "c.toml")


@pytest.mark.parametrize(
    ("url", "trusted", "refused"),
    [
        ("http://192.0.2.7:8000", False, True),
        ("http://inference-node:8000", False, True),  # a name may resolve anywhere
        ("http://192.0.2.7:8000", True, False),
        ("https://192.0.2.7:8000", False, False),
        ("http://127.0.0.1:8000", False, False),
        ("http://127.3.2.1:8000", False, False),
        ("http://localhost:8000", False, False),
        ("http://[::1]:8000", False, False),
    ],
)
def test_plain_http_to_another_machine_needs_a_trusted_network(tmp_path, url, trusted, refused):
    """The key and every prompt go to ``engine_url`` in clear over plain HTTP: only this
    machine, or a network the config says is trusted, may carry them."""
    text = f'[sampler]\nengine = "vllm"\nengine_url = "{url}"\n'
    text += f"engine_trusted_network = {str(trusted).lower()}\n"
    (tmp_path / "c.toml").write_text(text)
    if not refused:
        assert load_config(tmp_path / "c.toml").sampler.engine_url == url
        return
    message = load_error(tmp_path, text)
    assert "[sampler] engine_url: is plain HTTP to" in message, message
    assert "engine_trusted_network = true" in message


def test_plain_http_to_another_machine_is_one_error_line_and_exit_2(tmp_path):
    done = teamtr(
        "train",
        "--config",
        "smoke",
        "--output-dir",
        str(tmp_path),
        "--set",
        "sampler.engine=vllm",
        "--set",
        "sampler.engine_url=http://192.0.2.7:8000",
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr
    assert "plain HTTP to 192.0.2.7" in errors[0]
    assert not any(tmp_path.iterdir())
