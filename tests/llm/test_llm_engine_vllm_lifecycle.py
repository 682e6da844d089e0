"""The vLLM engine's server through ``teamtr train`` (``make vllm``; skipped without
``.venv-vllm``): the smoke run through the engine, the server gone on every way teamtr can end
(done, SIGTERM, Ctrl-C, kill -9), a server that dies mid-run (and the resumed run, in
bfloat16, the straight one bit for bit), and faults said in one ``error:``
line, among them a server at ``engine_url`` that refuses the run's key or serves another policy
than the trainer's (the probe before training); and a run that trains against a keyed server
it did not start, started as docs/scaling_out.md starts one.

A module of its own: its runs start and stop their servers through ``teamtr train``, apart
from ``test_llm_engine_vllm.py``'s in-process server.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import torch
from llm_test_support import TIMING_KEYS, free_port, group_alive, wait_gone
from safetensors.torch import load_file
from test_llm_engine_vllm import FORKED, REPO, TEAMTR, TOLERANCE, VLLM_PYTHON, write_config

from llm.common.config import ConfigError, load_config, parse_override
from llm.engines.vllm.command import ServeCommand, cpu_build_environment
from llm.engines.vllm.installation import is_cpu_build
from llm.engines.vllm.server import ADAPTER_FOLDER, OWNED_FOLDER, SOCKET_FOLDER, EngineServer
from llm.engines.vllm.server_address import ServerAddress
from llm.models.base_folder import base_folder
from llm.models.loading import load_tokenizer
from llm.training.builder import build

pytestmark = pytest.mark.skipif(
    not VLLM_PYTHON.is_file(), reason="no vLLM environment (`make vllm` builds .venv-vllm)"
)


# -- the server's lifecycle and faults, through `teamtr train` ---------------------------------
SERVER_PID = re.compile(r"\(APIServer pid=(\d+)\)")
ENGINE_CORE_PID = re.compile(r"\(EngineCore pid=(\d+)\)")


def start_training(
    config: Path | str,
    name: str,
    *extra: str,
    cwd: Path | None = None,
    temporary: Path | None = None,
) -> subprocess.Popen[str]:
    """``teamtr train`` in a process group of its own; ``temporary``: its TMPDIR."""
    where = {"TMPDIR": str(temporary)} if temporary is not None else {}
    return subprocess.Popen(
        [*TEAMTR, "train", "--config", str(config), "--name", name, "--no-progress", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group: a Ctrl-C can be sent to it as a terminal does
        # As a terminal's foreground process has it: pytest started in the background (`cmd &`
        # in a script, nohup) ignores SIGINT, and an ignored SIGINT is inherited, so teamtr
        # would never see the Ctrl-C.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **where},
        cwd=cwd,
    )


def wait_for_server(
    run_dir: Path, process: subprocess.Popen[str], staged: bool = True, timeout: float = 600
) -> int:
    """The server's pid (its group's id), once teamtr has started it and made the run, and
    (``staged``) once the run's first stage is recorded: its stages, and their handler of
    SIGTERM, are running, and its adapters have been loaded from their folder."""
    deadline = time.monotonic() + timeout
    pid = None
    while time.monotonic() < deadline:
        log = run_dir / "engine.log"  # moved into the run directory as the run begins
        if pid is None and log.is_file():
            found = SERVER_PID.search(log.read_text(errors="replace"))
            pid = int(found[1]) if found else None
        metrics = run_dir / "metrics.jsonl"
        if pid is not None and (not staged or (metrics.is_file() and metrics.stat().st_size)):
            return pid
        assert process.poll() is None, process.communicate()
        time.sleep(0.2)
    raise AssertionError("the server did not start" if pid is None else "no first stage")


def check_smoke_run(run_dir: Path, process: subprocess.Popen[str], group: int) -> None:
    """The shipped smoke config, run through the engine as a user runs it: it ends well, trains
    both agents in both stages, checks every update against the engine, and leaves no server."""
    _, err = process.communicate(timeout=900)
    assert process.returncode == 0, err
    assert not group_alive(group)
    assert "Application startup complete" in (run_dir / "engine.log").read_text()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    stages = [r for r in records if "updates" in r]
    assert len(stages) == 2 and all(len(r["updates"]) == 2 for r in stages)
    checked = [u["mismatch"] for r in stages for u in r["updates"] if u["mismatch"]]
    assert all(m["max_gap"] <= TOLERANCE for m in checked)


@pytest.mark.parametrize(
    ("way", "code"),
    [
        ("SIGTERM", 130),
        ("Ctrl-C", 130),
        ("kill -9", -signal.SIGKILL),
    ],
)
def test_no_server_outlives_teamtr(tmp_path, way, code):
    """Nor any of its temporary folders: ``close`` removes them, and after ``kill -9``, which
    no ``close`` survives, the next run's engine does (its own then the only ones). That next
    run is the shipped smoke config as a user runs it, from a folder outside the checkout (the
    engine's environment found beside teamtr's code, not the working directory), to its end
    (``check_smoke_run``)."""
    # Stages enough that the run is still going when the signal comes: the tiny team trains a
    # stage a second, and a loaded machine may keep this test from signalling for 20 s and more.
    config = write_config(tmp_path, stages=1000)
    # A temporary directory of the test's own (no other run's folders in it), with a short
    # path: a socket file's path holds at most 107 bytes.
    temporary = Path(tempfile.mkdtemp(prefix="t", dir="/tmp"))
    try:
        ended_by(way, code, config, temporary)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)


def engine_folders(temporary: Path) -> dict[str, int]:
    """The engine's temporary folders there: each one's kind and its owner's pid."""
    found = (OWNED_FOLDER.fullmatch(folder.name) for folder in temporary.iterdir())
    return {match[0]: int(match[2]) for match in found if match}


def ended_by(way: str, code: int, config: Path, temporary: Path) -> None:
    process = start_training(config, "stopped", temporary=temporary)
    group = wait_for_server(config.parent / "runs" / "stopped", process)
    # The server's engine core was forked from it, not spawned (vllm_plugin's engine_core_fork):
    # the plugin ran in the API server alone, where a spawned engine core runs it again.
    log = (config.parent / "runs" / "stopped" / "engine.log").read_text()
    forked_in = set(FORKED.findall(log))
    assert forked_in == {str(group)}, forked_in
    assert set(ENGINE_CORE_PID.findall(log)) - forked_in, "no engine core process in the log"
    if way == "SIGTERM":
        process.send_signal(signal.SIGTERM)
    elif way == "Ctrl-C":  # the terminal's SIGINT reaches every process of its group
        os.killpg(process.pid, signal.SIGINT)
    else:
        process.kill()
    try:
        process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        process.kill()  # a hung teamtr must not keep its server running for the tests after
        process.communicate(timeout=60)
        assert wait_gone(group, 60), f"after {way} and kill -9, the server outlived teamtr"
        raise AssertionError(f"teamtr did not end within 300 s of {way}") from None
    assert process.returncode == code
    assert wait_gone(group), f"the server outlived teamtr ({way})"
    left = engine_folders(temporary)
    if way != "kill -9":
        assert not left, left
        return
    kinds = {name.split(f"-{process.pid}-")[0] for name in left}
    assert kinds == {f"teamtr-{SOCKET_FOLDER}", f"teamtr-{ADAPTER_FOLDER}"}, left
    assert set(left.values()) == {process.pid}
    again = config.parent / "again"
    again.mkdir()
    engine = ("--set", "sampler.engine=vllm", "--set", "run.dtype=float32")
    where = ("--output-dir", str(again / "runs"))
    after = start_training("smoke", "after", *engine, *where, cwd=again, temporary=temporary)
    after_group = wait_for_server(again / "runs" / "after", after, staged=False)
    running = engine_folders(temporary)
    sockets = [name for name in running if name.startswith(f"teamtr-{SOCKET_FOLDER}-")]
    assert len(sockets) == 1 and set(running.values()) == {after.pid}, running
    check_smoke_run(again / "runs" / "after", after, after_group)
    assert not engine_folders(temporary)


def paid_config(config: Path, dtype: str = "float32") -> Path:
    """``config`` with each message paid for holding one of five letters (about half of the
    tiny model's messages do): groups with signal, so that both agents' updates run and are
    checked against the engine's log-probs; in ``dtype``."""
    paid = config.with_name("paid.toml")
    text = config.read_text().replace(
        "eval_size = 4\n",
        'eval_size = 4\nreward = "format_regex"\n[task.reward_args.format_regex]\n'
        'pattern = ".*[a-e].*"\nper_turn = true\n',
    )
    paid.write_text(text.replace('dtype = "float32"', f'dtype = "{dtype}"'))
    return paid


def records_without_timings(run_dir: Path) -> list[str]:
    lines = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        for key in TIMING_KEYS:
            record.pop(key, None)
        lines.append(json.dumps(record, sort_keys=True))
    return lines


def final_adapters(run_dir: Path, stage: int) -> dict[str, torch.Tensor]:
    checkpoint = run_dir / "checkpoints" / f"stage_{stage}"
    return {
        f"{agent}/{name}": tensor
        for agent in range(2)
        for name, tensor in load_file(str(checkpoint / f"agent{agent}.safetensors")).items()
    }


def resume(run_dir: Path) -> subprocess.CompletedProcess[str]:
    """``teamtr train --resume`` of the run, to its end (it starts a server of its own)."""
    return subprocess.run(
        [*TEAMTR, "train", "--resume", str(run_dir), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def test_a_bfloat16_run_whose_server_dies_resumes_to_the_straight_run_through_the_engine(tmp_path):
    """A server that dies mid-run (killed in the second stage's draws) stops the run with one
    ``error:`` line naming the server's log and keeps the last checkpoint whole; ``--resume``
    starts a new server and finishes the run. Half precision through the plugin's stochastic
    sum, whose rounding is hashed from what each row computes, not drawn from the server's
    generator: the new server rounds every request as the straight run's did, so the resumed
    second stage draws the same tokens with the same log-probs, and every record and the final
    adapters are the straight run's, bit for bit."""
    config = paid_config(write_config(tmp_path, stages=2), dtype="bfloat16")
    straight = start_training(config, "straight")
    _, err = straight.communicate(timeout=900)
    assert straight.returncode == 0, err
    run_dir = tmp_path / "runs" / "fault"
    process = start_training(config, "fault")
    group = wait_for_server(run_dir, process, staged=False)
    deadline = time.monotonic() + 900
    while not (run_dir / "checkpoints" / "stage_1").exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "no first stage"
        time.sleep(0.05)
    # teamtr paused while its server dies, so that it meets a dead server in the second stage's
    # draws however fast the machine (a fast one finished the 2-stage run in a fixed sleep).
    process.send_signal(signal.SIGSTOP)
    os.killpg(group, signal.SIGKILL)  # no waiting: its processes stay zombies until teamtr reaps
    process.send_signal(signal.SIGCONT)
    _, err = process.communicate(timeout=300)
    assert process.returncode == 1, err
    lines = err.strip().splitlines()
    assert lines[-1].startswith("error: ") and "vLLM server" in lines[-1], err
    assert str(run_dir / "engine.log") in lines[-1]
    assert not (run_dir / "checkpoints" / "stage_2").exists(), "killed too late"
    assert (run_dir / "checkpoints" / "stage_1").is_dir()  # the state it resumes from, whole
    resumed = resume(run_dir)
    assert resumed.returncode == 0, resumed.stderr
    events = [json.loads(line)["event"] for line in (run_dir / "events.jsonl").open()]
    assert events[-1] == "finished"
    new_group = int(SERVER_PID.findall((run_dir / "engine.log").read_text())[-1])
    assert new_group != group and not group_alive(new_group)
    expected = records_without_timings(tmp_path / "runs" / "straight")
    stages = [json.loads(line) for line in expected if "updates" in json.loads(line)]
    updates = [u for record in stages for u in record["updates"]]
    assert len(stages) == 2 and all(u["kept"] and u["mismatch"] for u in updates)
    assert all("LoRA sum stochastic" in u["drawn_by"] for u in updates)
    assert records_without_timings(run_dir) == expected
    straight_adapters = final_adapters(tmp_path / "runs" / "straight", 2)
    resumed_adapters = final_adapters(run_dir, 2)
    assert straight_adapters.keys() == resumed_adapters.keys()
    assert all(torch.equal(straight_adapters[k], resumed_adapters[k]) for k in straight_adapters)


def test_an_engine_that_is_not_installed_is_one_error_line_and_exit_2(tmp_path):
    config = write_config(tmp_path)
    result = subprocess.run(
        [*TEAMTR, "train", "--config", str(config), "--name", "missing", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TEAMTR_VLLM_PYTHON": str(tmp_path / "no" / "python")},
    )
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "make vllm" in errors[0], result.stderr
    assert not (tmp_path / "runs" / "missing").exists()


def test_engine_keys_without_the_server_engine_are_refused(tmp_path):
    config = write_config(tmp_path)
    text = config.read_text().replace('engine = "vllm"', 'engine_url = "http://127.0.0.1:9"')
    config.write_text(text)
    with pytest.raises(ConfigError, match="engine_url"):
        load_config(config)


# -- a server at engine_url: the key from the environment, and a probe before training --------
DOCS_LOGPROBS = "processed_logprobs"


@pytest.fixture(scope="module")
def foreign_server(request, tmp_path_factory):
    """A vLLM server teamtr did not start, as docs/scaling_out.md starts one on an inference
    node: the run's base folder, run-time LoRA loading, its key in ``VLLM_API_KEY`` in its
    environment (never on its command line), listening on 127.0.0.1 only, with the
    ``--logprobs-mode`` of the test's parameter (``processed_logprobs``, the docs'; another
    is what a server started by hand with one option wrong looks like). Parametrised
    indirectly: pytest stops one server before it starts the next, so one runs at a time.
    Yields its address and the config."""
    directory = tmp_path_factory.mktemp("foreign")
    config = write_config(directory)
    parts = build(load_config(config, [parse_override("sampler.engine=hf")]), progress=False)
    base = base_folder(parts.team.backbone.model, load_tokenizer("tiny:128x2"))
    port, key = free_port(), "the-foreign-servers-key"
    command = ServeCommand(
        model=str(base),
        served_name="base",
        host="127.0.0.1",
        port=port,
        dtype="float32",
        lora_rank=16,  # the docs' --max-lora-rank 16, above the team's 4
        max_loras=3,
        runtime_lora=True,
        key=key,
        logprobs_mode=request.param,
    )
    words = command.module_command(str(VLLM_PYTHON))
    assert key not in " ".join(words) and "--api-key" not in words
    env = {**os.environ, **command.environment(), "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    if is_cpu_build(VLLM_PYTHON):  # as a run's own server on this build: no worker process
        env.update(cpu_build_environment())
    address = ServerAddress(f"http://127.0.0.1:{port}", key)
    server = EngineServer(words, env, directory / "foreign.log", address)
    try:
        server.wait_ready(600, str(base))
        yield address, config
    finally:
        server.stop()


def train_at(config: Path, address, *settings: str, key: str | None = None, name: str = "probed"):
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    if key is not None:
        environment["TEAMTR_TEST_ENGINE_KEY"] = key
    overrides = ["sampler.temperature=0.7", f"sampler.engine_url={address.url}", *settings]
    return subprocess.run(
        [*TEAMTR, "train", "--config", str(config), "--name", name, "--no-progress"]
        + [word for setting in overrides for word in ("--set", setting)],
        capture_output=True,
        text=True,
        timeout=900,
        env=environment,
    )


KEY_VARIABLE = "sampler.engine_key_variable=TEAMTR_TEST_ENGINE_KEY"


def error_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("foreign_server", [DOCS_LOGPROBS], indirect=True)
def test_a_run_trains_against_a_keyed_server_it_did_not_start(foreign_server):
    """The remote path end to end: the task check, the probe (the key let in, the same request
    without it refused, agent 0's adapter loaded, its log-probs the trainer's), one stage whose
    every update checks the server's log-probs at float32's tolerance; the key in no output
    and no record; the server still running after, with none of the run's adapters left."""
    address, config = foreign_server
    paid = paid_config(config)
    result = train_at(paid, address, KEY_VARIABLE, key=address.key, name="trained")
    assert result.returncode == 0, result.stderr
    run_dir = paid.parent / "runs" / "trained"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    stages = [r for r in records if "updates" in r]
    assert len(stages) == 1 and len(stages[0]["updates"]) == 2
    checked = [u["mismatch"] for u in stages[0]["updates"]]
    assert all(m is not None and m["max_gap"] <= TOLERANCE for m in checked), checked
    written = "".join(
        f.read_text(errors="replace")
        for f in run_dir.rglob("*")
        if f.is_file() and f.suffix in (".json", ".jsonl", ".toml", ".log", ".txt")
    )
    assert address.key not in result.stderr + result.stdout + written
    served = address.request("GET", "/v1/models", timeout=60)["data"]
    assert [model["id"] for model in served] == ["base"]  # the run unloaded its adapters
    # The trained team plays in process, its config's server keys (the key's variable too) left
    # to the run.
    chat = subprocess.run(
        [*TEAMTR, "chat", "--run", str(run_dir), "--question", "Say two"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert chat.returncode == 0, chat.stderr


@pytest.mark.parametrize("foreign_server", [DOCS_LOGPROBS], indirect=True)
@pytest.mark.parametrize("given", ["no key", "a wrong key"])
def test_a_server_at_engine_url_that_refuses_the_key_is_one_error_line(foreign_server, given):
    address, config = foreign_server
    if given == "no key":  # no key variable named: the server refuses
        result = train_at(config, address)
        said = "refuses a request without a key"
    else:
        result = train_at(config, address, KEY_VARIABLE, key="not-the-key")
        said = "refuses the key in TEAMTR_TEST_ENGINE_KEY"
    errors = error_lines(result)
    assert result.returncode == 2 and len(errors) == 1, result.stderr
    assert said in errors[0] and "401" in errors[0]
    assert not (config.parent / "runs" / "probed").exists()


@pytest.mark.parametrize("foreign_server", ["raw_logprobs"], indirect=True)
def test_a_server_at_engine_url_with_another_logprobs_mode_is_named_before_training(
    foreign_server,
):
    """The key comes from the environment variable the config names; the probe finds the
    server's log-probs are at temperature 1 and says so, exit 2, before any stage."""
    address, config = foreign_server
    result = train_at(config, address, KEY_VARIABLE, key=address.key)
    errors = error_lines(result)
    assert result.returncode == 2 and len(errors) == 1, result.stderr
    assert "logprobs mode: its log-probs are at temperature 1" in errors[0]
    assert address.key not in result.stderr + result.stdout
    assert not (config.parent / "runs" / "probed").exists()
