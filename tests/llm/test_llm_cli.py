"""`teamtr train` / `teamtr eval` end to end on the tiny smoke config; bad input exits 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llm_test_support import SMOKE

from llm.common.config import ConfigError, load_config
from llm.interface.cli import main

REPO = Path(__file__).resolve().parents[2]


def smoke_config(tmp_path: Path, extra: str = "") -> Path:
    text = SMOKE.read_text().replace("[run]\n", f'[run]\noutput_dir = "{tmp_path / "runs"}"\n')
    path = tmp_path / "smoke.toml"
    path.write_text(text + extra)
    return path


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "test.jsonl"
    path.write_text(
        '{"question": "What is 2 + 3?", "answer": "5"}\n{"question": "What is 1 + 1?", "answer": 2}\n'
    )
    return path


def test_train_then_eval_run_and_untrained(tmp_path, data_file, capsys):
    config = smoke_config(tmp_path)
    assert main(["train", "--config", str(config), "--name", "smoke", "--no-progress"]) == 0
    run_dir = tmp_path / "runs" / "smoke"
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["stage"] for x in lines] == [0, 1]
    assert all(len(x["updates"]) == 2 and "eval" in x for x in lines)
    # teamtr samples at the stage start and again after the first of the two updates
    assert all(len(x["rollout_rewards"]) == 2 for x in lines)
    assert all(x["rollout_rewards"][0] == x["train_reward"] for x in lines)
    assert (run_dir / "checkpoints" / "stage_2" / "agent1.safetensors").is_file()
    assert (run_dir / "checkpoints" / "stage_2" / "state.pt").is_file()
    assert any((run_dir / "tensorboard").iterdir())
    assert load_config(run_dir / "config.json").stage.stages == 2

    out = tmp_path / "eval.json"
    assert (
        main(
            [
                "eval",
                "--run",
                str(run_dir),
                "--step",
                "1",
                "--data",
                str(data_file),
                "--json",
                str(out),
                "--samples",
                "3",
            ]
        )
        == 0
    )
    result = json.loads(out.read_text())
    assert result["n"] == 2 and 0 <= result["accuracy"] <= result["pass@3"] <= 1
    assert {"parse_failure_rate", "mean_tokens", "majority_vote"} <= result.keys()
    assert (
        main(["eval", "--config", str(config), "--data", str(data_file), "--json", str(out)]) == 0
    )
    greedy = json.loads(out.read_text())
    assert greedy["samples"] == 1
    p = greedy["accuracy"]
    assert greedy["standard_error"] == pytest.approx((p * (1 - p) / greedy["n"]) ** 0.5, abs=1e-12)


def test_bad_input_exits_2_with_a_message(tmp_path, data_file, capsys):
    bad = smoke_config(tmp_path, "\n[stage2]\nx = 1\n")
    assert main(["train", "--config", str(bad)]) == 2
    assert "unknown section [stage2]" in capsys.readouterr().err
    typo = tmp_path / "typo.toml"
    typo.write_text("[stage]\nradius = 0.1\nstagez = 3\n")
    assert main(["train", "--config", str(typo)]) == 2
    err = capsys.readouterr().err
    assert "typo.toml" in err and "'stagez'" in err
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"question": "q", "answer": "1"}\n{"question": "q"}\n')
    assert (
        main(
            [
                "eval",
                "--config",
                str(SMOKE),
                "--data",
                str(broken),
                "--json",
                str(tmp_path / "o.json"),
            ]
        )
        == 2
    )
    assert f"{broken}:2: no 'answer' in this row" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "none.toml")


def test_shipped_configs_are_valid():
    for name in ("default", "reference", "single_agent", "smoke"):
        config = load_config(REPO / "configs" / f"{name}.toml")
        assert config.sampler.turns >= 2
    assert load_config(REPO / "configs" / "single_agent.toml").team.n_agents == 1
    assert load_config(REPO / "configs" / "default.toml").team.n_agents == 2


def test_the_default_run_is_the_private_note_relay_on_the_reference_model():
    default = load_config(REPO / "configs" / "default.toml")
    reference = load_config(REPO / "configs" / "reference.toml")
    assert (default.task.kind, default.task.note_answer) == ("private_notes", "first")
    assert default.team.role_prompts and not default.team.shared_adapter
    assert default.stage.scheme == "teamtr" and default.run.time_budget_minutes == 0
    assert (default.model, default.lora) == (reference.model, reference.lora)
    # The curve the README shows: held-out evaluations during training, the last at the end.
    assert 0 < default.run.eval_every < default.stage.stages
