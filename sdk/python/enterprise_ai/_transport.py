"""HTTP transport on ``http.client`` with one keep-alive connection per thread."""

from __future__ import annotations

import contextlib
import http.client
import json
import select
import ssl
import threading
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any

from ._errors import APIConnectionError, EnterpriseAIError, error_from_response
from ._version import __version__

_RETRYABLE_STALE = (
    http.client.RemoteDisconnected,
    http.client.BadStatusLine,
    BrokenPipeError,
    ConnectionResetError,
    ConnectionAbortedError,
)


def _connection_dropped(conn: http.client.HTTPConnection) -> bool:
    """True if an idle keep-alive socket was closed by the peer (readable while idle)."""
    sock = conn.sock
    if sock is None:
        return True
    try:
        if hasattr(select, "poll"):  # select() refuses descriptors from 1024 up
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            return bool(poller.poll(0))
        readable, _, _ = select.select([sock], [], [], 0)  # Windows: no poll()
    except (OSError, ValueError):
        return True
    return bool(readable)


def backoff(retry_after: float | None, attempt: int, cap: float) -> float:
    """How long to wait before retry ``attempt`` (0-based): the server's Retry-After,
    else 0.25 s doubling, never more than ``cap``."""
    wait = retry_after if retry_after and retry_after > 0 else 0.25 * (2**attempt)
    return min(wait, cap)


class Transport:
    """Sends JSON requests and decodes JSON answers; raises typed errors on non-2xx.

    Each thread gets its own persistent ``HTTPConnection`` (stored in a
    ``threading.local``), so a client may be shared between threads. A connection the
    server closed while idle is replaced transparently; a request that failed on a reused
    connection before any response is retried once when it is safe (``GET``, or a
    request carrying an ``Idempotency-Key``).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 30.0,
        language: str | None = None,
        user_agent: str | None = None,
        max_retries: int = 2,
        max_backoff: float = 30.0,
    ) -> None:
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self.max_retries = max_retries
        self.max_backoff = max_backoff
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
        self.scheme = parsed.scheme
        self.host = parsed.hostname
        self.port = parsed.port
        self.base_path = parsed.path.rstrip("/")
        self.timeout = float(timeout)
        self.api_key = api_key
        self.language = language
        self.user_agent = user_agent or f"enterprise-ai-python/{__version__}"
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[http.client.HTTPConnection] = []
        self._ssl_context = ssl.create_default_context() if self.scheme == "https" else None

    # -- connections -------------------------------------------------------------------

    def _new_connection(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection
        if self.scheme == "https":
            conn = http.client.HTTPSConnection(
                self.host, self.port, timeout=self.timeout, context=self._ssl_context
            )
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        with self._lock:
            self._all.append(conn)
        return conn

    def _drop(self, conn: http.client.HTTPConnection) -> None:
        try:
            conn.close()
        finally:
            with self._lock:
                if conn in self._all:
                    self._all.remove(conn)
            if getattr(self._local, "conn", None) is conn:
                self._local.conn = None

    def _get_connection(self) -> tuple[http.client.HTTPConnection, bool]:
        """Return (connection, reused) for the current thread."""
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is not None and conn.sock is not None and not _connection_dropped(conn):
            return conn, True
        if conn is not None:
            self._drop(conn)
        conn = self._new_connection()
        self._local.conn = conn
        return conn, False

    def close(self) -> None:
        """Close every connection opened by this transport (all threads)."""
        with self._lock:
            conns, self._all = self._all, []
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.close()
        self._local = threading.local()

    # -- requests ----------------------------------------------------------------------

    def build_path(self, path: str, query: Mapping[str, Any] | None = None) -> str:
        full = f"{self.base_path}{path}"
        if query:
            items = []
            for key, value in query.items():
                if value is None:
                    continue
                if isinstance(value, bool):
                    value = "true" if value else "false"
                items.append((key, str(value)))
            if items:
                full += "?" + urllib.parse.urlencode(items)
        return full

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        raw_body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> tuple[int, Any]:
        """Send one request; return ``(status, decoded_json)`` for a 2xx answer.

        Raises a subclass of :class:`EnterpriseAIError` for any non-2xx answer and
        :class:`APIConnectionError` for network failures. A 429 or 503 answer is sent
        again after its ``Retry-After`` (at most ``max_retries`` times, each wait capped
        by ``max_backoff``), only when that is safe: ``GET``, or a request carrying an
        ``Idempotency-Key``.
        """
        safe = method in ("GET", "HEAD") or bool(headers and "Idempotency-Key" in headers)
        attempt = 0
        while True:
            try:
                return self._request_once(
                    method,
                    path,
                    query=query,
                    body=body,
                    raw_body=raw_body,
                    headers=headers,
                    timeout=timeout,
                )
            except EnterpriseAIError as exc:
                if not (safe and attempt < self.max_retries and exc.status in (429, 503)):
                    raise
                time.sleep(backoff(exc.retry_after, attempt, self.max_backoff))
                attempt += 1

    def _request_once(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        raw_body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> tuple[int, Any]:
        url = self.build_path(path, query)
        hdrs: dict[str, str] = {
            "Authorization": f"Bearer {self.api_key}",
            "Accept": "application/json",
            "User-Agent": self.user_agent,
        }
        if self.language:
            hdrs["Accept-Language"] = self.language
        payload: bytes | None = None
        if raw_body is not None:
            payload = raw_body
        elif body is not None:
            payload = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
            hdrs["Content-Type"] = "application/json"
        elif method in ("POST", "PUT", "PATCH"):
            payload = b""
        if headers:
            hdrs.update(headers)
        retry_safe = method in ("GET", "HEAD") or "Idempotency-Key" in hdrs
        effective_timeout = self.timeout if timeout is None else max(self.timeout, timeout)

        attempt = 0
        while True:
            attempt += 1
            conn, reused = self._get_connection()
            try:
                if conn.sock is not None:
                    conn.sock.settimeout(effective_timeout)
                conn.timeout = effective_timeout
                conn.request(method, url, body=payload, headers=hdrs)
                resp = conn.getresponse()
                raw = resp.read()
            except _RETRYABLE_STALE as exc:
                self._drop(conn)
                if reused and retry_safe and attempt == 1:
                    continue
                raise APIConnectionError(
                    f"connection to {self.host} failed: {exc!r}", code="connection_error"
                ) from exc
            except TimeoutError as exc:
                self._drop(conn)
                raise APIConnectionError(
                    f"request to {self.host} timed out after {effective_timeout}s",
                    code="timeout",
                ) from exc
            except (OSError, http.client.HTTPException) as exc:
                self._drop(conn)
                raise APIConnectionError(
                    f"connection to {self.host} failed: {exc!r}", code="connection_error"
                ) from exc
            break

        if resp.will_close:
            self._drop(conn)
        return self._decode(resp, raw)

    @staticmethod
    def _decode(resp: http.client.HTTPResponse, raw: bytes) -> tuple[int, Any]:
        status = resp.status
        text = raw.decode("utf-8", errors="replace")
        data: Any = None
        if text.strip():
            try:
                data = json.loads(text)
            except ValueError:
                data = None
        if 200 <= status < 300:
            if data is None and text.strip():
                raise EnterpriseAIError(
                    f"HTTP {status}: response is not JSON",
                    code="invalid_response",
                    status=status,
                    body=text,
                )
            return status, data if data is not None else {}
        raise error_from_response(status, data, text, resp.getheader("Retry-After"))
