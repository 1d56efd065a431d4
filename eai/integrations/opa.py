"""Open Policy Agent over its REST data API (used when EAI_OPA_URL is set).

`POST {EAI_OPA_URL}/v1/data/eai/tool/decision` with `{"input": …}` answers
`{"result": {...}}`. The policy version recorded with each decision is "opa:" plus
the decision's `policy_version` field when the server's policy sets one.

The whole exchange (connect, request, status line, headers, body) must end within
EAI_OPA_TIMEOUT_S, which is the decision's budget with OPA: a socket timeout alone
bounds each read, so a server answering a byte at a time held a call for as long as it
liked. Each read here gets what is left of the deadline, and past it the call fails
(the gateway then denies). Connections are kept alive per thread.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings


class OpaError(Exception):
    """OPA could not be asked in time or gave no decision (the gateway then denies)."""


class _Deadline:
    """Gives each socket operation what is left until `at`."""

    at = float("inf")

    def _left(self) -> float:
        left = self.at - time.monotonic()
        if left <= 0:
            raise TimeoutError("OPA did not answer within its deadline")
        return left

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        self.settimeout(self._left())
        return super().recv_into(buffer, nbytes, flags)

    def sendall(self, data: Any, flags: int = 0) -> None:
        self.settimeout(self._left())
        return super().sendall(data, flags)


class _DeadlineSocket(_Deadline, socket.socket):
    pass


class _DeadlineSSLSocket(_Deadline, ssl.SSLSocket):
    pass


class _Connection(http.client.HTTPConnection):
    def connect(self) -> None:
        raw = socket.create_connection((self.host, self.port), self.timeout)
        sock = _DeadlineSocket(raw.family, raw.type, raw.proto, fileno=raw.detach())
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = self._wrap(sock)

    def _wrap(self, sock: socket.socket) -> socket.socket:
        return sock


class _TLSConnection(_Connection):
    default_port = http.client.HTTPS_PORT
    _context = ssl.create_default_context()
    _context.sslsocket_class = _DeadlineSSLSocket

    def _wrap(self, sock: socket.socket) -> socket.socket:
        sock.at = time.monotonic() + (self.timeout or 30)
        return self._context.wrap_socket(sock, server_hostname=self.host)


_local = threading.local()


def _connection(url: str) -> _Connection:
    parts = urlsplit(url)
    key = (parts.scheme, parts.hostname, parts.port)
    connections = getattr(_local, "connections", None)
    if connections is None:
        connections = _local.connections = {}
    conn = connections.get(key)
    if conn is None:
        kind = _TLSConnection if parts.scheme == "https" else _Connection
        conn = connections[key] = kind(parts.hostname, parts.port, timeout=5)
    return conn


def _request(method: str, url: str, body: bytes | None, timeout: float) -> tuple[int, bytes]:
    """The status and body of one exchange, all of it within `timeout` seconds."""
    conn = _connection(url)
    deadline = time.monotonic() + timeout
    conn.timeout = timeout
    try:
        if conn.sock is None:
            conn.connect()
        conn.sock.at = deadline
        path = urlsplit(url).path
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()
        if response.will_close:
            conn.close()
        return response.status, data
    except (OSError, http.client.HTTPException) as exc:
        conn.close()  # a half-read answer must not be read as the next one's
        raise OpaError(f"OPA unreachable: {exc.__class__.__name__}") from exc
    finally:
        if conn.sock is not None:
            conn.sock.at = float("inf")


def evaluate(path: str, document: dict[str, Any]) -> dict[str, Any]:
    """The result at `data.<path>` (slash-separated) for `input = document`."""
    url = f"{settings.EAI_OPA_URL.rstrip('/')}/v1/data/{path}"
    status, data = _request(
        "POST", url, json.dumps({"input": document}).encode(), settings.EAI_OPA_TIMEOUT_S
    )
    if status != 200:
        raise OpaError(f"OPA answered HTTP {status}")
    try:
        result = json.loads(data)["result"]
    except (ValueError, KeyError, TypeError) as exc:
        raise OpaError("OPA gave no result for the decision") from exc
    if not isinstance(result, dict):
        raise OpaError("OPA's decision is not an object")
    return result


def healthy() -> bool:
    try:
        status, _data = _request("GET", f"{settings.EAI_OPA_URL.rstrip('/')}/health", None, 1.0)
    except OpaError:
        return False
    return status == 200
