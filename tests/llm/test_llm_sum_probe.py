"""The role-by-role probe of a private-notes sum team (studies.llm.sum_probe), on a tiny model:
its forced turns read as the numbers they stand for, its whole-team figure is the greedy
held-out accuracy, and it probes a real run's final checkpoint."""

from __future__ import annotations

import json

import pytest

from llm.evaluation.held_out_problems import evaluate_team
from llm.interface.cli import main as teamtr
from llm.models.loading import tiny_char_tokenizer
from llm.training.builder import build
from studies.llm import sum_probe

CONFIG = """
[model]
source = "tiny"
[lora]
rank = 4
[team]
n_agents = 3
system_prompt = "Add."
role_prompts = []
[task]
kind = "private_notes"
note_max = 5
note_answer = "sum"
eval_size = 6
[sampler]
prompts_per_batch = 2
group_size = 2
turns = 3
max_new_tokens = 3
temperature = 1.5
[updater]
learning_rate = 1e-2
steps = 1
[stage]
scheme = "teamtr"
radius = 0.05
stages = 1
[run]
output_dir = "{runs}"
eval_every = 0
checkpoint_every = 1
threads = 1
"""


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "sum.toml"
    path.write_text(CONFIG.format(runs=tmp_path / "runs"))
    return path


def test_a_forced_turn_reads_as_its_number_and_ends_like_a_sampled_one(config):
    from llm.common.config import load_config

    chat = build(load_config(config), progress=False).chat
    tokenizer = tiny_char_tokenizer()

    def encode(text):
        return tokenizer.encode(text, add_special_tokens=False)

    turn = sum_probe.forced_turn(encode, chat, 1, "17")
    assert turn.agent == 1 and turn.message[-1] == chat.stop_id
    assert chat.message_text(turn) == "17"


def test_the_probe_of_an_untrained_and_a_trained_team(config, tmp_path, capsys):
    assert teamtr(["train", "--config", str(config), "--name", "run", "--no-progress"]) == 0
    run = tmp_path / "runs" / "run"
    out = tmp_path / "probe.json"
    argv = ["--config", str(config), "--run", str(run), "--samples", "3", "--json", str(out)]
    assert sum_probe.main([*argv, "--markdown", "--no-progress"]) == 0
    result = json.loads(out.read_text())
    assert list(result["teams"]) == ["untrained", "runs/run"]
    assert result["teams"]["runs/run"]["checkpoint"] == "stage_1"
    # A rerun finds every team in the file and probes none again (their CPU times stay).
    assert sum_probe.probe(config, [run], 3, False, out) == result
    for numbers in result["teams"].values():
        assert numbers["problems"] == 6 and numbers["samples"] == 3
        shares = [numbers[c] for c in sum_probe.COLUMNS]
        assert all(0.0 <= s <= 1.0 for s in shares)
        # One sampled message right on a problem makes its group a hit.
        assert numbers["group_hit"] >= numbers["last_sampled"]
    # The whole team, greedy, is the held-out accuracy the evaluation reports.
    from llm.common.config import load_config

    parts = build(load_config(config), progress=False)
    accuracy = evaluate_team(parts.team, parts.sampler, parts.test_problems)["accuracy"]
    assert result["teams"]["untrained"]["team"] == pytest.approx(accuracy, abs=1e-12)
    assert "| untrained |" in capsys.readouterr().out


def test_the_probe_takes_a_run_with_a_format_reward_and_refuses_another_task(config, tmp_path):
    assert teamtr(["train", "--config", str(config), "--name", "run", "--no-progress"]) == 0
    run = tmp_path / "runs" / "run"
    rewarded = tmp_path / "rewarded.toml"
    rewarded.write_text(
        config.read_text().replace("eval_size = 6", "eval_size = 6\nformat_reward = 0.1")
    )
    assert (
        sum_probe.probe(rewarded, [run], 1, False)["teams"]["runs/run"]["checkpoint"] == "stage_1"
    )
    other = tmp_path / "other.toml"
    other.write_text(config.read_text().replace("note_max = 5", "note_max = 6"))
    with pytest.raises(SystemExit, match="differ"):
        sum_probe.probe(other, [run], 1, False)
