"""Data parallelism on gloo with two CPU processes (``teamtr train --nproc 2``, which runs
torchrun): the same run as one process with the same global batch, metrics written once, a
rank killed with SIGKILL then resumed reproduces the straight run, and bad setups exit 2 with
one message, without any rank hanging.

Float tolerance: the two-process run sums each agent's LoRA gradient over the ranks (an
all-reduce) where one process accumulates it chunk by chunk, so float32 sums are taken in
another order: adapters and Adam moments may differ by a few float32 roundings. They are
compared to 1e-5 of each tensor's largest entry (``RELATIVE_TOLERANCE``); the decisions (kept,
accepted, backtracks), rewards and token counts must be identical, KLs, surrogates, penalties
and certificates equal to their float32 resolution (``float_tolerances``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from llm_test_support import (
    FLOAT32_EPSILON,
    penalty_resolution,
    surrogate_resolution,
    turn_kl_resolution,
)
from test_llm_resume import (
    CONFIG,
    assert_identical_runs,
    final_state,
    metrics_without_timings,
)

from llm.interface.cli import main
from llm.models.loading import tiny_char_tokenizer
from llm.sampling.sampler import SamplerSettings

REPO = Path(__file__).resolve().parents[2]
RELATIVE_TOLERANCE = 1e-5
"""Of a tensor's largest entry: 80 float32 roundings of it. A gradient entry summed over the
chunks in another order moves by 3 eps times the sum of the chunks' magnitudes, which exceeds
the entry where chunks of opposite sign cancel; the former absolute 1e-6 against adapter entries
of order 0.1 allowed the same 80 roundings."""
STAGES = 2
pytestmark = pytest.mark.timeout(600)


def write_config(directory: Path, extra: str = "") -> Path:
    data = directory / "say_two.jsonl"
    data.write_text("".join(f'{{"question": "Say two ({i})", "answer": "2"}}\n' for i in range(20)))
    path = directory / "dp.toml"
    # Four episodes per scoring chunk: each shard of eight episodes is two chunks, so the
    # one-process gradient is accumulated in another order than the two ranks' all-reduce.
    # gloo on the CPU whatever the machine has (device = "auto" would mean NCCL on a GPU).
    if "device" not in extra:
        extra = 'device = "cpu"\n' + extra
    text = CONFIG.format(data=data, runs=directory / "runs", extra=extra)
    # Plain batches: sharded rollouts do not draw further groups (dynamic sampling).
    text = text.replace("signal_groups = 1", "signal_groups = 0")
    path.write_text(text.replace("max_new_tokens = 20", "max_new_tokens = 20\nscore_chunk = 4"))
    return path


def teamtr(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0", **(env or {})}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        if env is None or name not in env:
            environment.pop(name, None)
    return subprocess.Popen(
        [sys.executable, "-m", "teamtr", *args, "--no-progress"],
        cwd=REPO,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the test can end the whole launch if it must
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def finish(process: subprocess.Popen, timeout: float = 400) -> tuple[int, str]:
    try:
        _, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise AssertionError("a rank hung: the launch did not end in time") from None
    return process.returncode, err


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """The same config (rollout_shards = 2) as one process (the test's: the CLI's ``main``)
    and as two ranks (torchrun's)."""
    directory = tmp_path_factory.mktemp("dp")
    config = write_config(directory, "rollout_shards = 2")
    with pytest.MonkeyPatch.context() as patch:
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            patch.delenv(name, raising=False)
        assert main(["train", "--config", str(config), "--name", "one", "--no-progress"]) == 0
    two = teamtr("train", "--config", str(config), "--name", "two", "--nproc", "2")
    code, err = finish(two)
    assert code == 0, err
    return {"config": config, "one": directory / "runs" / "one", "two": directory / "runs" / "two"}


FLOATS = ("surrogate", "kl", "kl_quantile", "penalty", "certificate")
"""The recorded float values of an update: equal up to float32 rounding, not bit for bit."""


def decisions(run_dir: Path) -> tuple[list[dict], list[list[dict]]]:
    """The metrics records without their float values (compared exactly), and those values."""
    records = [json.loads(line) for line in metrics_without_timings(run_dir)]
    values = []
    for record in records:
        values.append([{k: update.pop(k) for k in FLOATS} for update in record["updates"]])
        values[-1].append({"certificate": record.pop("certificate")})
    return records, values


# The recorded float values' tolerances: their float32 resolution (llm_test_support) for the
# tiny model's vocabulary, messages of at most max_new_tokens = 20 tokens, H = 3 turns and
# |A| <= a_max, plus the update's own perturbation: the two runs' adapters differ by the
# roundings of the gradient's sum over the 4 scoring chunks of the global batch (3 additions in
# another order, a relative 3 eps of the step), which moves a KL (quadratic in the step) by a
# relative 6 eps and a surrogate (the step's first order) by 3 eps. For the one real update of
# this run (KL 3e-2, surrogate 0.4) that is 2.2e-5 and 1.3e-4, looser than the former equality
# after rounding to 6 decimals, which two values 1e-12 apart can fail; measured 0 (the same
# bits) natively on AVX-512 and with ATEN_CPU_CAPABILITY=default and avx2.
TOKENS, TURNS = 20, 3
GRADIENT_ROUNDINGS = 3


def float_tolerances(update: dict, vocabulary: int, a_max: float) -> dict[str, float]:
    eps = FLOAT32_EPSILON
    kl = turn_kl_resolution(vocabulary, TOKENS) + 2 * GRADIENT_ROUNDINGS * eps * update["kl"]
    surrogate = surrogate_resolution(vocabulary, TOKENS, a_max, TURNS)
    surrogate += GRADIENT_ROUNDINGS * eps * abs(update["surrogate"])
    penalty = penalty_resolution(update["penalty"], update["kl"], kl)
    tolerances = {"surrogate": surrogate, "kl": kl, "kl_quantile": kl, "penalty": penalty}
    tolerances["certificate"] = surrogate + penalty
    return tolerances


def test_two_ranks_train_what_one_process_trains_on_the_same_global_batch(runs):
    one, two = runs["one"], runs["two"]
    records, values = decisions(two)
    expected_records, expected_values = decisions(one)
    assert records == expected_records  # decisions, rewards, token counts: identical
    assert len(records) == STAGES
    vocabulary, a_max = len(tiny_char_tokenizer()), SamplerSettings().a_max
    trained = 0
    for stage, got, record in zip(values, expected_values, expected_records, strict=True):
        stage_tolerance = 0.0
        for update, expected, kept in zip(
            stage[:-1], got[:-1], [u["kept"] for u in record["updates"]], strict=True
        ):
            tolerances = float_tolerances(expected, vocabulary, a_max)
            for key in FLOATS:
                if expected[key] is None:
                    assert update[key] is None, key
                    continue
                assert abs(update[key] - expected[key]) <= tolerances[key], (key, update, expected)
            stage_tolerance += tolerances["certificate"] if kept else 0.0
            trained += kept and expected["kl"] > 0
        # the stage's certificate sums its kept updates' certificates
        assert abs(stage[-1]["certificate"] - got[-1]["certificate"]) <= stage_tolerance
    assert trained, "nothing was trained"
    expected, got = final_state(one), final_state(two)
    assert expected.keys() == got.keys()
    moved = [v for k, v in expected.items() if "lora_B" in k]
    assert any(v.abs().max() > 1e-3 for v in moved)
    for key in expected:
        # relative to the tensor's largest entry, so that Adam's moments (1e-14 to 1e-3) are
        # compared too, not only the adapters (1e-2 to 1e-1)
        atol = RELATIVE_TOLERANCE * float(expected[key].abs().max())
        assert torch.allclose(expected[key], got[key], rtol=0, atol=atol), key


def test_rank_0_alone_writes_metrics_events_and_checkpoints(runs):
    two = runs["two"]
    lines = (two / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["stage"] for line in lines] == list(range(STAGES))
    events = [json.loads(x)["event"] for x in (two / "events.jsonl").read_text().splitlines()]
    assert events == ["started", "finished"]
    assert json.loads((two / "distributed.json").read_text()) == {
        "world_size": 2,
        "rollout_shards": 2,
    }
    assert sorted(p.name for p in (two / "checkpoints").iterdir()) == ["stage_1", "stage_2"]
    assert len(list((two / "tensorboard").iterdir())) == 1  # one event file: one writer


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found.extend(int(x) for x in text)
    return found


def rank_of(pid: int) -> int | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for entry in environ:
        if entry.startswith(b"RANK="):
            return int(entry[5:])
    return None


def test_sigkill_of_one_rank_then_resume_reproduces_the_straight_run(runs):
    config, straight = runs["config"], runs["two"]
    run_dir = config.parent / "runs" / "killed"
    launch = teamtr("train", "--config", str(config), "--name", "killed", "--nproc", "2")
    deadline = time.monotonic() + 300
    while not (run_dir / "checkpoints" / "stage_1").exists():
        assert launch.poll() is None, f"run ended early: {launch.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, "stage_1 never appeared"
        time.sleep(0.01)
    time.sleep(0.3)  # into the second stage
    ranks = {rank_of(pid): pid for pid in children(launch.pid)}
    assert set(ranks) >= {0, 1}, ranks
    os.kill(ranks[1], signal.SIGKILL)
    code, err = finish(launch)
    assert code != 0
    # The surviving rank says in one line what happened, no backend traceback: either its
    # collective failed first (a peer stopped) or the launcher's SIGTERM reached it first
    # (it saved a checkpoint); which comes first is a race.
    assert "Traceback" not in err, err[-3000:]
    assert (
        "error: rank 0: a peer process of the run stopped" in err
        or "interrupted: state saved in" in err
    ), err[-3000:]
    assert not (run_dir / "checkpoints" / f"stage_{STAGES}").exists(), "killed too late"

    code, err = finish(teamtr("train", "--resume", str(run_dir), "--nproc", "2"))
    assert code == 0, err
    assert_identical_runs(straight, run_dir)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == STAGES
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    assert events[-2]["event"] == "resumed" and events[-2]["checkpoint"] == "stage_1"
    assert events[-1]["event"] == "finished"


def test_resuming_with_another_world_size_exits_2(runs, capsys):
    assert main(["train", "--resume", str(runs["two"])]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1
    assert "was trained by 2 process(es) but is being resumed by 1" in err
    assert main(["train", "--resume", str(runs["one"]), "--nproc", "2"]) == 2
    assert "was trained by 1 process(es) but is being resumed by 2" in capsys.readouterr().err


RENDEZVOUS = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999", "LOCAL_RANK": "0"}


@pytest.mark.parametrize(
    ("environment", "extra", "message"),
    [
        ({"RANK": "0", "WORLD_SIZE": "2"}, "", "MASTER_ADDR, MASTER_PORT are not set"),
        ({**RENDEZVOUS, "RANK": "0", "WORLD_SIZE": "3"}, "", "not divisible by the world size 3"),
        ({**RENDEZVOUS, "RANK": "0", "WORLD_SIZE": "2"}, 'device = "cuda:99"', "cuda:99"),
    ],
)
def test_a_bad_setup_stops_every_rank_with_exit_2_and_rank_0_says_why(
    tmp_path, capsys, monkeypatch, environment, extra, message
):
    # Each rank checks the setup before it joins a process group, so none waits for another.
    config = write_config(tmp_path, extra)
    for rank in ("0", "1"):
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            monkeypatch.delenv(name, raising=False)
        for name, value in {**environment, "RANK": rank}.items():
            monkeypatch.setenv(name, value)
        started = time.monotonic()
        assert main(["train", "--config", str(config), "--no-progress"]) == 2
        assert time.monotonic() - started < 60
        err = capsys.readouterr().err
        if rank == "0":
            assert err.count("error:") == 1 and message in err, err
        else:
            assert "error:" not in err
    assert not (tmp_path / "runs").exists()


def test_the_launcher_checks_the_setup_before_starting_any_rank(tmp_path, capsys, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    config = write_config(tmp_path)
    assert main(["train", "--config", str(config), "--nproc", "3"]) == 2
    assert "prompts_per_batch = 4 is not divisible by the world size 3" in capsys.readouterr().err
    shards = write_config(tmp_path, "rollout_shards = 2")
    assert main(["train", "--config", str(shards), "--nproc", "4"]) == 2
    assert "rollout_shards = 2 cannot be split over 4 processes" in capsys.readouterr().err
    absent = write_config(tmp_path, 'device = "cuda:99"')
    assert main(["train", "--config", str(absent), "--nproc", "2"]) == 2
    assert "cuda:99" in capsys.readouterr().err


def test_a_failure_after_the_ranks_met_ends_every_rank_with_exit_2(runs):
    # The run directory exists: rank 0 finds out after the process group formed; every rank
    # learns it from the others (llm.training.distributed.agree) and stops instead of waiting.
    config = runs["config"]
    code, err = finish(teamtr("train", "--config", str(config), "--name", "two", "--nproc", "2"))
    assert code == 2
    assert err.count("error:") == 1 and "already exists" in err


RANK_ZERO_SCRIPT = """
import os, sys, time
import llm.interface.cli as cli
import llm.interface.train_command as train_command
import llm.common.command_faults as command_faults

# A peer's own wait far beyond the test's time-out: the launch ends in time only if torchrun
# ends the waiting peers when rank 0 exits, whatever the load on the machine.
command_faults.PEER_REPORT_WAIT_S = 3600.0
checks = train_command._train_config


def rank_zero_delayed(*args):
    # Rank 0 reaching its checks last, as when it imported torch after its peers.
    if os.environ["RANK"] == "0":
        time.sleep(RANK_ZERO_DELAY_S)
    return checks(*args)


train_command._train_config = rank_zero_delayed
raise SystemExit(cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("rank_zero_delay_s", [0, 8], ids=["as fast as its peers", "last to check"])
def test_plain_torchrun_reports_a_bad_batch_once_and_no_rank_hangs(tmp_path, rank_zero_delay_s):
    # torchrun ends every rank once one exits: the peers must leave rank 0 time to say why.
    config = write_config(tmp_path, "")
    script = tmp_path / "rank_zero_delayed.py"
    script.write_text(f"RANK_ZERO_DELAY_S = {rank_zero_delay_s}\n{RANK_ZERO_SCRIPT}")
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "3",
        str(script),
        "train",
        "--config",
        str(config),
        "--no-progress",
    ]
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    # A peer left to its own wait (an hour) would run past the time-out: TimeoutExpired fails
    # the test, so finishing at all shows torchrun ended the waiting peers when rank 0 exited.
    done = subprocess.run(
        command, cwd=REPO, env=environment, capture_output=True, text=True, timeout=300
    )
    assert done.returncode != 0
    assert done.stderr.count("error:") == 1, done.stderr
    assert "not divisible by the world size 3" in done.stderr
