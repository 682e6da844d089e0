"""The worked examples of a task of one's own (``docs/examples/proposer_verifier``, a JSONL file
and a reward; ``docs/examples/per_turn``, a task in code with one reward per turn) run as
documented, on the tiny model: their commands (``--check``, ``train``, ``eval``) through a
config that extends theirs, and the per-turn task in a few lines of Python."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import llm
from llm.interface.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
TINY_OVERRIDES = """
[model]
source = "tiny"
[lora]
rank = 4
[sampler]
prompts_per_batch = 2
group_size = 2
max_draws = 2
[stage]
stages = 1
[run]
eval_every = 1
"""


def tiny_config(tmp_path: Path, example: str) -> Path:
    path = tmp_path / f"{example}.toml"
    path.write_text(
        f'extends = "{EXAMPLES / example / "team.toml"}"\n{TINY_OVERRIDES}'
        f'output_dir = "{tmp_path / "runs"}"\n[task]\neval_size = 4\n'
    )
    return path


@pytest.mark.parametrize("example", ["proposer_verifier", "per_turn", "calculator", "checker"])
def test_the_example_checks_trains_and_evaluates_on_the_tiny_model(tmp_path, capsys, example):
    config = tiny_config(tmp_path, example)
    assert main(["train", "--config", str(config), "--check"]) == 0
    checked = capsys.readouterr().out
    assert "dialogues played on a tiny random model" in checked
    assert ("environment stepped" in checked) == (example in ("calculator", "checker"))
    assert ("per-turn" in checked) == (example == "per_turn")
    assert main(["train", "--config", str(config), "--no-progress", "--name", "r"]) == 0
    record = json.loads((tmp_path / "runs" / "r" / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["eval"]["n"] == 4 and 0 <= record["eval"]["accuracy"] <= 1
    # The per-turn reward's held-out mean is reported beside the accuracy.
    assert ("turn_credit" in record["eval"]) == (example == "per_turn")
    out = tmp_path / "eval.json"
    assert main(["eval", "--run", str(tmp_path / "runs" / "r"), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["accuracy"] == record["eval"]["accuracy"]


def test_the_per_turn_task_in_a_few_lines_of_python(monkeypatch):
    import teamtr

    monkeypatch.syspath_prepend(str(EXAMPLES / "per_turn"))
    monkeypatch.delitem(sys.modules, "relay_chain", raising=False)
    import relay_chain

    task = relay_chain.make(n_agents=3, note_max=9)
    assert llm.check_task(task).per_turn
    team, sampler, updater, penalty = llm.build_team(
        task=task, source="tiny", n_agents=3, turns=3, prompts_per_batch=2, group_size=2
    )
    report, team = teamtr.run_stage(team, sampler, updater, teamtr.StageConfig(), penalty)
    assert len(report.records) == 3
    # Every turn is paid for stating the first speaker's number: the return is their share.
    first = report.sampled_rollouts[0]
    for episode, reward in zip(first.episodes, first.rewards, strict=True):
        said = [sampler.chat.message_text(turn) for turn in episode.turns]
        credits = relay_chain.every_turn_states_the_number(
            llm.Dialogue(episode.problem, tuple(said), tuple(t.agent for t in episode.turns))
        )
        assert reward == np.mean(credits)


def test_the_relay_chain_reward_pays_each_turn_that_states_the_first_number():
    sys.path.insert(0, str(EXAMPLES / "per_turn"))
    try:
        import relay_chain
    finally:
        sys.path.remove(str(EXAMPLES / "per_turn"))
    problem = llm.Problem("q", "17", notes=("Your private number is 17.", "", ""))
    dialogue = llm.Dialogue(problem, ("17", "It was 17, I think", "71"), (0, 1, 2))
    assert relay_chain.every_turn_states_the_number(dialogue) == [1.0, 1.0, 0.0]
    held_out = {p.question for p in relay_chain.make().test}
    trained = {p.question for p in relay_chain.make().draw(np.random.default_rng(0), 50)}
    assert held_out.isdisjoint(trained)  # held-out questions are phrased differently
