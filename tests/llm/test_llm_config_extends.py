"""``extends``: a config that overrides another key by key, with errors naming the right file."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from llm.common.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[2]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_values_override_section_by_section_and_key_by_key(tmp_path):
    write(
        tmp_path / "base.toml",
        "[stage]\nradius = 0.3\nstages = 7\n[team]\nn_agents = 4\nrole_prompts = []\n[sampler]\nmax_new_tokens = 24\nturns = 4\n",
    )
    child = write(
        tmp_path / "sub" / "child.toml", 'extends = "../base.toml"\n[stage]\nstages = 2\n'
    )
    config = load_config(child)
    assert (config.stage.radius, config.stage.stages, config.team.n_agents) == (0.3, 2, 4)
    grandchild = write(tmp_path / "g.toml", 'extends = "sub/child.toml"\n[team]\nn_agents = 2\n')
    config = load_config(grandchild)
    assert (config.stage.radius, config.stage.stages, config.team.n_agents) == (0.3, 2, 2)


def test_errors_name_the_file_that_holds_the_bad_key(tmp_path):
    write(tmp_path / "base.toml", "[stage]\nradius = -1.0\n")
    child = write(tmp_path / "child.toml", 'extends = "base.toml"\n')
    with pytest.raises(ConfigError, match=r"base\.toml:2: \[stage\] radius"):
        load_config(child)
    write(tmp_path / "good.toml", "[stage]\nradius = 0.1\n")
    typo = write(tmp_path / "typo.toml", 'extends = "good.toml"\n\n[stage]\nradiuz = 1.0\n')
    with pytest.raises(ConfigError, match=r"typo\.toml:4: \[stage\] radiuz"):
        load_config(typo)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('extends = "missing.toml"\n', "no such config file"),
        ("extends = 3\n", "must be a path string"),
        ('extends = "loop.toml"\n', "makes a cycle"),
    ],
)
def test_bad_extends_is_a_config_error(tmp_path, text, message):
    path = write(tmp_path / "loop.toml", text)
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_the_comparison_configs_differ_from_the_default_only_where_they_say():
    default = load_config(REPO / "configs" / "reference.toml")
    for name in ("teamtr", "stale"):
        config = load_config(REPO / "configs" / "compare" / f"{name}.toml")
        assert config.stage.scheme == name
        for section in ("model", "lora", "task", "updater"):
            assert getattr(config, section) == getattr(default, section), (name, section)
        # The three-agent format they were measured with, written out; nothing else differs.
        assert (config.team.n_agents, config.team.role_prompts) == (3, ())
        assert (config.sampler.turns, config.sampler.max_new_tokens) == (3, 24)
        assert (
            dataclasses.replace(
                config.team,
                n_agents=default.team.n_agents,
                role_prompts=default.team.role_prompts,
                system_prompt=default.team.system_prompt,
            )
            == default.team
        )
        assert (
            dataclasses.replace(
                config.sampler,
                turns=default.sampler.turns,
                max_new_tokens=default.sampler.max_new_tokens,
            )
            == default.sampler
        )
