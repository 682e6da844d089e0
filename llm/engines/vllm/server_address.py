"""Requests to a vLLM server: HTTP over a socket file (a server of the run's own) or TCP (one
at ``engine_url``), with the run's key, and what its ``/v1/models`` lists.
"""

from __future__ import annotations

import http.client
import json
import socket
import urllib.parse
from dataclasses import dataclass, field
from typing import Any


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


def served_models(models: Any) -> list[tuple[str, str]]:
    """(name, root) of every model a ``/v1/models`` answer lists (an adapter's root is its
    folder, the base's the folder or id it was started on)."""
    listed = models.get("data", []) if isinstance(models, dict) else []
    return [
        (str(model.get("id")), str(model.get("root") or model.get("id")))
        for model in listed
        if isinstance(model, dict)
    ]
