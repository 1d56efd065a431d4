"""The gateway's MCP door (``POST /v1/mcp``) for Python MCP clients.

``endpoint(base_url)`` and ``headers(api_key)`` are all an MCP host needs (a URL and a
header); they need nothing beyond the standard library. ``connect()``, ``list_tools()``
and ``call_tool()`` drive the official MCP SDK's client and need the optional extra::

    pip install 'enterprise-ai[mcp]'

Example::

    from enterprise_ai import mcp

    tools = mcp.list_tools("http://127.0.0.1:8000", "eai_xxx_yyy")
    result = mcp.call_tool("http://127.0.0.1:8000", "eai_xxx_yyy", "jira_search",
                           {"q": "INC-42"}, run_id="run_01")
    result["structuredContent"]["status"]   # the invocation, as /v1 shows it

    async with mcp.connect("http://127.0.0.1:8000", "eai_xxx_yyy") as client:
        await client.list_tools()            # an ``mcp.Client``: the SDK's whole API

Calls go through the gateway's governance like ``/invoke`` calls (policy, DLP,
approvals, audit): a parked call is a normal result whose status is
``waiting_approval``; read its outcome with the ``eai_invocation_get`` tool.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

__all__ = ["MCPUnavailableError", "call_tool", "connect", "endpoint", "headers", "list_tools"]

PATH = "/v1/mcp"


class MCPUnavailableError(ImportError):
    """The official MCP SDK is not installed (``pip install 'enterprise-ai[mcp]'``)."""


def endpoint(base_url: str) -> str:
    """The gateway's MCP endpoint for `base_url` (``http://host:8000`` → ``…/v1/mcp``)."""
    base = base_url.rstrip("/")
    if base.endswith(PATH):
        return base
    if not urlsplit(base).scheme:
        raise ValueError(f"base_url must be an http(s) URL, not {base_url!r}")
    return base + PATH


def headers(api_key: str, *, language: str | None = None) -> dict[str, str]:
    """The headers an MCP client sends: the API key as a bearer token (and, optionally,
    the language of error messages, ``fr`` or ``en``)."""
    if not api_key or any(c in api_key for c in "\r\n"):
        raise ValueError("api_key must be a non-empty single-line string")
    out = {"Authorization": f"Bearer {api_key}"}
    if language:
        out["Accept-Language"] = language
    return out


def _sdk() -> tuple[Any, Any, Any]:
    try:
        import httpx2
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client
    except ImportError as exc:  # the base SDK keeps to the standard library
        raise MCPUnavailableError(
            "enterprise_ai.mcp needs the official MCP SDK for this: "
            "pip install 'enterprise-ai[mcp]'"
        ) from exc
    return Client, streamable_http_client, httpx2


@asynccontextmanager
async def connect(
    base_url: str,
    api_key: str,
    *,
    mode: str = "auto",
    language: str | None = None,
    timeout: float = 30.0,
) -> Any:
    """An entered ``mcp.Client`` on the gateway (``mode``: ``auto`` or ``legacy``)."""
    Client, streamable_http_client, httpx2 = _sdk()
    http = httpx2.AsyncClient(
        headers=headers(api_key, language=language), timeout=httpx2.Timeout(timeout)
    )
    async with http:
        transport = streamable_http_client(endpoint(base_url), http_client=http)
        async with Client(transport, mode=mode, cache=None) as client:
            yield client


def _plain(result: Any) -> Any:
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


def list_tools(base_url: str, api_key: str, **options: Any) -> list[dict[str, Any]]:
    """Every tool this key may call, as MCP tool objects (dicts), all pages."""

    async def run() -> list[dict[str, Any]]:
        tools: list[dict[str, Any]] = []
        async with connect(base_url, api_key, **options) as client:
            cursor = None
            for _page in range(1000):
                page = await client.list_tools(cursor=cursor)
                tools += [_plain(tool) for tool in page.tools]
                cursor = page.next_cursor
                if not cursor:
                    break
        return tools

    return asyncio.run(run())


def call_tool(
    base_url: str,
    api_key: str,
    name: str,
    arguments: dict[str, Any] | None = None,
    *,
    run_id: str | None = None,
    step_index: int | None = None,
    idempotency_key: str | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Call a tool; the MCP result as a dict (``structuredContent`` is the invocation,
    ``isError`` true when it was refused or failed)."""
    meta: dict[str, Any] = {}
    if run_id is not None:
        meta["eai/run_id"] = run_id
    if step_index is not None:
        meta["eai/step_index"] = step_index
    if idempotency_key is not None:
        meta["eai/idempotency_key"] = idempotency_key

    async def run() -> dict[str, Any]:
        async with connect(base_url, api_key, **options) as client:
            result = await client.call_tool(name, arguments or {}, meta=meta or None)
        return _plain(result)

    return asyncio.run(run())
