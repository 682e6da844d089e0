"""A vLLM server process: found (``make vllm`` builds ``.venv-vllm``; vLLM pins a transformers
older than teamtr's, so it runs from an environment of its own), started behind its guard
(``llm.engines.vllm.guard``: the server never outlives teamtr, ``kill -9`` included), waited
for, and its log read for the one ``error:`` line a fault prints.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from peft import PeftModel

from llm.engines.protocol import EngineStartFailed, EngineUnavailable

PYTHON_ENVIRONMENT = "TEAMTR_VLLM_PYTHON"
"""The Python of an environment with vLLM installed (default: ``.venv-vllm`` of the checkout)."""
START_TIMEOUT_ENVIRONMENT = "TEAMTR_ENGINE_START_SECONDS"
START_TIMEOUT = 900.0
"""How long a server may take to answer its health check (about 50 s for a tiny model on two
CPU threads; loading a 7B model on a GPU node can take minutes)."""
REQUEST_TIMEOUT = 1800.0
KV_CACHE_GIB = "1"
"""``VLLM_CPU_KVCACHE_SPACE`` unless set: on a CPU vLLM otherwise reserves most of the memory
for keys and values; 1 GiB holds thousands of SmolLM2-135M tokens."""
LOG_FOLDER_PREFIX = "teamtr-engine-"
"""The temporary folder of a server's log until the run directory exists."""
GUARD = Path(__file__).with_name("guard.py")


def vllm_python() -> Path:
    """The Python that runs the server, or ``EngineUnavailable`` saying how to install it."""
    chosen = os.environ.get(PYTHON_ENVIRONMENT)
    if chosen:
        candidates = [Path(chosen).expanduser()]
    else:
        checkout = Path(__file__).resolve().parents[3]  # llm/engines/vllm/ -> the checkout
        candidates = [checkout / ".venv-vllm" / "bin" / "python", Path(".venv-vllm/bin/python")]
    for python in candidates:
        if python.is_file() and _has_vllm(python):
            return python
    where = f"{PYTHON_ENVIRONMENT}={chosen}" if chosen else str(candidates[0].parents[1])
    raise EngineUnavailable(
        f'[sampler] engine = "vllm": no vLLM installed at {where}; run `make vllm` (or set '
        f"{PYTHON_ENVIRONMENT} to the python of an environment that has it, or use "
        'engine = "hf")'
    )


def _has_vllm(python: Path) -> bool:
    # find_spec, not import: importing vllm takes seconds; this takes a fraction of one.
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    try:
        return subprocess.run([str(python), "-c", probe], timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""The attention head sizes vLLM 0.32's CPU attention supports (``CPUAttentionBackend``); a
model with another fails at its first request, so it is refused before the server starts."""


def require_servable_heads(model: PeftModel, python: Path) -> None:
    config: Any = model.get_base_model().config
    heads = getattr(config, "num_attention_heads", None)
    size = getattr(config, "head_dim", None) or (config.hidden_size // heads if heads else None)
    if size is None or size in CPU_HEAD_SIZES or not is_cpu_build(python):
        return
    raise EngineUnavailable(
        f'[sampler] engine = "vllm": the model\'s attention heads have {size} dimensions; '
        f'vLLM\'s CPU attention supports {", ".join(map(str, CPU_HEAD_SIZES))} (the "tiny" '
        'test model has 8: "tiny:128x2" has 32)'
    )


def is_cpu_build(python: Path) -> bool:
    site = python.parent.parent / "lib"
    return any(site.glob("python3*/site-packages/vllm_cpu-*.dist-info"))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


ROOT_CAUSE = re.compile(r"\b([A-Z]\w*(?:Error|Exception)): (.+)")
WRAPPERS = ("EngineDeadError", "EngineGenerateError", "APIServerError")
"""vLLM's errors that only say another process failed first: the cause lies elsewhere."""


def last_error_line(log: Path) -> str:
    """The server's root cause: its first ``SomethingError: ...`` line that is not one of
    vLLM's wrappers (else its last line), for the one ``error:`` line teamtr prints."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines()]
    except OSError:
        return "no log"
    lines = [line for line in lines if line]
    for index, line in enumerate(lines):
        found = ROOT_CAUSE.search(line)
        if found and found[1] not in WRAPPERS and " WARNING " not in line:
            cause = found[0]
            following = lines[index + 1] if index + 1 < len(lines) else ""
            if following and not following.startswith(("(", "File ", "Traceback")):
                cause += f" {following}"  # pydantic's first line names only the class
            return cause[:300]
    return lines[-1][-300:] if lines else "an empty log"


class EngineServer:
    """A vLLM server process behind its guard, its log, its address."""

    def __init__(self, command: list[str], env: dict[str, str], log: Path, port: int) -> None:
        self.log = log
        self.url = f"http://127.0.0.1:{port}"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"# {shlex.join(command)}\n")
        self._guard = subprocess.Popen(
            [sys.executable, "-I", str(GUARD), str(log), "--", *command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        assert self._guard.stdout is not None
        line = self._guard.stdout.readline().strip()
        self.server_pid = int(line) if line.isdigit() else None
        """The server's pid, also the id of its process group (tests look for its survivors)."""
        atexit.register(self.stop)

    def exit_code(self) -> int | None:
        return self._guard.poll()

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code = self.exit_code()
            if code is not None:
                raise EngineStartFailed(
                    f'[sampler] engine = "vllm": the server stopped before it was ready (exit '
                    f"code {code}): "
                    f"{last_error_line(self.log)}; its log: {self.log}"
                )
            if healthy(self.url):
                return
            time.sleep(0.5)
        self.stop()
        raise EngineStartFailed(
            f'[sampler] engine = "vllm": the server did not answer its health check in '
            f"{timeout:.0f} s "
            f"({START_TIMEOUT_ENVIRONMENT} sets the limit); its log: {self.log}"
        )

    def move_log(self, destination: Path) -> None:
        """Put the log at ``destination`` (the server keeps writing to it: a rename keeps the
        file it writes to); where it cannot move (another file system), a link points at it."""
        if destination == self.log:
            return
        try:
            os.replace(self.log, destination)
            if self.log.parent.name.startswith(LOG_FOLDER_PREFIX):  # the temporary one
                with contextlib.suppress(OSError):
                    self.log.parent.rmdir()
            self.log = destination
        except OSError:
            with contextlib.suppress(OSError):
                destination.symlink_to(self.log)

    def stop(self) -> None:
        """Close the guard's pipe and wait until it has stopped the server's whole group."""
        guard = self._guard
        if guard.stdin is not None and not guard.stdin.closed:
            with contextlib.suppress(OSError):
                guard.stdin.close()
        try:
            guard.wait(timeout=60)
        except subprocess.TimeoutExpired:  # the guard itself is stuck: end it and the group
            if self.server_pid is not None:
                with contextlib.suppress(OSError):
                    os.killpg(self.server_pid, 9)
            guard.kill()
            guard.wait()
        if guard.stdout is not None:
            guard.stdout.close()
        atexit.unregister(self.stop)


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            return bool(response.status == 200)
    except (OSError, ValueError):
        return False
