"""The gateway as an MCP client: `endpoint: {type: mcp}` tools, definition pins, discovery.

The official SDK's client (`mcp.Client`) is async. Request threads are not: they hand
each call to ONE event-loop thread per process (started lazily, and again in a forked
child, whose copy of the parent's loop thread does not run) and wait for its result. On
that loop, one pooled `httpx2.AsyncClient` per upstream origin keeps the connections; a
fresh `Client` per call negotiates the protocol era (`auto`: `server/discover`, falling
back to `initialize` on handshake-era servers) and carries this call's headers (the
leased credential per `spec.credential_injection` and `traceparent`, never the agent's
key). The headers travel in a context variable read by the pooled client's request
hook: the SDK offers no per-call headers, and a client per call would lose the pool.

stdio MCP servers are never started here (a process per request thread would be slow
and unbounded): run them behind a stdio→HTTP bridge and register its URL (README).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import hashlib
import http.cookiejar
import logging
import os
import socket
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import rfc8785
from django.utils.translation import gettext_lazy as _

from eai.errors import Text

logger = logging.getLogger(__name__)
# httpx2 logs every request at INFO, URL included: an upstream's address is not news.
logging.getLogger("httpx2").setLevel(logging.WARNING)

T = TypeVar("T")

# What a pin covers: the parts of a tool's definition that tell a model what it does.
DEFINITION_FIELDS = ("name", "description", "inputSchema", "outputSchema", "annotations")
MAX_ORIGINS = 256  # pooled clients kept per process; the oldest is closed past this
MAX_LIST_PAGES = 50  # a paginating server that never ends cannot hang apply or re-sync


class MCPCallError(Exception):
    """An MCP upstream failure: `code` is the invocation error code, `status` its status."""

    def __init__(self, code: str, reason: Any, *, status: str = "failed") -> None:
        self.code = code
        self.reason = reason
        self.status = status
        super().__init__(f"{code}: {reason}")


def unreachable() -> MCPCallError:
    return MCPCallError(
        "tool_unavailable",
        Text(_("the tool's MCP server could not be reached")),
        status="unavailable",
    )


def timed_out() -> MCPCallError:
    return MCPCallError("tool_timeout", "timeout", status="timed_out")


# --- the loop thread -------------------------------------------------------------------


class _Loop:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid: int | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        # origin -> pooled client, used (and closed) on the loop only
        self.clients: OrderedDict[tuple[str, str, int], Any] = OrderedDict()

    def get(self) -> asyncio.AbstractEventLoop:
        pid = os.getpid()
        if self.pid == pid and self.loop is not None:
            return self.loop
        with self.lock:
            if self.pid != pid or self.loop is None:
                # A forked child inherits the parent's loop object but not its thread:
                # start a new one, and leave the parent's pooled clients untouched.
                loop = asyncio.new_event_loop()
                started = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(started.set)
                    loop.run_forever()

                threading.Thread(target=run, name="mcp-client-loop", daemon=True).start()
                started.wait(5)
                self.clients = OrderedDict()
                self.loop = loop
                self.pid = pid
        return self.loop

    def forget(self) -> None:
        """In a forked child: the parent's loop thread is not running here, and a lock
        another parent thread held at the fork would stay held forever."""
        self.lock = threading.Lock()
        self.pid = None
        self.loop = None
        self.clients = OrderedDict()


_LOOP = _Loop()
os.register_at_fork(after_in_child=_LOOP.forget)


def run(factory: Callable[[], Awaitable[T]], timeout_s: float) -> T:
    """Run `factory()` on this process's MCP loop and wait for it, at most `timeout_s`
    (the coroutine bounds itself too; this is the request thread's own guard)."""
    loop = _LOOP.get()
    future = asyncio.run_coroutine_threadsafe(_call_with_context(factory), loop)
    try:
        return future.result(timeout=timeout_s + 1.0)
    except concurrent.futures.TimeoutError as exc:
        future.cancel()
        raise timed_out() from exc


async def _call_with_context(factory: Callable[[], Awaitable[T]]) -> T:
    return await factory()


# --- pooled HTTP clients and per-call headers ------------------------------------------

_CALL_HEADERS: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "eai_mcp_call_headers", default=None
)


async def _inject_headers(request: Any) -> None:
    """The pooled client's request hook: this call's headers, on every request the
    SDK sends for it (discover or initialize, initialized, the call itself)."""
    for name, value in (_CALL_HEADERS.get() or {}).items():
        request.headers[name] = value


def _bounded_transport(inner: Any) -> Any:
    """`inner` with every answer body bounded as an http tool's is (the SDK reads a JSON
    answer whole): past the bound the read fails as a broken stream, which the SDK turns
    into a JSON-RPC error, so a hostile upstream cannot exhaust memory."""
    import httpx2
    from django.conf import settings

    class BoundedStream(httpx2.AsyncByteStream):
        def __init__(self, stream: Any, limit: int) -> None:
            self.stream = stream
            self.limit = limit

        async def __aiter__(self) -> Any:
            size = 0
            async for chunk in self.stream:
                size += len(chunk)
                if size > self.limit:
                    raise httpx2.StreamError("the upstream answer is too large")
                yield chunk

        async def aclose(self) -> None:
            await self.stream.aclose()

    class BoundedTransport(httpx2.AsyncBaseTransport):
        async def handle_async_request(self, request: Any) -> Any:
            response = await inner.handle_async_request(request)
            limit = settings.EAI_MAX_RESULT_BYTES * 64
            response.stream = BoundedStream(response.stream, limit)
            return response

        async def aclose(self) -> None:
            await inner.aclose()

    return BoundedTransport()


class ForbiddenAddress(OSError):
    """The upstream's name resolved, when connecting, to an address the guard refuses."""


def _vetting_backend(inner: Any) -> Any:
    """`inner` (httpcore's network backend) connecting only to addresses checked at that
    moment: the name is resolved once per connection, every answer is checked by the
    address guard (`endpoints.forbidden_address`) and the connection goes to those very
    addresses. A name that answered a harmless address to `vet()` and rebinds to the
    metadata address before the SDK connects reaches nothing (an http tool connects to
    `vet()`'s own addresses; the SDK's client resolves on its own, so it is checked here).
    The URL's host stays the Host header and the TLS server name."""
    import ipaddress

    import anyio
    import httpcore2

    from gateway.endpoints import forbidden_address

    class VettingBackend(httpcore2.AsyncNetworkBackend):
        async def connect_tcp(
            self,
            host: str,
            port: int,
            timeout: float | None = None,
            local_address: str | None = None,
            socket_options: Any = None,
        ) -> Any:
            try:
                infos = await anyio.getaddrinfo(
                    host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
                )
            except OSError as exc:
                raise httpcore2.ConnectError(str(exc)) from exc
            addresses = []
            for info in infos:
                address = str(info[4][0])
                if forbidden_address(ipaddress.ip_address(address.split("%")[0])):
                    raise ForbiddenAddress(
                        f"{host} resolves to a link-local or cloud metadata address"
                    )
                if address not in addresses:
                    addresses.append(address)
            failure: Exception = httpcore2.ConnectError(f"{host} has no address")
            for address in addresses:
                try:
                    return await inner.connect_tcp(
                        address,
                        port,
                        timeout=timeout,
                        local_address=local_address,
                        socket_options=socket_options,
                    )
                except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as exc:
                    failure = exc
            raise failure

        async def connect_unix_socket(self, *args: Any, **kwargs: Any) -> Any:
            return await inner.connect_unix_socket(*args, **kwargs)

        async def sleep(self, seconds: float) -> None:
            await inner.sleep(seconds)

    return VettingBackend()


def _origin(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or (443 if scheme == "https" else 80)


def _pooled(url: str) -> Any:
    """The long-lived client of `url`'s origin (called on the loop)."""
    import httpx2

    key = _origin(url)
    client = _LOOP.clients.get(key)
    if client is not None:
        _LOOP.clients.move_to_end(key)
        return client
    transport = httpx2.AsyncHTTPTransport(
        limits=httpx2.Limits(max_connections=64, max_keepalive_connections=16),
        # Headers and body leave in two writes: without TCP_NODELAY the body waits
        # for the delayed ACK, measured at ~20 ms a request on loopback (2 ms with).
        socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
    )
    # httpx takes no network backend: its pool's is wrapped (httpx2 and httpcore2 are
    # pinned; tests/test_dns_rebinding.py fails if this stops taking effect).
    pool = transport._pool  # noqa: SLF001
    pool._network_backend = _vetting_backend(pool._network_backend)  # noqa: SLF001
    client = httpx2.AsyncClient(
        event_hooks={"request": [_inject_headers]},
        # The client is shared by every tenant's calls to this origin: a cookie one
        # upstream answer sets must never ride along on another call. The jar keeps none.
        cookies=http.cookiejar.CookieJar(http.cookiejar.DefaultCookiePolicy(allowed_domains=[])),
        # Proxies from the environment are not consulted: the address guard checked
        # the upstream's own address, and a lease must not go through a third party.
        trust_env=False,
        timeout=httpx2.Timeout(30.0, read=300.0),
        transport=_bounded_transport(transport),
    )
    _LOOP.clients[key] = client
    while len(_LOOP.clients) > MAX_ORIGINS:
        _old_key, old = _LOOP.clients.popitem(last=False)
        asyncio.get_running_loop().create_task(old.aclose())
    return client


# The era each server spoke last, per URL: `("legacy", None)` or `(version, its
# DiscoverResult)`, so the next call skips the `server/discover` probe (a round trip, and
# one a handshake-era server refuses). Forgotten on any failure: the next call probes.
_ERAS: dict[str, tuple[str, Any]] = {}
MAX_ERAS = 4096


def _client(url: str) -> Any:
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp_types import Implementation

    mode, discovered = _ERAS.get(url, ("auto", None))
    return Client(
        streamable_http_client(url, http_client=_pooled(url)),
        mode=mode,
        prior_discover=discovered,
        cache=None,  # a definition is read fresh: a pin check must see today's answer
        client_info=Implementation(name="eai-gateway", version="1"),
    )


def _remember_era(url: str, client: Any) -> None:
    if url in _ERAS:
        return
    if len(_ERAS) >= MAX_ERAS:
        _ERAS.clear()
    session = client.session
    if session.discover_result is not None:
        _ERAS[url] = (client.protocol_version, session.discover_result)
    elif session.initialize_result is not None:
        _ERAS[url] = ("legacy", None)


async def _session(url: str, headers: dict[str, str], timeout_s: float, body: Callable) -> Any:
    """Open a Client on `url` with `headers` and run `body(client)`, all within
    `timeout_s`; SDK and transport failures become MCPCallError."""
    import anyio
    from mcp.shared.exceptions import MCPError

    token = _CALL_HEADERS.set(dict(headers))
    try:
        with anyio.fail_after(timeout_s):
            async with _client(url) as client:
                result = await body(client)
                _remember_era(url, client)
                return result
    except TimeoutError as exc:
        _ERAS.pop(url, None)
        raise timed_out() from exc
    except MCPCallError:
        raise
    except MCPError as exc:
        _ERAS.pop(url, None)
        raise MCPCallError(
            "tool_error",
            Text(_("the MCP server answered error %(code)s"), code=exc.code),
        ) from exc
    except BaseException as exc:  # ExceptionGroup from task groups, httpx2 errors, ...
        _ERAS.pop(url, None)
        if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
            raise
        error = _from_exception(exc)
        if error is None:
            raise
        raise error from exc
    finally:
        _CALL_HEADERS.reset(token)


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        found: list[BaseException] = []
        for inner in exc.exceptions:
            found += _leaves(inner)
        return found
    return [exc]


def _from_exception(exc: BaseException) -> MCPCallError | None:
    """What a failure of the SDK or its transport means for the invocation."""
    import httpx2
    from mcp.shared.exceptions import MCPError
    from pydantic import ValidationError

    for leaf in _leaves(exc):
        cause: BaseException | None = leaf
        while cause is not None:  # httpx wraps what the network backend raised
            if isinstance(cause, ForbiddenAddress):
                return MCPCallError("endpoint_forbidden", str(cause), status="denied")
            cause = cause.__cause__ or cause.__context__
        if isinstance(leaf, TimeoutError | httpx2.TimeoutException):
            return timed_out()
        if isinstance(leaf, MCPError):
            return MCPCallError(
                "tool_error", Text(_("the MCP server answered error %(code)s"), code=leaf.code)
            )
        if isinstance(leaf, httpx2.TransportError | OSError):
            return unreachable()
        if isinstance(leaf, ValidationError):
            return MCPCallError(
                "invalid_output", Text(_("the MCP server's answer is not a valid MCP result"))
            )
        if isinstance(leaf, RuntimeError) and "structured content" in str(leaf):
            return MCPCallError(
                "invalid_output",
                Text(_("the MCP server's result does not match the tool's reviewed outputSchema")),
            )
    logger.warning("MCP upstream failure: %r", exc)
    return unreachable() if isinstance(exc, Exception) else None


# --- calls -----------------------------------------------------------------------------


def call_tool(
    endpoint: dict[str, Any],
    arguments: dict[str, Any],
    *,
    headers: dict[str, str],
    output_schema: dict[str, Any] | None = None,
) -> Any:
    """Call `endpoint["tool"]` with `arguments`; return the invocation output."""
    timeout_s = endpoint.get("timeout_ms", 30000) / 1000
    url, name = endpoint["url"], endpoint["tool"]

    async def body(client: Any) -> Any:
        # Validate structuredContent against the REVIEWED outputSchema (the pinned
        # definition), not a fresh listing: no tools/list round trip per call, and a
        # changed upstream schema cannot loosen the check.
        client.session._tool_output_schemas[name] = output_schema
        return await client.call_tool(name, arguments, read_timeout_seconds=timeout_s)

    result = run(lambda: _session(url, headers, timeout_s, body), timeout_s)
    return output_of(result)


def output_of(result: Any) -> Any:
    """A CallToolResult as `output`: structuredContent; else the JSON a single text block
    holds; else `{"content": [...]}`. isError → tool_error."""
    import json

    if result.is_error:
        raise MCPCallError("tool_error", Text(_("the MCP tool reported an error")))
    if result.structured_content is not None:
        return result.structured_content
    content = [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in result.content]
    if len(content) == 1 and content[0].get("type") == "text":
        try:
            return json.loads(content[0].get("text", ""))
        except ValueError:
            pass
        except RecursionError as exc:  # "[[[[…" 5,000 deep: refused as http answers are
            raise MCPCallError(
                "invalid_output", Text(_("the upstream answer is nested too deep"))
            ) from exc
    return {"content": content}


def definition_of(tool: Any) -> dict[str, Any]:
    """The pinned part of a listed tool (absent fields are left out)."""
    dumped = tool.model_dump(mode="json", by_alias=True, exclude_none=True)
    return {field: dumped[field] for field in DEFINITION_FIELDS if field in dumped}


def definition_digest(definition: dict[str, Any]) -> str:
    """`sha256:` of the definition's RFC 8785 canonical JSON. A definition RFC 8785
    cannot write (an integer beyond 2^53, NaN) has no digest: MCPCallError."""
    try:
        return "sha256:" + hashlib.sha256(rfc8785.dumps(definition)).hexdigest()
    except rfc8785.CanonicalizationError as exc:
        raise MCPCallError("invalid_output", UNCANONICAL) from exc


UNCANONICAL = (
    "its definition holds a number RFC 8785 cannot write (an integer beyond 2^53, NaN or "
    "Infinity), so it cannot be pinned"
)


def list_definitions(
    url: str, *, headers: dict[str, str] | None = None, timeout_s: float = 10.0
) -> list[dict[str, Any]]:
    """Every tool's definition on the server at `url` (all pages)."""

    async def body(client: Any) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        cursor = None
        for _page in range(MAX_LIST_PAGES):
            page = await client.list_tools(cursor=cursor)
            found += [definition_of(tool) for tool in page.tools]
            cursor = page.next_cursor
            if not cursor:
                break
        return found

    return run(lambda: _session(url, headers or {}, timeout_s, body), timeout_s)


def read_definition(
    url: str, tool: str, *, headers: dict[str, str] | None = None, timeout_s: float = 10.0
) -> dict[str, Any] | None:
    """The definition of `tool` on the server at `url`, or None when it has no such tool."""
    for definition in list_definitions(url, headers=headers, timeout_s=timeout_s):
        if definition.get("name") == tool:
            return definition
    return None
