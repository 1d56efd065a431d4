"""The :class:`EnterpriseAI` client and its resource namespaces.

Each namespace method builds one request and hands it to the client's ``send``; the
synchronous client's ``send`` returns the decoded answer, the asynchronous client's
(:class:`enterprise_ai.AsyncEnterpriseAI`) returns an awaitable of it. Only the calls that
take several requests (``iter``, ``wait``) have an asynchronous version of their own.
"""

from __future__ import annotations

import secrets
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple, Self

from ._transport import Transport

JSON = dict[str, Any]
PENDING = ("waiting_approval", "queued", "running")
MAX_WAIT_S = 30


class Call(NamedTuple):
    """One request, as the namespaces describe it to a transport."""

    method: str
    path: str
    query: Mapping[str, Any] | None = None
    body: Any = None
    headers: Mapping[str, str] | None = None
    timeout: float | None = None
    raw_body: bytes | None = None
    content_type: str | None = None


Send = Callable[[Call], Any]


def new_idempotency_key() -> str:
    """A fresh random ``Idempotency-Key``."""
    return "sdk-py-" + secrets.token_hex(16)


def _seg(value: str) -> str:
    """URL-quote one path segment (dots kept, ``/`` and everything unsafe escaped)."""
    if not isinstance(value, str) or not value:
        raise ValueError("path identifiers must be non-empty strings")
    if value in (".", ".."):
        raise ValueError(f"invalid path identifier {value!r}")
    return urllib.parse.quote(value, safe="")


def _paginate(fetch: Callable[..., JSON], filters: dict[str, Any]) -> Iterator[JSON]:
    cursor = filters.pop("cursor", None)
    seen: set[str] = set()
    while True:
        page = fetch(cursor=cursor, **filters)
        yield from page.get("results") or []
        cursor = page.get("next_cursor")
        if not cursor or cursor in seen or not page.get("results"):
            return
        seen.add(cursor)


class _Namespace:
    def __init__(self, send: Send, *, retries: bool = True) -> None:
        self._send = send
        self._retries = retries


class Tools(_Namespace):
    """Catalog and invocation of tools (``/v1/tools``)."""

    def invoke(
        self,
        name: str,
        input: JSON | None = None,
        *,
        arguments: JSON | None = None,
        run_id: str | None = None,
        step_index: int | None = None,
        idempotency_key: str | None = None,
        respond_async: bool = False,
        traceparent: str | None = None,
    ) -> JSON:
        """Invoke tool ``name`` (``POST /v1/tools/{name}/invoke``).

        ``input`` (or ``arguments=``, the same thing) is the tool's input. Returns the
        invocation for both 200 (``succeeded``) and 202 (``waiting_approval`` with its
        ``approval_id``, ``queued`` or ``running``): a 202 is not an error; wait for it
        with :meth:`Invocations.wait`. Without ``idempotency_key`` one is generated, so a
        429 or 503 is retried without ever running the call twice.

        Raises:
            ValidationError: 400 ``invalid_input`` (``details`` lists the violations).
            PermissionDeniedError: 403 ``policy_denied`` (with ``decision_id``),
                ``dlp_blocked``, ``budget_exceeded``.
            NotFoundError: 404 ``tool_not_found``.
            ConflictError: 409 ``idempotency_conflict`` / ``idempotency_in_progress``.
            RateLimitError: 429 ``rate_limited`` (``retry_after`` set), once retries
                are spent.
            ToolError: 502 ``tool_error``/``invalid_output``, 504 ``tool_timeout``.
            UnavailableError: 503 ``tool_unavailable``/``audit_unavailable``.
        """
        if input is not None and arguments is not None:
            raise ValueError("give input or arguments, not both")
        body: JSON = {"input": input if input is not None else (arguments or {})}
        if run_id is not None:
            body["run_id"] = run_id
        if step_index is not None:
            body["step_index"] = step_index
        headers: dict[str, str] = {}
        if idempotency_key is None and self._retries:
            idempotency_key = new_idempotency_key()
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        if respond_async:
            headers["Prefer"] = "respond-async"
        if traceparent:
            headers["traceparent"] = traceparent
        return self._send(
            Call("POST", f"/v1/tools/{_seg(name)}/invoke", body=body, headers=headers)
        )

    def list(self, limit: int | None = None, cursor: str | None = None) -> JSON:
        """One page of the catalog (``GET /v1/tools``): ``{"results", "next_cursor"}``."""
        return self._send(Call("GET", "/v1/tools", query={"limit": limit, "cursor": cursor}))

    def iter(self, *, limit: int | None = None) -> Iterator[JSON]:
        """Iterate over the whole catalog, following ``next_cursor``."""
        return _paginate(self.list, {"limit": limit})

    def get(self, name: str) -> JSON:
        """One tool of the catalog (``GET /v1/tools/{name}``); 404 ``tool_not_found``."""
        return self._send(Call("GET", f"/v1/tools/{_seg(name)}"))


class Invocations(_Namespace):
    """Tool invocations (``/v1/tools/invocations``)."""

    def get(self, invocation_id: str, wait: float | None = None) -> JSON:
        """One invocation (``GET /v1/tools/invocations/{id}``), 200 whatever its status.

        ``wait`` (seconds, at most 30) long-polls until a final status. Another tenant's
        id answers 404 ``not_found``.
        """
        query: JSON = {}
        timeout: float | None = None
        if wait is not None:
            query["wait"] = int(wait) if float(wait).is_integer() else wait
            timeout = float(wait) + 10.0
        return self._send(
            Call(
                "GET",
                f"/v1/tools/invocations/{_seg(invocation_id)}",
                query=query,
                timeout=timeout,
            )
        )

    def wait(self, invocation_id: str, timeout: float = 60.0) -> JSON:
        """Long-poll an invocation until its status is final or ``timeout`` seconds have
        passed; return it as it then is (its ``status`` may still be pending)."""
        deadline = time.monotonic() + timeout
        while True:
            left = int(min(MAX_WAIT_S, deadline - time.monotonic()))
            invocation = self.get(invocation_id, wait=left if left >= 1 else None)
            if invocation.get("status") not in PENDING or deadline - time.monotonic() < 1:
                return invocation
            if left < 1:
                time.sleep(0.25)

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
        """One page of invocations: ``{"results": [...], "next_cursor": str | None}``."""
        query = {
            "status": status,
            "tool": tool,
            "run_id": run_id,
            "agent": agent,
            "limit": limit,
            "cursor": cursor,
        }
        return self._send(Call("GET", "/v1/tools/invocations", query=query))

    def iter(self, **filters: Any) -> Iterator[JSON]:
        """Iterate over every invocation matching ``filters`` (same keywords as
        :meth:`list`), fetching pages lazily by following ``next_cursor``."""
        return _paginate(self.list, dict(filters))

    def cancel(self, invocation_id: str) -> JSON:
        """Cancel a ``waiting_approval`` or ``queued`` invocation; returns the invocation
        (status ``cancelled``). A final invocation answers 409."""
        return self._send(
            Call("POST", f"/v1/tools/invocations/{_seg(invocation_id)}/cancel", body={})
        )


class Runs(_Namespace):
    """Agent turns (``/v1/runs``)."""

    def create(self, run_id: str | None = None, *, goal: str | None = None) -> JSON:
        """Start a run (``POST /v1/runs``); without ``run_id`` the gateway picks one."""
        body: JSON = {}
        if run_id is not None:
            body["run_id"] = run_id
        if goal is not None:
            body["goal"] = goal
        return self._send(Call("POST", "/v1/runs", body=body))

    def get(self, run_id: str) -> JSON:
        """One run (``GET /v1/runs/{id}``)."""
        return self._send(Call("GET", f"/v1/runs/{_seg(run_id)}"))

    def resume(self, run_id: str) -> JSON:
        """Re-read a run's state after a human decision and publish its outcome."""
        return self._send(Call("POST", f"/v1/runs/{_seg(run_id)}/resume", body={}))


class Events(_Namespace):
    """The tenant's event feed (``/v1/events``)."""

    def list(
        self,
        *,
        cursor: str | int | None = None,
        run_id: str | None = None,
        limit: int | None = None,
    ) -> JSON:
        """Events with a sequence after ``cursor``, in increasing order."""
        query = {"cursor": cursor, "run_id": run_id, "limit": limit}
        return self._send(Call("GET", "/v1/events", query=query))

    def iter(self, **filters: Any) -> Iterator[JSON]:
        """Every event after ``cursor`` up to the feed's current end."""
        return _paginate(self.list, dict(filters))


class Approvals(_Namespace):
    """Approval requests: the reviewers' side (a staff reviewer's key)."""

    def list(
        self,
        *,
        status: str | None = None,
        tool: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> JSON:
        """One page of approval requests (``GET /v1/approvals``)."""
        query = {"status": status, "tool": tool, "limit": limit, "cursor": cursor}
        return self._send(Call("GET", "/v1/approvals", query=query))

    def iter(self, **filters: Any) -> Iterator[JSON]:
        return _paginate(self.list, dict(filters))

    def decide(self, approval_id: str, verdict: str, reason: str) -> JSON:
        """``verdict`` is ``"approve"`` or ``"deny"``; ``reason`` is mandatory."""
        return self._send(
            Call(
                "POST",
                f"/v1/approvals/{_seg(approval_id)}/decision",
                body={"verdict": verdict, "reason": reason},
            )
        )


class Decisions(_Namespace):
    """Policy decisions (``/v1/decisions``); needs scope ``audit:read``."""

    def get(self, decision_id: str) -> JSON:
        """One decision: result, obligations, policy version, input digest."""
        return self._send(Call("GET", f"/v1/decisions/{_seg(decision_id)}"))


class Manifests(_Namespace):
    """Tool and policy manifests (``/v1/manifests/apply``), all or nothing."""

    def apply(self, manifests: JSON | list[JSON] | str, *, dry_run: bool = False) -> JSON:
        """Apply one manifest, a list of them, or YAML text. ``dry_run`` changes nothing
        and returns what would change (``results[].status`` and ``diff``)."""
        query = {"dry_run": "true"} if dry_run else None
        if isinstance(manifests, str):
            return self._send(
                Call(
                    "POST",
                    "/v1/manifests/apply",
                    query=query,
                    raw_body=manifests.encode(),
                    content_type="application/yaml",
                )
            )
        body = {"manifests": manifests} if isinstance(manifests, list) else manifests
        return self._send(Call("POST", "/v1/manifests/apply", query=query, body=body))

    def dry_run(self, manifests: JSON | list[JSON] | str) -> JSON:
        return self.apply(manifests, dry_run=True)


class Contracts(_Namespace):
    """The JSON Schemas of manifests (``/v1/contracts``)."""

    def get(self, name: str) -> JSON:
        return self._send(Call("GET", f"/v1/contracts/{_seg(name)}"))

    def validate(self, name: str, document: Any) -> JSON:
        """``{"valid": bool, "errors": [{"path", "message"}]}``."""
        return self._send(Call("POST", f"/v1/contracts/{_seg(name)}/validate", body=document))


class Usage(_Namespace):
    """FinOps usage (``/v1/finops/usage``)."""

    def report(self, usage: JSON | list[JSON]) -> JSON:
        return self._send(Call("POST", "/v1/finops/usage", body=usage))

    def get(
        self, *, group_by: str | None = None, from_: str | None = None, to: str | None = None
    ) -> JSON:
        """Aggregates, grouped by ``tool``, ``agent`` or ``run`` over a time range."""
        query = {"group_by": group_by, "from": from_, "to": to}
        return self._send(Call("GET", "/v1/finops/usage", query=query))


class Audit(_Namespace):
    """The tenant's hash-chained audit log (``/v1/audit``)."""

    def events(self, *, limit: int | None = None, cursor: str | None = None) -> JSON:
        return self._send(Call("GET", "/v1/audit/events", query={"limit": limit, "cursor": cursor}))

    def verify(self) -> JSON:
        """``{"valid", "length", "head_hash", "first_invalid_seq", …}``."""
        return self._send(Call("GET", "/v1/audit/verify"))


class _Base:
    def _mount(self, send: Send, retries: bool) -> None:
        self.tools = self._tools_class(send, retries=retries)
        self.invocations = self._invocations_class(send, retries=retries)
        self.runs = Runs(send, retries=retries)
        self.events = self._events_class(send, retries=retries)
        self.approvals = self._approvals_class(send, retries=retries)
        self.decisions = Decisions(send, retries=retries)
        self.manifests = Manifests(send, retries=retries)
        self.contracts = Contracts(send, retries=retries)
        self.usage = Usage(send, retries=retries)
        self.audit = Audit(send, retries=retries)

    _tools_class: type = Tools
    _invocations_class: type = Invocations
    _events_class: type = Events
    _approvals_class: type = Approvals

    @property
    def mcp_url(self) -> str:
        """The URL an MCP client uses for this gateway (``POST /v1/mcp``)."""
        return self.base_url.rstrip("/") + "/v1/mcp"

    def mcp_headers(self) -> dict[str, str]:
        """The headers an MCP client sends with every request."""
        return {"Authorization": f"Bearer {self._api_key}"}


class EnterpriseAI(_Base):
    """Client of the EAI Tool Gateway.

    Args:
        base_url: server root, e.g. ``"http://127.0.0.1:8000"`` (``/v1`` is appended).
        api_key: ``eai_<id>_<secret>``, sent as ``Authorization: Bearer``.
        timeout: socket timeout in seconds for each request.
        language: ``"en"`` or ``"fr"``, sent as ``Accept-Language``; selects the language of
            error ``message`` (``message_i18n`` always carries both).
        max_retries: how many times a 429 or 503 is retried after its ``Retry-After``
            (reads, and writes carrying an idempotency key only); 0 turns retries off.
        max_backoff: the longest wait before a retry, in seconds.

    The client keeps one keep-alive connection per thread and is safe to share between
    threads. Use it as a context manager or call :meth:`close` to release connections.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        timeout: float = 30.0,
        language: str | None = None,
        *,
        max_retries: int = 2,
        max_backoff: float = 30.0,
    ) -> None:
        self._transport = Transport(
            base_url,
            api_key,
            timeout=timeout,
            language=language,
            max_retries=max_retries,
            max_backoff=max_backoff,
        )
        self.base_url = base_url
        self._api_key = api_key
        self._mount(self._send, retries=max_retries > 0)

    def _send(self, call: Call) -> Any:
        headers = dict(call.headers or {})
        if call.raw_body is not None:
            headers["Content-Type"] = call.content_type or "application/octet-stream"
        _, data = self._transport.request(
            call.method,
            call.path,
            query=call.query,
            body=call.body,
            raw_body=call.raw_body,
            headers=headers,
            timeout=call.timeout,
        )
        return data

    def close(self) -> None:
        """Close the client's connections."""
        self._transport.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EnterpriseAI(base_url={self.base_url!r})"
