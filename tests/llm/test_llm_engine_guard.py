"""The guard between teamtr and an engine server (``llm.engines.vllm.guard``), with a plain
process group standing in for the server: it needs no vLLM, so it runs everywhere. The same
guard is tested with the real server in tests/llm/test_llm_engine_vllm.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from llm_test_support import group_alive, wait_gone

from llm.engines.vllm.server import GUARD, EngineServer, last_error_line
from llm.engines.vllm.server_address import ServerAddress

# A "server" that starts a worker of its own, as vLLM does: both must go.
NOWHERE = ServerAddress("unix:/nonexistent/engine.sock")
"""The stand-in servers of the guard's tests listen nowhere: only their processes count."""
SERVER = [
    sys.executable,
    "-c",
    "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
    "'import time; time.sleep(600)']); print('ready', flush=True); time.sleep(600)",
]


def test_closing_the_pipe_stops_the_servers_whole_group(tmp_path):
    server = EngineServer(SERVER, dict(os.environ), tmp_path / "engine.log", NOWHERE)
    assert server.server_pid is not None
    time.sleep(1)  # the worker has started
    assert group_alive(server.server_pid)
    server.stop()
    assert not group_alive(server.server_pid)
    assert "ready" in (tmp_path / "engine.log").read_text()


def test_a_killed_owner_leaves_no_server(tmp_path):
    """teamtr killed with SIGKILL runs no cleanup at all: the kernel closes its end of the
    pipe, and the guard stops the server."""
    owner = textwrap.dedent(
        f"""
        import os, sys, time
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from pathlib import Path
        from llm.engines.vllm.server import EngineServer
        from llm.engines.vllm.server_address import ServerAddress
        log = Path({str(tmp_path / "e.log")!r})
        server = EngineServer({SERVER!r}, dict(os.environ), log, ServerAddress("unix:/none"))
        print(server.server_pid, flush=True)
        time.sleep(600)
        """
    )
    process = subprocess.Popen([sys.executable, "-c", owner], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    group = int(process.stdout.readline())
    time.sleep(1)
    assert group_alive(group)
    process.kill()
    process.wait()
    assert wait_gone(group), "the server outlived its owner"


def test_ctrl_c_reaches_the_guard_but_does_not_end_it(tmp_path):
    server = EngineServer(SERVER, dict(os.environ), tmp_path / "engine.log", NOWHERE)
    assert server.server_pid is not None
    server._guard.send_signal(signal.SIGINT)  # the terminal's Ctrl-C reaches its group
    time.sleep(1)
    assert server.exit_code() is None and group_alive(server.server_pid)
    server.stop()
    assert not group_alive(server.server_pid)


def test_a_server_that_exits_ends_the_guard_with_its_code(tmp_path):
    failing = [sys.executable, "-c", "raise SystemExit(3)"]
    server = EngineServer(failing, dict(os.environ), tmp_path / "engine.log", NOWHERE)
    deadline = time.monotonic() + 30
    while server.exit_code() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.exit_code() == 3
    server.stop()


def test_the_root_cause_is_the_first_error_that_is_not_a_wrapper(tmp_path):
    log = tmp_path / "engine.log"
    log.write_text(
        "(APIServer pid=1) WARNING ulimit: OSError: [Errno 24] Too many open files\n"
        "(Worker pid=2) ERROR RuntimeError: Unsupported CPU attention configuration: head_dim=8\n"
        "(APIServer pid=1) ERROR vllm.v1.engine.exceptions.EngineDeadError: see above\n"
    )
    assert last_error_line(log) == (
        "RuntimeError: Unsupported CPU attention configuration: head_dim=8"
    )
    assert GUARD.is_file()
