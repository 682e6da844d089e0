"""The watcher between teamtr and an engine server it starts: the server never outlives teamtr.

Run as ``python guard.py LOG -- COMMAND...`` with a pipe on standard input whose other end only
teamtr holds. The guard starts COMMAND in a session of its own (so that Ctrl-C in the terminal
reaches teamtr, not the server, and the server's worker processes can be stopped as one group),
its output appended to LOG, then waits. When teamtr closes the pipe (``EngineServer.stop``) or
dies in any way at all, ``kill -9`` included, the kernel closes the pipe and the read returns:
the guard then stops the whole group (SIGTERM, then SIGKILL after a grace period) and exits.
A server that stops by itself ends the guard too (teamtr reads the exit code from the guard's).

The guard imports only the standard library, so it starts in a fraction of a second with any
Python, and it ignores SIGINT: a Ctrl-C sent to the terminal's process group must not end the
guard before it has stopped the server.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

GRACE_SECONDS = 10.0
"""How long the server's group has to exit after SIGTERM before it gets SIGKILL."""


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group, then SIGKILL whatever is left after the grace."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + GRACE_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None and not _group_alive(process.pid):
            return
        time.sleep(0.1)
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    process.wait()


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: guard.py LOG -- COMMAND...", file=sys.stderr)
        return 2
    log_path, command = argv[0], argv[2:]
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stopping = False

    def on_term(_number: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    with open(log_path, "ab", buffering=0) as log:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    # The server's pid is its group's id (a new session): teamtr reads it for its tests.
    sys.stdout.write(f"{process.pid}\n")
    sys.stdout.flush()
    watched = sys.stdin.fileno()
    while not stopping:
        readable, _, _ = select.select([watched], [], [], 0.5)
        if readable and not os.read(watched, 4096):  # EOF: teamtr closed the pipe or died
            break
        if process.poll() is not None:  # the server stopped by itself
            stop_group(process)  # its workers too
            return process.returncode if process.returncode >= 0 else 128 - process.returncode
    stop_group(process)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
