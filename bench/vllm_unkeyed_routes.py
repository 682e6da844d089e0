"""Which routes of a vLLM server started with a key answer a request without it.

The server is started as docs/scaling_out.md starts one on an inference node: the key in
``VLLM_API_KEY`` in its environment, run-time LoRA loading, 127.0.0.1, on the tiny model's base
folder (``tiny:128x2``). Every route its ``/openapi.json`` lists is asked once without the key
(GET as it is; POST with a body: a completion for ``/invocations`` and ``/tokenize``, an
empty one elsewhere; routes that would stop, pause or scale the server are not sent); then an
adapter is registered through ``/adapters`` and drawn from through ``/invocations``, and
unregistered through ``DELETE /adapters/{name}``, all without the key. Prints one JSON object:
each route's status (401 = refused; anything else = it answered without the key) and what
the adapter steps did.

    OMP_NUM_THREADS=1 .venv/bin/python bench/vllm_unkeyed_routes.py --json results/vllm_unkeyed_routes.json
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from llm.common.config import RunConfig
from llm.engines.vllm.command import ServeCommand
from llm.engines.vllm.installation import vllm_python
from llm.models.adapter_folder import write_adapter
from llm.models.base_folder import base_folder
from llm.models.loading import load_tokenizer
from llm.training.builder import build, configured

NOT_SENT = {"/sleep", "/wake_up", "/pause", "/resume", "/scale_elastic_ep", "/collective_rpc"}
"""Routes whose request would change the server's state beyond an adapter (not sent)."""


def ask(port: int, method: str, path: str, body: object = None) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    data = None if body is None else json.dumps(body)
    connection.request(method, path, body=data, headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    return response.status, response.read().decode(errors="replace")[:200]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the statuses here too")
    args = parser.parse_args()
    config = configured(RunConfig(), {"source": "tiny:128x2", "rank": 4, "dtype": "float32"})
    parts = build(config, progress=False)
    model = parts.team.backbone.model
    base = base_folder(model, load_tokenizer("tiny:128x2"))
    with socket.socket() as probe:  # a port no process listens on now
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    key = "the-servers-key"
    command = ServeCommand(
        model=str(base),
        served_name="base",
        host="127.0.0.1",
        port=port,
        dtype="float32",
        lora_rank=16,
        max_loras=3,
        runtime_lora=True,
        key=key,
    )
    env = {**os.environ, **command.environment(), "VLLM_CPU_KVCACHE_SPACE": "1"}
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    env.pop("PYTHONPATH", None)
    work = Path(tempfile.mkdtemp(prefix="unkeyed-routes-"))
    with (work / "server.log").open("w") as log:
        server = subprocess.Popen(
            command.module_command(str(vllm_python())),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        while not _answers_health(port):
            if server.poll() is not None:
                sys.exit(f"the server stopped: {(work / 'server.log').read_text()[-2000:]}")
            time.sleep(1)
        completion = {"model": "base", "prompt": "hi", "max_tokens": 1}
        routes: dict[str, int] = {"GET /openapi.json": ask(port, "GET", "/openapi.json")[0]}
        spec = json.loads(_full(port, "/openapi.json"))
        for path, methods in sorted(spec["paths"].items()):
            for method in sorted(methods):
                verb = method.upper()
                if path in NOT_SENT or verb not in ("GET", "POST", "DELETE"):
                    continue
                body = None
                if verb == "POST":
                    body = completion if path in ("/invocations", "/tokenize") else {}
                routes[f"{verb} {path}"] = ask(port, verb, path, body)[0]
        folder = work / "stranger"
        write_adapter(folder, model, 0, parts.team.agent(0))
        registered = ask(port, "POST", "/adapters", {"name": "stranger", "src": str(folder)})
        listed = _full(port, "/v1/models", key)  # /v1: asked with the key
        drawn = ask(port, "POST", "/invocations", {**completion, "model": "stranger"})
        unregistered = ask(port, "DELETE", "/adapters/stranger")
        after = _full(port, "/v1/models", key)
        report = {
            "vllm": ask(port, "GET", "/version")[1],
            "answered_without_key": {r: s for r, s in routes.items() if s != 401},
            "refused_without_key": sorted(r for r, s in routes.items() if s == 401),
            "adapter_registered_without_key": registered[0],
            "adapter_listed_after": "stranger" in listed,
            "drawn_from_it_without_key": drawn[0],
            "adapter_unregistered_without_key": unregistered[0],
            "adapter_listed_after_delete": "stranger" in after,
        }
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


def _answers_health(port: int) -> bool:
    try:
        return ask(port, "GET", "/health")[0] == 200
    except (OSError, http.client.HTTPException):  # not listening yet, or not answering yet
        return False


def _full(port: int, path: str, key: str | None = None) -> str:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    connection.request("GET", path, headers=headers)
    return connection.getresponse().read().decode(errors="replace")


if __name__ == "__main__":
    main()
