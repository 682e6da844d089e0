"""Configs as a user outside the clone writes them: ``extends`` a shipped config by its name,
one key changed with ``--set``, and a misspelt key answered with the key that was meant.

Every command runs from a temporary folder outside the checkout, on the tiny random model of
``configs/smoke.toml``: the real ``teamtr`` console script in a subprocess where a shipped
config is found by its name from there, the same CLI in the test's process
(``llm.interface.cli.main``) for what a run records and what ``--set`` refuses.
"""

from __future__ import annotations

import json

import pytest
from llm_test_support import teamtr

from llm.common.config import ConfigError, load_config, parse_override
from llm.interface.cli import main


def test_extends_names_a_shipped_config_from_any_folder(tmp_path):
    (tmp_path / "mine.toml").write_text('extends = "smoke"\n[stage]\nstages = 1\n')
    done = teamtr("train", "--config", "mine.toml", "--check", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    config = load_config(tmp_path / "mine.toml")
    assert config.stage.stages == 1 and config.model.source == "tiny:128x2"  # smoke's, then mine


def test_a_file_next_to_the_config_wins_over_a_shipped_name(tmp_path):
    (tmp_path / "smoke").write_text('[model]\nsource = "tiny:8x1"\n')  # a file called smoke
    (tmp_path / "mine.toml").write_text('extends = "smoke"\n')
    assert load_config(tmp_path / "mine.toml").model.source == "tiny:8x1"


def test_extends_of_an_unknown_name_lists_the_shipped_configs(tmp_path):
    (tmp_path / "mine.toml").write_text('extends = "smok"\n')
    with pytest.raises(ConfigError, match=r"extends = 'smok': no such config file.*smoke"):
        load_config(tmp_path / "mine.toml")


def test_set_runs_one_stage_and_records_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    one = ["--config", "smoke", "--set", "stage.stages=1", "--set", "run.name=one"]
    assert main(["train", *one, "--no-progress"]) == 0, capsys.readouterr().err
    run_dir = tmp_path / "runs" / "one"
    assert json.loads((run_dir / "config.json").read_text())["stage"]["stages"] == 1
    stages = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["stage"] for line in stages] == [0]  # one stage, the first

    # Resumed, a run may change how long it goes on, not what it trains.
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir), "--set", "lora.rank=8"]) == 2
    assert "--set lora.rank: cannot change when a run resumes" in capsys.readouterr().err
    safe = ("--set", "run.eval_every=0", "--check")
    assert main(["train", "--resume", str(run_dir), *safe]) == 0


def test_a_misspelt_key_says_which_one_was_meant(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--config", "smoke", "--set", "stage.stagez=1", "--check"]) == 2
    err = capsys.readouterr().err
    assert "--set stage.stagez: unknown key 'stagez'; did you mean 'stages'?" in err
    (tmp_path / "typo.toml").write_text('extends = "smoke"\n[sampler]\ngroup_sise = 2\n')
    with pytest.raises(ConfigError, match=r"typo.toml:3: \[sampler\] group_sise.*'group_size'"):
        load_config(tmp_path / "typo.toml")
    with pytest.raises(ConfigError, match=r"unknown section \[stag\]; did you mean 'stage'"):
        load_config("smoke", [parse_override("stag.stages=1")])


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        ("stage.stages=3", ("stage", "stages", 3)),
        ("stage.radius=[0.1, 0.2]", ("stage", "radius", [0.1, 0.2])),
        ("run.name=probe", ("run", "name", "probe")),  # a bare word is text
        ('team.system_prompt="Solve it."', ("team", "system_prompt", "Solve it.")),
        ("updater.learning_rate=1e-3", ("updater", "learning_rate", 1e-3)),
    ],
)
def test_set_values_are_toml(written, expected):
    assert parse_override(written) == expected


def test_a_set_value_follows_the_rules_of_a_file():
    with pytest.raises(ConfigError, match=r"^--set stage.stages: must be >= 1, got 0"):
        load_config("smoke", [parse_override("stage.stages=0")])
    with pytest.raises(ConfigError, match=r"^--set run.seed: expected an integer"):
        load_config("smoke", [parse_override("run.seed=1.5")])
    with pytest.raises(ConfigError, match="expected SECTION.KEY=VALUE"):
        parse_override("stages=1")
    with pytest.raises(ConfigError, match="not a TOML value"):
        parse_override("stage.radius=[0.1")
    config = load_config("smoke", [parse_override("sampler.turns=3")])
    assert config.sampler.turns == 3 and load_config("smoke").sampler.turns == 2
