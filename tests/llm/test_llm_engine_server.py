"""A run draws only from its own server (``llm.engines.vllm.server``), checked with stand-in
servers: real processes that answer HTTP on a socket file as vLLM's does (``/v1/models`` behind
a key, or not), so this runs without vLLM. The real server's refusal of a request without the
run's key is tested in tests/llm/test_llm_engine_vllm.py.

What is checked: ``EngineServer.wait_ready`` accepts a server that serves the run's base and
refuses requests without the run's key, and refuses one that answers without the key (anyone's
server, or one that lets everyone in) or serves another base; the key goes in the server's
environment, not on its command line or in its log; and the command line is the one
description the export renders too; and the probe of a server at ``engine_url`` names what
differs (logprobs mode, dtype or base) from log-probs a tiny model computes.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from llm.engines.protocol import EngineStartFailed
from llm.engines.vllm.command import ServeCommand
from llm.engines.vllm.completions import completion_body
from llm.engines.vllm.probe import check_served_policy, diagnose, trainer_logps
from llm.engines.vllm.server import EngineServer, remove_dead_owners_folders
from llm.engines.vllm.server_address import ServerAddress, ServerRefused
from llm.models.loading import load_model, load_tokenizer

REPO = Path(__file__).resolve().parents[2]
STAND_IN = textwrap.dedent(
    """
    import json, os, socketserver, sys
    from http.server import BaseHTTPRequestHandler
    path, root, demands_key = sys.argv[1], sys.argv[2], sys.argv[3] == "key"
    key = os.environ.get("VLLM_API_KEY")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if demands_key and self.headers.get("Authorization") != f"Bearer {key}":
                self.send_response(401)
                self.end_headers()
                self.wfile.write(b'{"error": "Unauthorized"}')
                return
            body = json.dumps({"data": [{"id": "base", "root": root}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def address_string(self):
            return "socket"

    class Server(socketserver.UnixStreamServer):
        def get_request(self):
            request, _ = super().get_request()
            return request, ("socket", 0)

    print("listening", flush=True)
    Server(path, Handler).serve_forever()
    """
)


def stand_in(tmp_path: Path, root: str, demands_key: bool, key: str = "the-runs-key"):
    """A stand-in server behind the guard, as the engine starts vLLM: its key in the
    environment, its socket in the run's folder."""
    socket_path = str(tmp_path / "engine.sock")
    command = [sys.executable, "-c", STAND_IN, socket_path, root, "key" if demands_key else "-"]
    address = ServerAddress(f"unix:{socket_path}", key)
    env = {**os.environ, "VLLM_API_KEY": key}
    return EngineServer(command, env, tmp_path / "engine.log", address)


def test_a_server_that_serves_the_base_behind_the_runs_key_is_ready(tmp_path):
    server = stand_in(tmp_path, "/cache/base-folder", demands_key=True)
    try:
        server.wait_ready(30, "/cache/base-folder")
        models = server.address.request("GET", "/v1/models", timeout=10)
        assert models["data"][0]["root"] == "/cache/base-folder"
        with pytest.raises(ServerRefused) as refused:
            server.address.request("GET", "/v1/models", timeout=10, keyed=False)
        assert refused.value.status == 401
    finally:
        server.stop()


def test_a_server_that_lets_in_requests_without_the_key_is_not_used(tmp_path):
    """Anyone's server where the run's should be (or one started without ``--api-key``)."""
    server = stand_in(tmp_path, "/cache/base-folder", demands_key=False)
    try:
        with pytest.raises(EngineStartFailed, match="does not refuse requests without"):
            server.wait_ready(30, "/cache/base-folder")
    finally:
        server.stop()


def test_a_server_of_another_base_is_not_used(tmp_path):
    server = stand_in(tmp_path, "/cache/another-base", demands_key=True)
    try:
        with pytest.raises(EngineStartFailed, match="not the run's base /cache/base-folder"):
            server.wait_ready(30, "/cache/base-folder")
    finally:
        server.stop()


def test_the_key_is_in_the_servers_environment_never_on_its_command_line():
    command = ServeCommand(
        model="/cache/base",
        dtype="float32",
        lora_rank=4,
        max_loras=3,
        runtime_lora=True,
        socket_path="/tmp/run/engine.sock",
        key="secret-key-of-the-run",
    )
    words = command.module_command("python")
    assert "secret-key-of-the-run" not in " ".join(words) + repr(command)
    assert "--api-key" not in words and words[words.index("--uds") + 1] == "/tmp/run/engine.sock"
    assert command.environment() == {
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1",
        "VLLM_API_KEY": "secret-key-of-the-run",
    }
    assert "secret-key-of-the-run" not in command.module_line()


def test_the_served_policy_is_the_trained_one_in_every_rendering():
    """The options that make a server's policy the trained one are in the engine's command
    and in the export's line alike (one description renders both)."""
    command = ServeCommand(
        model="./base",
        dtype="bfloat16",
        lora_rank=12,
        max_loras=2,
        lora_modules=(("agent0", "./agent0"), ("agent1", "./agent1")),
        extra_environment=(("VLLM_PLUGINS", "a_plugin"),),
    )
    for words in (
        command.module_command(),
        shlex.split(command.serve_line()),
        shlex.split(command.module_line({"VLLM_CPU_KVCACHE_SPACE": "4"})),
    ):
        assert words[words.index("--generation-config") + 1] == "vllm"
        assert words[words.index("--logprobs-mode") + 1] == "processed_logprobs"
        assert words[words.index("--max-lora-rank") + 1] == "16"  # the rank vLLM holds 12 in
        assert words[words.index("--dtype") + 1] == "bfloat16"
    line = shlex.split(command.module_line({"VLLM_CPU_KVCACHE_SPACE": "4"}))
    assert line[:2] == ["VLLM_CPU_KVCACHE_SPACE=4", "VLLM_PLUGINS=a_plugin"]
    assert command.environment() == {"VLLM_PLUGINS": "a_plugin"}


@pytest.fixture(scope="module")
def probe_logps():
    """The probe's tokens scored by a tiny model (the trainer), and as servers that are not
    its policy would return them: at temperature 1, in bfloat16, from another base."""
    tokenizer = load_tokenizer("tiny:128x2")
    model = load_model("tiny:128x2", vocab_size=len(tokenizer), seed=0)
    other = load_model("tiny:128x2", vocab_size=len(tokenizer), seed=1)
    half = load_model("tiny:128x2", vocab_size=len(tokenizer), seed=0, dtype=torch.bfloat16)
    prompt = list(range(5, 40))
    tokens = [int(t) for t in torch.randint(0, len(tokenizer), (8,), generator=SEEDED)]
    temperature = 0.7
    return {
        "trained": trainer_logps(model, prompt, tokens, temperature),
        "unscaled": trainer_logps(model, prompt, tokens, 1.0),
        "bfloat16": trainer_logps(half, prompt, tokens, temperature),
        "other base": trainer_logps(other, prompt, tokens, temperature),
        "logits": trainer_logps(model, prompt, tokens, temperature, normalised=False),
    }


SEEDED = torch.Generator().manual_seed(3)


@pytest.mark.parametrize(
    ("served", "cause"),
    [
        ("trained", None),
        ("unscaled", "logprobs mode: its log-probs are at temperature 1"),
        ("logits", "logprobs mode: it returns logits"),
        ("bfloat16", "dtype:"),
        ("other base", "base:"),
    ],
)
def test_the_probe_names_what_differs_between_a_server_and_the_trainer(probe_logps, served, cause):
    """``llm.engines.vllm.probe.diagnose`` on a float32 team: the trainer's own log-probs
    pass; each other server's is named by its cause (tiny:128x2's bfloat16 gap lies between
    ``MATCH_TOLERANCE`` and ``PRECISION_GAP``, another seed's far above)."""
    logps = probe_logps
    found = diagnose(
        logps[served], logps["trained"], logps["unscaled"], logps["logits"], half=False
    )
    if cause is None:
        assert found is None
    else:
        assert found is not None and found.startswith(cause), found


def test_every_request_asks_for_the_policy_as_the_trainer_computes_it():
    """A draw and a probe both ask for pure sampling (no top-k, top-p, min-p or penalty), end
    at the chat's stop token or their longest (no ``min_tokens``, which would mask the end of
    sequence before the softmax), and differ only where asked."""
    draw = completion_body("p0", (5, 6), 24, 0.7, seed=11, stop_id=2, logprobs=True)
    probe = completion_body("agent0", [5, 6], 8, 0.0)
    for body in (draw, probe):
        assert (body["top_p"], body["top_k"], body["min_p"], body["repetition_penalty"]) == (
            1.0,
            -1,
            0.0,
            1.0,
        )
        assert body["ignore_eos"] and body["return_token_ids"] and "min_tokens" not in body
        assert body["prompt"] == [5, 6]
    assert (draw["seed"], draw["stop_token_ids"], draw["logprobs"]) == (11, [2], 0)
    assert not {"seed", "stop_token_ids", "logprobs"} & set(probe)
    assert (probe["model"], probe["max_tokens"], probe["temperature"]) == ("agent0", 8, 0.0)


def wait_listening(address: ServerAddress, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            address.request("GET", "/v1/models", timeout=5)
            return
        except OSError:
            assert time.monotonic() < deadline, "the stand-in never listened"
            time.sleep(0.1)


def test_a_server_at_engine_url_that_lets_in_requests_without_the_key_is_refused(tmp_path):
    """A run that names a key for a server that does not ask for one (started without
    ``VLLM_API_KEY`` in its environment): the probe says so, before it loads any adapter."""
    server = stand_in(tmp_path, "/cache/base-folder", demands_key=False)
    loaded: list[str] = []

    def load_adapter() -> str:
        loaded.append("agent 0")
        return "agent0"

    try:
        wait_listening(server.address)
        with pytest.raises(EngineStartFailed, match="does not refuse requests without the key"):
            # Nothing past the key's check is reached: no team, chat or settings needed.
            check_served_policy(server.address, load_adapter, None, None, None, 4)  # type: ignore[arg-type]
        assert not loaded
    finally:
        server.stop()


OWNER = textwrap.dedent(
    """
    import sys, time
    from llm.engines.vllm.server import ADAPTER_FOLDER, LOG_FOLDER, SOCKET_FOLDER, owned_folder
    for kind in (SOCKET_FOLDER, ADAPTER_FOLDER, LOG_FOLDER):
        print(owned_folder(kind), flush=True)
    time.sleep(600)
    """
)


def test_a_dead_runs_folders_are_removed_and_a_live_runs_kept(tmp_path):
    """Two engines' owners make their folders (socket, adapters, log) in one temporary
    directory; one is ended by ``kill -9``, which no ``close`` survives. Another engine's
    clean-up removes the dead one's three folders and nothing else: the live one's stay, and
    so do folders of other names."""
    owners = [
        subprocess.Popen(
            [sys.executable, "-c", OWNER],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(REPO)},
        )
        for _ in range(2)
    ]
    try:
        made = [[Path(owner.stdout.readline().strip()) for _ in range(3)] for owner in owners]
        assert all(folder.is_dir() for folders in made for folder in folders), made
        other = tmp_path / "teamtr-launch-123-abc"  # another tool's, of a name alike
        other.mkdir()
        owners[0].kill()
        owners[0].wait(timeout=60)
        removed = remove_dead_owners_folders(tmp_path)
        assert sorted(removed) == sorted(made[0])
        assert not any(folder.exists() for folder in made[0])
        assert all(folder.is_dir() for folder in made[1]) and other.is_dir()
    finally:
        for owner in owners:
            owner.kill()
            owner.wait(timeout=60)
