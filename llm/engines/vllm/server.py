"""A vLLM server process of the run's own: started behind its guard (``llm.engines.vllm.guard``:
the server never outlives teamtr, ``kill -9`` included) in temporary folders only its run owns,
waited for until it answers as the run's own server (its base, behind the run's key), and its
log read for the one ``error:`` line a fault prints. Where vLLM is installed:
``llm.engines.vllm.installation``; how requests reach the server:
``llm.engines.vllm.server_address``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llm.engines.protocol import EngineStartFailed
from llm.engines.vllm.server_address import ServerAddress, ServerRefused, served_models

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

    def wait_ready(
        self, timeout: float, base: str, check: Callable[[], None] = lambda: None
    ) -> None:
        """Wait until the server answers as the run's own: ``/v1/models`` asked with the run's
        key lists ``base`` (the folder it was started on), and the same request without the key
        is refused (``require_own_server``). ``check`` runs at every poll: what it raises
        stops the server and ends the wait."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                check()
            except Exception:
                self.stop()
                raise
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
