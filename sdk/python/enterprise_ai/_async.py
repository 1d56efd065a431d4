"""The asynchronous client, :class:`AsyncEnterpriseAI`, on httpx's ``AsyncClient``.

The same surface as :class:`enterprise_ai.EnterpriseAI`, every method awaitable;
``iter`` methods are asynchronous iterators. Install with ``pip install
'enterprise-ai[async]'`` (httpx).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Self

from ._client import (
    JSON,
    MAX_WAIT_S,
    PENDING,
    Approvals,
    Call,
    Events,
    Invocations,
    Tools,
    _Base,
)
from ._errors import APIConnectionError, EnterpriseAIError, error_from_response
from ._transport import backoff
from ._version import __version__

try:
    import httpx
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError("AsyncEnterpriseAI needs httpx: pip install 'enterprise-ai[async]'") from exc


async def _apaginate(fetch: Callable[..., Any], filters: dict[str, Any]) -> AsyncIterator[JSON]:
    cursor = filters.pop("cursor", None)
    seen: set[str] = set()
    while True:
        page = await fetch(cursor=cursor, **filters)
        for row in page.get("results") or []:
            yield row
        cursor = page.get("next_cursor")
        if not cursor or cursor in seen or not page.get("results"):
            return
        seen.add(cursor)


class AsyncTools(Tools):
    def iter(self, *, limit: int | None = None) -> AsyncIterator[JSON]:  # type: ignore[override]
        return _apaginate(self.list, {"limit": limit})


class AsyncInvocations(Invocations):
    async def wait(self, invocation_id: str, timeout: float = 60.0) -> JSON:  # type: ignore[override]
        """Long-poll until the status is final or ``timeout`` seconds have passed."""
        deadline = time.monotonic() + timeout
        while True:
            left = int(min(MAX_WAIT_S, deadline - time.monotonic()))
            invocation = await self.get(invocation_id, wait=left if left >= 1 else None)
            if invocation.get("status") not in PENDING or deadline - time.monotonic() < 1:
                return invocation
            if left < 1:
                await asyncio.sleep(0.25)

    def iter(self, **filters: Any) -> AsyncIterator[JSON]:  # type: ignore[override]
        return _apaginate(self.list, dict(filters))


class AsyncEvents(Events):
    def iter(self, **filters: Any) -> AsyncIterator[JSON]:  # type: ignore[override]
        return _apaginate(self.list, dict(filters))


class AsyncApprovals(Approvals):
    def iter(self, **filters: Any) -> AsyncIterator[JSON]:  # type: ignore[override]
        return _apaginate(self.list, dict(filters))


class AsyncEnterpriseAI(_Base):
    """Asynchronous client of the EAI Tool Gateway (same arguments as
    :class:`EnterpriseAI`, plus ``http_client`` for an ``httpx.AsyncClient`` of yours).

    Use ``async with AsyncEnterpriseAI(...) as client:`` or ``await client.aclose()``.
    """

    _tools_class = AsyncTools
    _invocations_class = AsyncInvocations
    _events_class = AsyncEvents
    _approvals_class = AsyncApprovals

    def __init__(
        self,
        base_url: str,
        api_key: str,
        timeout: float = 30.0,
        language: str | None = None,
        *,
        max_retries: int = 2,
        max_backoff: float = 30.0,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        parsed = httpx.URL(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self.base_url = base_url
        self._root = base_url.rstrip("/")
        self._api_key = api_key
        self._timeout = float(timeout)
        self._language = language
        self._max_retries = max_retries
        self._max_backoff = max_backoff
        self._owns_client = http_client is None
        self._http = http_client or httpx.AsyncClient(timeout=self._timeout)
        self._mount(self._send, retries=max_retries > 0)

    async def _send(self, call: Call) -> Any:
        headers = {
            "Authorization": f"Bearer {self._api_key}",
            "Accept": "application/json",
            "User-Agent": f"enterprise-ai-python-async/{__version__}",
        }
        if self._language:
            headers["Accept-Language"] = self._language
        content: bytes | None = None
        if call.raw_body is not None:
            content = call.raw_body
            headers["Content-Type"] = call.content_type or "application/octet-stream"
        elif call.body is not None:
            content = json.dumps(call.body, separators=(",", ":"), ensure_ascii=False).encode()
            headers["Content-Type"] = "application/json"
        headers.update(call.headers or {})
        params = {
            k: ("true" if v is True else "false" if v is False else str(v))
            for k, v in (call.query or {}).items()
            if v is not None
        }
        safe = call.method in ("GET", "HEAD") or "Idempotency-Key" in headers
        timeout = self._timeout if call.timeout is None else max(self._timeout, call.timeout)
        attempt = 0
        while True:
            try:
                response = await self._http.request(
                    call.method,
                    self._root + call.path,
                    params=params,
                    content=content,
                    headers=headers,
                    timeout=timeout,
                )
            except httpx.TimeoutException as exc:
                raise APIConnectionError(
                    f"request timed out after {timeout}s", code="timeout"
                ) from exc
            except httpx.HTTPError as exc:
                raise APIConnectionError(
                    f"connection failed: {exc!r}", code="connection_error"
                ) from exc
            try:
                return self._decode(response)
            except EnterpriseAIError as exc:
                if not (safe and attempt < self._max_retries and exc.status in (429, 503)):
                    raise
                await asyncio.sleep(backoff(exc.retry_after, attempt, self._max_backoff))
                attempt += 1

    @staticmethod
    def _decode(response: httpx.Response) -> Any:
        text = response.text
        data: Any = None
        if text.strip():
            try:
                data = json.loads(text)
            except ValueError:
                data = None
        if 200 <= response.status_code < 300:
            if data is None and text.strip():
                raise EnterpriseAIError(
                    f"HTTP {response.status_code}: response is not JSON",
                    code="invalid_response",
                    status=response.status_code,
                    body=text,
                )
            return data if data is not None else {}
        raise error_from_response(
            response.status_code, data, text, response.headers.get("Retry-After")
        )

    async def aclose(self) -> None:
        """Close the client's connections (not those of an ``http_client`` you gave)."""
        if self._owns_client:
            await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"AsyncEnterpriseAI(base_url={self.base_url!r})"


__all__ = ["AsyncEnterpriseAI"]
