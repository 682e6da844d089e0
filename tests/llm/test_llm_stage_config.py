"""One stage config and one source of defaults.

The ``[stage]`` section is ``teamtr.StageConfig`` itself (validated there, reported with the
file, line and key), and the code's defaults are exactly ``configs/reference.toml``'s.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from llm.common.config import ConfigError, RunConfig, load_config
from teamtr.config import StageConfig

REPO = Path(__file__).resolve().parents[2]
DEFAULT = REPO / "configs" / "reference.toml"


def test_code_defaults_are_exactly_the_reference_toml():
    from_file = load_config(DEFAULT)
    from_code = RunConfig()
    for section in dataclasses.fields(RunConfig):
        assert getattr(from_file, section.name) == getattr(from_code, section.name), section.name
    assert from_file == from_code


def test_every_key_of_the_reference_toml_is_written_out():
    """reference.toml lists every key (so the comparison above compares written values)."""
    import tomllib

    written = tomllib.loads(DEFAULT.read_text())
    for section in dataclasses.fields(RunConfig):
        keys = {f.name for f in dataclasses.fields(getattr(RunConfig(), section.name))}
        keys -= {"system_prompt"} if section.name == "team" else set()  # a long text, commented
        keys -= {"seed"} if section.name == "stage" else set()  # [run] seed
        assert keys <= set(written[section.name]), (section.name, keys - set(written[section.name]))


def test_an_empty_config_file_means_the_default(tmp_path):
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    assert load_config(empty) == load_config(DEFAULT)


def test_the_stage_section_is_a_teamtr_stage_config_seeded_by_the_run(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(
        "[team]\nn_agents = 3\nrole_prompts = []\n[sampler]\nmax_new_tokens = 24\nturns = 3\n[stage]\nradius = [0.1, 0.2, 0.3]\norder = [2, 0, 1]\n"
        'penalty_form = "kl"\n[run]\nseed = 7\n'
    )
    stage = load_config(path).stage
    assert isinstance(stage, StageConfig)
    assert stage.radius == (0.1, 0.2, 0.3) and stage.order == (2, 0, 1)
    assert [stage.radius_of(k, 3) for k in range(3)] == [0.1, 0.2, 0.3]
    assert stage.seed == 7  # the random order draws from [run] seed
    assert dataclasses.replace(RunConfig(), run=load_config(path).run).stage.seed == 7


def test_an_order_may_update_some_agents_only(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(
        "[team]\nn_agents = 3\nrole_prompts = []\n[sampler]\nmax_new_tokens = 24\nturns = 3\n[stage]\norder = [2]\n"
    )
    assert load_config(path).stage.order == (2,)  # agent 2 alone, as teamtr.StageConfig allows


def test_the_old_key_update_order_still_reads(tmp_path):
    path = tmp_path / "old.toml"
    path.write_text('[stage]\nupdate_order = "fixed"\n')
    assert load_config(path).stage.order == "fixed"
    path.write_text('[stage]\nupdate_order = "fixed"\norder = "random"\n')
    with pytest.raises(ConfigError, match="old name of 'order'"):
        load_config(path)


def test_a_run_directory_config_round_trips(tmp_path):
    import json

    config = load_config(REPO / "configs" / "smoke.toml")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config.to_dict()))
    assert load_config(path) == config


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("radius = [0.1, 0.2]", "[stage] radius: needs one entry per adapter (3), got [0.1, 0.2]"),
        ("radius = [0.1, -0.2, 0.1]", "[stage] radius: must be > 0 (δ_i"),
        ("order = [0, 5]", "[stage] order: agents are numbered 0..2, got [0, 5]"),
        ("order = [0, 0, 1]", "[stage] order: must be 'fixed', 'random' or a non-empty tuple"),
        ("order = []", "[stage] order: must be 'fixed', 'random' or a non-empty tuple"),
        ('order = "sorted"', "[stage] order: expected one of ['fixed', 'random']"),
        ("kl_tolerance = 1.5", "[stage] kl_tolerance: must lie in [0, 1)"),
        ('penalty_form = "tv"', '[stage] penalty_form: "tv" needs updates that report'),
        ('penalty_form = "l2"', "[stage] penalty_form: expected one of ['kl', 'tv']"),
        ("seed = 3", "[stage] seed: not a key of its own; it is [run] seed"),
        ("stages = 0", "[stage] stages: must be >= 1, got 0"),
    ],
)
def test_stage_errors_name_file_line_and_key(tmp_path, line, message):
    path = tmp_path / "bad.toml"
    path.write_text(
        f"[team]\nn_agents = 3\nrole_prompts = []\n[sampler]\nmax_new_tokens = 24\nturns = 3\n[stage]\n{line}\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value).startswith(f"{path}:8: [stage] ")
    assert message in str(caught.value)
