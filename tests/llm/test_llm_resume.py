"""Nothing lost on a crash: kill -9 or Ctrl-C in the middle of a run, resume, get the same run.

Each run that is killed or interrupted is a real `teamtr train` subprocess on a tiny model (one
torch thread, everything seeded), and so is its resume; the straight runs they are compared with
are trained by the same CLI in the test's process (``llm.interface.cli.main``), which saves a
process start and makes the comparison one across processes. The task's answers are all "2",
which the random tiny model says now and then, so the adapters and Adam states really move; a
straight run is compared bit for bit with one that was killed in the middle of its second stage
and resumed, and with one interrupted by SIGINT in its first stage and resumed. Only the
wall-clock timings may differ.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from llm_test_support import TIMING_KEYS, arithmetic_sampler, make_team, with_rewards
from safetensors.torch import load_file

from llm.interface.cli import main
from llm.training.checkpoint import FORMAT_VERSION, RUN_MARKER, latest_checkpoint
from llm.update.updater import TrustRegionUpdater, UpdaterSettings

REPO = Path(__file__).resolve().parents[2]
STAGES = 2
N_AGENTS = 2

CONFIG = """
[model]
source = "tiny"
[lora]
rank = 4
[team]
n_agents = 2
router = "random"
system_prompt = "Solve."
[task]
kind = "jsonl"
train_file = "{data}"
test_file = "{data}"
eval_size = 4
[sampler]
prompts_per_batch = 4
group_size = 4
turns = 3
max_new_tokens = 20
# Dynamic sampling: further groups until one holds differing rewards, so that the updates of
# both stages have a signal whatever the draws (the comparisons need adapters that moved).
signal_groups = 1
max_draws = 8
[updater]
learning_rate = 1e-2
steps = 2
[stage]
scheme = "teamtr"
radius = 0.05
update_order = "random"
stages = 2
[run]
output_dir = "{runs}"
eval_every = 1
checkpoint_every = 1
threads = 1
{extra}
"""


def write_config(directory: Path, extra: str = "") -> Path:
    data = directory / "say_two.jsonl"
    data.write_text("".join(f'{{"question": "Say two ({i})", "answer": "2"}}\n' for i in range(20)))
    path = directory / "resume.toml"
    path.write_text(CONFIG.format(data=data, runs=directory / "runs", extra=extra))
    return path


def teamtr(*args: str) -> subprocess.Popen:
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    return subprocess.Popen(
        [sys.executable, "-m", "teamtr.cli", *args, "--no-progress"],
        cwd=REPO,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A shell without job control starts background commands with SIGINT ignored, and an
        # ignored signal stays ignored across exec: give the run Python's own Ctrl-C handling.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def finish(process: subprocess.Popen) -> tuple[int, str]:
    _, err = process.communicate(timeout=300)
    return process.returncode, err


def wait_for(path: Path, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while not path.exists():
        assert process.poll() is None, f"run ended early: {process.communicate()[1][-2000:]}"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


def metrics_without_timings(run_dir: Path) -> list[str]:
    lines = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        for key in TIMING_KEYS:
            record.pop(key)
        lines.append(json.dumps(record))  # NaN-safe comparison: as text
    return lines


def final_state(run_dir: Path) -> dict[str, torch.Tensor]:
    checkpoint = run_dir / "checkpoints" / f"stage_{STAGES}"
    tensors = {}
    for agent in range(N_AGENTS):
        for key, value in load_file(str(checkpoint / f"agent{agent}.safetensors")).items():
            tensors[f"agent{agent}/{key}"] = value
    state = torch.load(checkpoint / "state.pt", weights_only=True)
    for agent, optimizer in state["optimizers"].items():
        for index, moments in optimizer["state"].items():
            for name, value in moments.items():
                tensors[f"adam{agent}/{index}/{name}"] = value
    return tensors


def assert_identical_runs(straight: Path, other: Path) -> None:
    assert metrics_without_timings(other) == metrics_without_timings(straight)
    expected, got = final_state(straight), final_state(other)
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[k], got[k]) for k in expected), "final states differ"


def killed_in_second_stage_and_resumed(config: Path) -> Path:
    """A run of ``config`` named "killed", killed (SIGKILL) in its second stage, then resumed
    to its end; its directory."""
    run_dir = config.parent / "runs" / "killed"
    process = teamtr("train", "--config", str(config), "--name", "killed")
    wait_for(run_dir / "checkpoints" / "stage_1", process)
    time.sleep(0.3)  # into the second stage's sampling and updates
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=60)
    assert not (run_dir / "checkpoints" / f"stage_{STAGES}").exists(), "killed too late"
    code, err = finish(teamtr("train", "--resume", str(run_dir)))
    assert code == 0, err
    return run_dir


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("straight")
    config = write_config(directory)
    assert main(["train", "--config", str(config), "--name", "straight", "--no-progress"]) == 0
    run_dir = directory / "runs" / "straight"
    updates = [u for line in metrics_without_timings(run_dir) for u in json.loads(line)["updates"]]
    # The comparison means something only if training moved the adapters.
    assert any(u["kept"] and u["kl"] > 0 for u in updates)
    lora_b = [v for k, v in final_state(run_dir).items() if "lora_B" in k]
    assert lora_b and any(v.ne(0).any() for v in lora_b)
    return config, run_dir


def test_sigkill_in_second_stage_then_resume_is_bit_identical(straight_run, tmp_path):
    config, straight = straight_run
    run_dir = killed_in_second_stage_and_resumed(config)
    assert_identical_runs(straight, run_dir)
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    assert events[-2]["event"] == "resumed" and events[-2]["checkpoint"] == "stage_1"
    assert events[-1]["event"] == "finished"


def test_sigint_writes_a_checkpoint_exits_cleanly_and_resumes_exactly(straight_run):
    config, straight = straight_run
    run_dir = config.parent / "runs" / "interrupted"
    process = teamtr("train", "--config", str(config), "--name", "interrupted")
    wait_for(run_dir / "tensorboard", process)  # created as the first stage begins
    time.sleep(0.3)
    process.send_signal(signal.SIGINT)
    code, err = finish(process)
    assert code == 130, err
    assert "Traceback" not in err and "teamtr train --resume" in err
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    interrupted = events[-1]
    assert interrupted["event"] == "interrupted"
    assert (run_dir / "checkpoints" / interrupted["checkpoint"] / "manifest.json").is_file()

    code, err = finish(teamtr("train", "--resume", str(run_dir)))
    assert code == 0, err
    assert_identical_runs(straight, run_dir)
    before = (run_dir / "metrics.jsonl").read_bytes()
    assert main(["train", "--resume", str(run_dir), "--no-progress"]) == 0  # already complete
    assert (run_dir / "metrics.jsonl").read_bytes() == before


def test_corrupt_or_torn_newest_checkpoint_falls_back_to_the_previous(straight_run, tmp_path):
    _, straight = straight_run
    run_dir = tmp_path / "copy"
    shutil.copytree(straight, run_dir)
    newest = run_dir / "checkpoints" / f"stage_{STAGES}"
    data = bytearray((newest / "agent0.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (newest / "agent0.safetensors").write_bytes(bytes(data))
    latest = latest_checkpoint(run_dir)
    assert latest.directory == run_dir / "checkpoints" / "stage_1"
    assert "checksum does not match" in latest.skipped[0]

    (newest / "manifest.json").unlink()  # a torn write: the manifest is written last
    assert latest_checkpoint(run_dir).directory.name == "stage_1"

    # Resuming redoes the last stage from stage_1 and rewrites the same final state.
    assert main(["train", "--resume", str(run_dir), "--no-progress"]) == 0
    assert_identical_runs(straight, run_dir)


def test_a_run_directory_of_another_format_is_refused_with_exit_2(straight_run, tmp_path, capsys):
    _, straight = straight_run
    newer = tmp_path / "newer"
    shutil.copytree(straight, newer)
    (newer / RUN_MARKER).write_text(json.dumps({"format_version": FORMAT_VERSION + 1}))
    assert main(["train", "--resume", str(newer)]) == 2
    assert f"{newer / RUN_MARKER}: format_version {FORMAT_VERSION + 1}" in capsys.readouterr().err
    out = tmp_path / "eval.json"
    assert main(["eval", "--run", str(newer), "--json", str(out)]) == 2
    assert "newer teamtr" in capsys.readouterr().err and not out.exists()

    legacy = tmp_path / "legacy"  # written before the format was recorded: adapters only
    shutil.copytree(straight, legacy)
    (legacy / RUN_MARKER).unlink()
    for checkpoint in (legacy / "checkpoints").iterdir():
        (checkpoint / "manifest.json").unlink()
    assert main(["train", "--resume", str(legacy)]) == 2
    assert "cannot be resumed" in capsys.readouterr().err
    assert main(["eval", "--run", str(legacy), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["n"] == 4


def test_an_existing_run_directory_is_not_overwritten(straight_run, capsys):
    config, straight = straight_run
    before = (straight / "metrics.jsonl").read_bytes()
    assert main(["train", "--config", str(config), "--name", "straight"]) == 2
    assert "already exists" in capsys.readouterr().err
    assert (straight / "metrics.jsonl").read_bytes() == before


def test_non_finite_loss_rejects_the_update_and_restores_params_and_adam_state(
    char_chat, char_tokenizer
):
    team = make_team(len(char_tokenizer), 3)
    sampler = arithmetic_sampler(char_chat)
    updater = TrustRegionUpdater(char_chat, UpdaterSettings(learning_rate=1e-2, steps=2))
    rollouts = with_rewards(sampler.sample(team), [1, 0, 0, 1])
    first = updater.update(team, 0, rollouts, radius=1.0)
    assert first.accepted and first.kl > 0  # Adam now has moments worth protecting
    team = team.with_agent(0, first.policy)
    optimizer = updater.optimizers[0]
    moments_before = {(i, k): v.clone() for i, s in optimizer.state.items() for k, v in s.items()}

    poisoned = with_rewards(sampler.sample(team), [1, 0, 0, 1])
    poisoned.advantages[0] = np.nan  # e.g. a reward model that returned NaN
    update = updater.update(team, 0, poisoned, radius=1.0)

    assert not update.accepted and update.non_finite == "loss"
    assert update.policy.equal(first.policy)
    live = team.backbone.parameters_of(0)
    assert all(torch.equal(live[k], first.policy.tensors[k]) for k in live)
    after = {(i, k): v for i, s in optimizer.state.items() for k, v in s.items()}
    assert after.keys() == moments_before.keys()
    assert all(torch.equal(after[key], moments_before[key]) for key in after)


def test_a_run_with_non_finite_steps_goes_on_and_logs_them(tmp_path):
    # A learning rate of 1e30 sends the adapters to inf on the first step with a gradient:
    # that update's KL is NaN, it is rejected and logged, and the run carries on. Updates on
    # zero advantages move nothing, so the team stays the initial one (B = 0) throughout.
    config = write_config(tmp_path)
    config.write_text(config.read_text().replace("learning_rate = 1e-2", "learning_rate = 1e30"))
    assert main(["train", "--config", str(config), "--name", "nan", "--no-progress"]) == 0
    run_dir = tmp_path / "runs" / "nan"
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    updates = [u for record in records for u in record["updates"]]
    assert len(records) == STAGES
    flagged = [u for u in updates if u["non_finite"] is not None]
    assert flagged and all(not u["kept"] and not u["accepted"] for u in flagged)
    assert {u["non_finite"] for u in flagged} <= {"kl", "gradient", "loss", "surrogate"}
    for agent in range(N_AGENTS):
        checkpoint = run_dir / "checkpoints" / f"stage_{STAGES}" / f"agent{agent}.safetensors"
        lora_b = [v for k, v in load_file(str(checkpoint)).items() if "lora_B" in k]
        assert lora_b and all(v.eq(0).all() for v in lora_b)


DICE_WORLD = '''
import random

from llm.problems.environment import Opening, Reply


class Dice:
    """Rolls a die after every message with the global random module, says so, pays the roll,
    ends the dialogue on a 1."""

    def reset(self, problem, seed):
        random.seed(seed)
        return Opening(problem.question)

    def step(self, speaker, message):
        roll = random.randint(1, 6)
        return Reply(text=f"rolled {roll}", reward=roll / 6, done=roll == 1)
'''


def test_a_run_in_a_stochastic_environment_killed_and_resumed_is_bit_identical(tmp_path):
    """A stochastic environment drawing from the global ``random`` module: a run killed in its
    second stage and resumed is the straight run, bit for bit (metrics and final weights)."""
    base = write_config(tmp_path)
    (tmp_path / "dice_world.py").write_text(DICE_WORLD)
    config = tmp_path / "dice.toml"
    config.write_text(f'extends = "{base}"\n[task]\nenvironment = "dice_world:Dice"\n')
    assert main(["train", "--config", str(config), "--name", "straight", "--no-progress"]) == 0
    straight = tmp_path / "runs" / "straight"
    records = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
    assert all(r["environment_texts"] > 0 for r in records)
    assert_identical_runs(straight, killed_in_second_stage_and_resumed(config))
