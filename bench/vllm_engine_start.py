"""A vLLM server's start on the CPU build, its engine core spawned (vLLM's CPU platform) or
forked from the API server (teamtr's plugin, ``TEAMTR_VLLM_ENGINE_CORE=fork``).

The server teamtr's engine starts for the smoke config's tiny team (its base written once as a
folder; float32, LoRA slots at run time, one thread), started ``--rounds`` times each way, the
two ways taking turns so that load on the machine hits them alike. For each start: the wall
seconds until it answers as the run's own (``EngineServer.wait_ready``), and the CPU seconds
its processes (the API server and its engine core, read from /proc) have spent by then.
Printed as medians and their ratio, fork over spawn; the same request's first tokens and
log-probs from both (a forked engine core must serve what a spawned one serves).

Usage: ``.venv/bin/python bench/vllm_engine_start.py [--rounds 3] [--json PATH]`` (needs
``make vllm``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from engine_throughput import cpu_name, group_cpu_seconds

from llm.common.config import load_config, parse_override
from llm.engines.vllm.command import ENGINE_CORE_ENVIRONMENT, ServeCommand
from llm.engines.vllm.installation import is_cpu_build, vllm_python
from llm.engines.vllm.server import EngineServer
from llm.engines.vllm.server_address import ServerAddress
from llm.models.base_folder import base_folder
from llm.models.loading import load_tokenizer
from llm.training.builder import build

STARTS = ("spawn", "fork")
REQUEST = {"model": "base", "prompt": "Count to three:", "max_tokens": 6, "temperature": 1.0}


def start_once(base: Path, start: str, folder: Path) -> dict[str, object]:
    """One server's start the ``start`` way: its seconds to ready, its CPU by then, and its
    answer to ``REQUEST`` (seeded)."""
    python = vllm_python()
    socket = folder / f"{start}-{time.monotonic_ns()}.sock"
    command = ServeCommand(
        model=str(base),
        served_name="base",
        socket_path=str(socket),
        dtype="float32",
        lora_rank=8,
        max_loras=3,
        runtime_lora=True,
        key="bench-key",
        max_model_len=512,
        cpu_build=is_cpu_build(python),
    )
    env = {**os.environ, **command.environment(), ENGINE_CORE_ENVIRONMENT: start}
    env.update({"OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"})
    env.update({"VLLM_CPU_OMP_THREADS_BIND": "nobind"})
    env.pop("PYTHONPATH", None)
    address = ServerAddress(f"unix:{socket}", "bench-key")
    clock = time.perf_counter()
    server = EngineServer(command.module_command(str(python)), env, folder / "engine.log", address)
    try:
        server.wait_ready(600, str(base))
        ready = time.perf_counter() - clock
        cpu = group_cpu_seconds(server.server_pid)
        answer = address.request(
            "POST", "/v1/completions", {**REQUEST, "seed": 3, "logprobs": 1}, timeout=120
        )["choices"][0]
    finally:
        server.stop()
    logprobs = answer["logprobs"]["token_logprobs"]
    return {"ready_seconds": ready, "cpu_seconds": cpu, "text": answer["text"], "logps": logprobs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    config = load_config("smoke", [parse_override("run.dtype=float32")])
    parts = build(config, progress=False)
    base = base_folder(parts.team.backbone.model, load_tokenizer(config.model.source))
    starts: dict[str, list[dict[str, object]]] = {start: [] for start in STARTS}
    with tempfile.TemporaryDirectory(prefix="start", dir="/tmp") as folder:
        for _ in range(args.rounds):
            for start in STARTS:
                starts[start].append(start_once(base, start, Path(folder)))
                print(start, {k: v for k, v in starts[start][-1].items() if k != "logps"})
    median = {
        start: {
            key: statistics.median(float(run[key]) for run in runs)  # type: ignore[arg-type]
            for key in ("ready_seconds", "cpu_seconds")
        }
        for start, runs in starts.items()
    }
    same = all(
        (run["text"], run["logps"]) == (starts["spawn"][0]["text"], starts["spawn"][0]["logps"])
        for runs in starts.values()
        for run in runs
    )
    summary = {
        "cpu": cpu_name(),
        "rounds": args.rounds,
        "median": median,
        "fork_over_spawn": {
            key: median["fork"][key] / median["spawn"][key] for key in median["fork"]
        },
        "same_answer": same,
        "starts": starts,
    }
    for start in STARTS:
        m = median[start]
        print(f"{start}: ready {m['ready_seconds']:.1f} s, {m['cpu_seconds']:.1f} CPU-s (median)")
    ratio = summary["fork_over_spawn"]
    print(
        f"fork / spawn: {ratio['ready_seconds']:.2f} of the wall to ready, "
        f"{ratio['cpu_seconds']:.2f} of the CPU; the same tokens and log-probs: {same}"
    )
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
