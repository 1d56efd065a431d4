"""The :class:`EnterpriseAI` client and its resource namespaces."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from typing import Any, Self

from ._transport import Transport

JSON = dict[str, Any]


def _seg(value: str) -> str:
    """URL-quote one path segment (dots kept, ``/`` and everything unsafe escaped)."""
    if not isinstance(value, str) or not value:
        raise ValueError("path identifiers must be non-empty strings")
    if value in (".", ".."):
        raise ValueError(f"invalid path identifier {value!r}")
    return urllib.parse.quote(value, safe="")


def _paginate(fetch: Any, filters: dict[str, Any]) -> Iterator[JSON]:
    cursor = filters.pop("cursor", None)
    seen: set[str] = set()
    while True:
        page = fetch(cursor=cursor, **filters)
        yield from page.get("results") or []
        cursor = page.get("next_cursor")
        if not cursor or cursor in seen or not page.get("results"):
            return
        seen.add(cursor)


class Tools:
    """Catalog and invocation of tools (``/v1/tools``)."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def invoke(
        self,
        name: str,
        input: JSON,
        *,
        run_id: str | None = None,
        step_index: int | None = None,
        idempotency_key: str | None = None,
        respond_async: bool = False,
    ) -> JSON:
        """Invoke tool ``name`` (``POST /v1/tools/{name}/invoke``).

        Sends ``{"input": ..., "run_id": ..., "step_index": ...}`` (``None`` fields
        omitted); ``idempotency_key`` travels as the ``Idempotency-Key`` header and
        ``respond_async=True`` sends ``Prefer: respond-async``.

        Returns the invocation dict for both 200 (``succeeded``) and 202
        (``waiting_approval`` with its ``approval_id``, ``queued`` or ``running``): a 202 is
        not an error; poll it with :meth:`Invocations.get` (``wait=``).

        Raises:
            ValidationError: 400 ``invalid_input`` (``details`` lists the violations).
            PermissionDeniedError: 403 ``policy_denied`` (with ``decision_id``) or
                ``dlp_blocked``.
            NotFoundError: 404 ``tool_not_found``.
            ConflictError: 409 ``idempotency_conflict`` / ``idempotency_in_progress``.
            RateLimitError: 429 ``rate_limited`` (``retry_after`` set).
            ToolError: 502 ``tool_error``/``invalid_output``, 504 ``tool_timeout``.
            UnavailableError: 503 ``tool_unavailable``/``audit_unavailable``.
        """
        body: JSON = {"input": input}
        if run_id is not None:
            body["run_id"] = run_id
        if step_index is not None:
            body["step_index"] = step_index
        headers: dict[str, str] = {}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        if respond_async:
            headers["Prefer"] = "respond-async"
        _, data = self._t.request(
            "POST", f"/v1/tools/{_seg(name)}/invoke", body=body, headers=headers
        )
        return data

    def list(self, limit: int | None = None, cursor: str | None = None) -> JSON:
        """One page of the catalog (``GET /v1/tools``): ``{"results", "next_cursor"}``."""
        _, data = self._t.request("GET", "/v1/tools", query={"limit": limit, "cursor": cursor})
        return data

    def iter(self, *, limit: int | None = None) -> Iterator[JSON]:
        """Iterate over the whole catalog, following ``next_cursor``."""
        return _paginate(self.list, {"limit": limit})

    def get(self, name: str) -> JSON:
        """One tool of the catalog (``GET /v1/tools/{name}``); 404 ``tool_not_found``."""
        _, data = self._t.request("GET", f"/v1/tools/{_seg(name)}")
        return data


class Invocations:
    """Tool invocations (``/v1/tools/invocations``)."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def get(self, invocation_id: str, wait: float | None = None) -> JSON:
        """One invocation (``GET /v1/tools/invocations/{id}``), 200 whatever its status.

        ``wait`` (seconds, the server caps it at 30) long-polls until a final status; the
        socket timeout is extended accordingly. Another tenant's id answers 404
        ``not_found``.
        """
        query: JSON = {}
        timeout: float | None = None
        if wait is not None:
            query["wait"] = int(wait) if float(wait).is_integer() else wait
            timeout = float(wait) + 10.0
        _, data = self._t.request(
            "GET", f"/v1/tools/invocations/{_seg(invocation_id)}", query=query, timeout=timeout
        )
        return data

    def list(
        self,
        *,
        status: str | None = None,
        tool: str | None = None,
        run_id: str | None = None,
        agent: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> JSON:
        """One page of invocations: ``{"results": [...], "next_cursor": str | None}``.

        ``limit`` defaults to 50 server-side and is clamped to 500.
        """
        query = {
            "status": status,
            "tool": tool,
            "run_id": run_id,
            "agent": agent,
            "limit": limit,
            "cursor": cursor,
        }
        _, data = self._t.request("GET", "/v1/tools/invocations", query=query)
        return data

    def iter(self, **filters: Any) -> Iterator[JSON]:
        """Iterate over every invocation matching ``filters`` (same keywords as
        :meth:`list`), fetching pages lazily by following ``next_cursor``."""
        return _paginate(self.list, dict(filters))

    def cancel(self, invocation_id: str) -> JSON:
        """Cancel a ``waiting_approval`` or ``queued`` invocation
        (``POST /v1/tools/invocations/{id}/cancel``); returns the invocation, whose status
        is then ``cancelled``. A final invocation answers 409."""
        _, data = self._t.request("POST", f"/v1/tools/invocations/{_seg(invocation_id)}/cancel")
        return data


class Decisions:
    """Policy decisions (``/v1/decisions``); needs scope ``audit:read``."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def get(self, decision_id: str) -> JSON:
        """One decision (``GET /v1/decisions/{id}``): result, obligations, policy version,
        input digest."""
        _, data = self._t.request("GET", f"/v1/decisions/{_seg(decision_id)}")
        return data


class EnterpriseAI:
    """Client of the EAI Tool Gateway.

    Args:
        base_url: server root, e.g. ``"http://127.0.0.1:8000"`` (``/v1`` is appended).
        api_key: ``eai_<id>_<secret>``, sent as ``Authorization: Bearer``.
        timeout: socket timeout in seconds for each request.
        language: ``"en"`` or ``"fr"``, sent as ``Accept-Language``; selects the language of
            error ``message`` (``message_i18n`` always carries both).

    The client keeps one keep-alive connection per thread and is safe to share between
    threads. Use it as a context manager or call :meth:`close` to release connections.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        timeout: float = 30.0,
        language: str | None = None,
    ) -> None:
        self._transport = Transport(base_url, api_key, timeout=timeout, language=language)
        self.base_url = base_url
        self.tools = Tools(self._transport)
        self.invocations = Invocations(self._transport)
        self.decisions = Decisions(self._transport)

    def close(self) -> None:
        """Close the client's connections."""
        self._transport.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EnterpriseAI(base_url={self.base_url!r})"
