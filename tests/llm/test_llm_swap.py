"""`teamtr swap` end to end on tiny runs: exactly agent k changes, eval/resume accept the result,
bad arguments exit 2 and leave nothing behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llm_test_support import SMOKE, perturb_agent
from safetensors.torch import save_file

from llm.common.config import load_config
from llm.interface.cli import main
from llm.training.builder import build
from llm.training.checkpoint import (
    ResumePoint,
    read_checkpoint,
    write_checkpoint,
    write_run_marker,
)

AGENT = 1


def make_run(root: Path, name: str, seed: int, stage: int = 1, stages: int = 2) -> Path:
    """A run directory of the tiny smoke config whose checkpoint holds perturbed adapters."""
    text = SMOKE.read_text().replace("stages = 2", f"stages = {stages}")
    config_file = root / f"{name}.toml"
    config_file.write_text(text)
    config = load_config(config_file)
    parts = build(config)
    team = parts.team
    for agent in range(team.n_agents):
        team = perturb_agent(team, agent, scale=0.3, seed=seed + agent)
        parts.updater.optimizer_for(team, agent)
    run_dir = root / name
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(config.to_dict(), indent=2))
    write_run_marker(run_dir)
    point = ResumePoint.capture(stage, team, parts.updater, parts.sampler.rng, (), 0.0)
    write_checkpoint(run_dir, point)
    return run_dir


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path]:
    return make_run(tmp_path, "current", seed=10), make_run(tmp_path, "other", seed=20)


def checkpoint_of(run_dir: Path, stage: int = 1) -> ResumePoint:
    return read_checkpoint(run_dir / "checkpoints" / f"stage_{stage}")


def test_direct_swap_changes_exactly_agent_k_and_eval_accepts_it(runs, tmp_path, capsys):
    current, other = runs
    out = tmp_path / "swapped"
    argv = ["swap", "--run", str(current), "--agent", str(AGENT), "--model", str(other)]
    assert main([*argv, "--out", str(out)]) == 0
    before, donor, after = checkpoint_of(current), checkpoint_of(other), checkpoint_of(out)
    assert after.policies[AGENT].equal(donor.policies[AGENT])
    assert not after.policies[AGENT].equal(before.policies[AGENT])
    for agent in range(len(before.policies)):
        if agent != AGENT:
            assert after.policies[agent].equal(before.policies[agent])
    assert sorted(after.optimizer_states) == [0]  # the replaced agent's Adam state is dropped
    record = json.loads((out / "swap.json").read_text())
    assert record["mode"] == "direct" and record["changed_agents"] == [AGENT]
    assert record["new_adapter"] == {
        "kind": "run",
        "path": str(other),
        "agent": AGENT,
        "checkpoint": "stage_1",
    }
    capsys.readouterr()
    result_file = tmp_path / "eval.json"
    assert main(["eval", "--run", str(out), "--json", str(result_file)]) == 0
    result = json.loads(result_file.read_text())
    assert result["n"] == 4 and 0.0 <= result["accuracy"] <= 1.0


def test_aligned_swap_stays_inside_delta0_and_resumes(runs, tmp_path):
    current, other = runs
    out = tmp_path / "aligned"
    delta0 = 1e-3
    argv = ["swap", "--run", str(current), "--agent", str(AGENT), "--model", str(other)]
    options = ["--align", "--delta0", str(delta0), "--probe-size", "3", "--align-steps", "2"]
    assert main([*argv, *options, "--out", str(out)]) == 0
    before, donor, after = checkpoint_of(current), checkpoint_of(other), checkpoint_of(out)
    assert not after.policies[AGENT].equal(donor.policies[AGENT])
    assert not after.policies[AGENT].equal(before.policies[AGENT])
    assert after.policies[0].equal(before.policies[0])
    alignment = json.loads((out / "swap.json").read_text())["alignment"]
    assert alignment["pre_kl_to_cur"] > delta0  # the direct swap would leave the region
    assert alignment["kl_to_cur"] <= delta0
    assert alignment["kl_to_pre"] < alignment["pre_kl_to_cur"] + 1.0  # finite, measured
    # One more stage from the swapped checkpoint.
    assert main(["train", "--resume", str(out), "--no-progress"]) == 0
    assert checkpoint_of(out, 2).stage == 2


def test_swap_from_a_safetensors_file_and_stages_override(runs, tmp_path):
    current, other = runs
    adapter = tmp_path / "adapter.safetensors"
    save_file(dict(checkpoint_of(other).policies[0].tensors), str(adapter))
    out = tmp_path / "from-file"
    argv = ["swap", "--run", str(current), "--agent", "0", "--model", str(adapter)]
    assert main([*argv, "--stages", "5", "--out", str(out)]) == 0
    assert checkpoint_of(out).policies[0].equal(checkpoint_of(other).policies[0])
    assert load_config(out / "config.json").stage.stages == 5


@pytest.mark.parametrize(
    "change, message",
    [
        ({"--run": "missing"}, "no such run directory"),
        ({"--model": "missing"}, "no such file or directory"),
        ({"--agent": "2"}, "the run has agents 0..1"),
        ({"--agent": "-1"}, "the run has agents 0..1"),
        ({"--model-agent": "5"}, "the model run has agents 0..1"),
        ({"--step": "7"}, "no checkpoint stage_7"),
        ({"--stages": "1"}, "must exceed"),
        ({"--out": "current"}, "already exists"),
        ({"--model": "bad.safetensors"}, "do not match"),
    ],
    ids=lambda value: value if isinstance(value, str) else "-".join(value),
)
def test_bad_arguments_exit_2_and_write_nothing(runs, tmp_path, capsys, change, message):
    current, other = runs
    save_file(
        {
            "not_a_lora_tensor": checkpoint_of(other)
            .policies[0]
            .tensors[next(iter(checkpoint_of(other).policies[0].tensors))]
        },
        str(tmp_path / "bad.safetensors"),
    )
    arguments = {
        "--run": str(current),
        "--agent": str(AGENT),
        "--model": str(other),
        "--out": str(tmp_path / "out"),
    }
    arguments.update(
        {
            key: str(tmp_path / value) if key in ("--run", "--model", "--out") else value
            for key, value in change.items()
        }
    )
    before = sorted(p.name for p in tmp_path.iterdir())
    argv = ["swap"] + [item for pair in arguments.items() for item in pair]
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.startswith("error:") and message in error
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_swap_reads_a_legacy_run_of_adapters_only(runs, tmp_path):
    """Run directories written before checkpoints held the full state: adapters only."""
    current, other = runs
    legacy = tmp_path / "legacy"
    (legacy / "checkpoints" / "stage_1").mkdir(parents=True)
    (legacy / "config.json").write_text((current / "config.json").read_text())
    (legacy / "metrics.jsonl").write_text('{"stage": 0}\n')
    for agent, policy in enumerate(checkpoint_of(current).policies):
        path = legacy / "checkpoints" / "stage_1" / f"agent{agent}.safetensors"
        save_file(dict(policy.tensors), str(path))
    out = tmp_path / "from-legacy"
    argv = ["swap", "--run", str(legacy), "--agent", str(AGENT), "--model", str(other)]
    assert main([*argv, "--out", str(out)]) == 0
    after = checkpoint_of(out)
    assert after.stage == 1 and after.metrics_lines == ('{"stage": 0}',)
    assert after.policies[0].equal(checkpoint_of(current).policies[0])
    assert after.policies[AGENT].equal(checkpoint_of(other).policies[AGENT])
