"""Shipped configs are found by name from any folder; a path that exists always wins; an unknown
name is one line that says where it looked and which names there are."""

from __future__ import annotations

from pathlib import Path

import pytest

from llm.common.config import (
    PACKAGED_CONFIGS,
    ConfigError,
    find_config,
    load_config,
    packaged_config_names,
)
from llm.interface.cli import main

REPO = Path(__file__).resolve().parents[2]


def test_the_clones_configs_folder_is_the_packaged_one():
    assert (REPO / "configs").is_symlink()
    assert (REPO / "configs").resolve() == PACKAGED_CONFIGS == REPO / "llm" / "configs"
    names = packaged_config_names()
    assert {"default", "reference", "smoke", "chain/chain4_teamtr"} <= set(names)
    assert len(names) == len(list((REPO / "configs").rglob("*.toml")))


@pytest.mark.parametrize(
    ("name", "file"),
    [
        ("default", "default.toml"),
        ("default.toml", "default.toml"),
        ("chain/chain4_teamtr", "chain/chain4_teamtr.toml"),
        ("chain/chain4_teamtr.toml", "chain/chain4_teamtr.toml"),
        ("configs/compare/grpo.toml", "compare/grpo.toml"),  # the README's paths, outside a clone
    ],
)
def test_a_name_outside_a_clone_is_the_packaged_file(name, file, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert find_config(name) == PACKAGED_CONFIGS / file
    assert load_config(name) == load_config(PACKAGED_CONFIGS / file)


def test_an_existing_path_always_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "default.toml").write_text("[stage]\nstages = 3\n")
    assert find_config("default.toml") == Path("default.toml")
    assert load_config("default.toml").stage.stages == 3
    assert (
        load_config("default").stage.stages
        == load_config(PACKAGED_CONFIGS / "default.toml").stage.stages
    )


@pytest.mark.parametrize("name", ["nosuch", "chain/nosuch.toml", "../default", "/no/default.toml"])
def test_an_unknown_name_is_one_line_with_the_shipped_names(name, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--config", name, "--check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {name}: no such config file")
    assert str(PACKAGED_CONFIGS) in err and "default, " in err and "chain/chain4_teamtr" in err
    with pytest.raises(ConfigError, match="no such config file"):
        find_config(name)
    assert list(tmp_path.iterdir()) == []
