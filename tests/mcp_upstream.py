"""An upstream MCP server for `mcp` endpoint tests: the official SDK's own server
(`MCPServer`, stateless) under uvicorn on a free loopback port, in a thread.

`legacy=True` makes it answer `server/discover` as a handshake-era server does (method
not found), so the gateway's client falls back to `initialize`; `json_response=False`
answers in SSE. Every request's headers and JSON-RPC method are recorded in `.seen`.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Annotated, Any

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

CUSTOMER = {
    "customer_id": "C42",
    "name": "Camille Martin",
    "iban": "FR76 3000 6000 0112 3456 7890 189",
}


def build_server(*, odd: bool = False) -> MCPServer:
    server = MCPServer("crm-upstream")

    if odd:  # a schema with a number RFC 8785 cannot write: no digest, no pin

        @server.tool(description="Counts far", structured_output=False)
        def far(n: Annotated[int, Field(le=2**60)]) -> str:
            return str(n)

    @server.tool(description="Look a customer up", structured_output=True)
    def lookup(customer_id: str) -> dict[str, Any]:
        return {**CUSTOMER, "customer_id": customer_id}

    @server.tool(
        description="Answer the headers it was sent, as JSON text", structured_output=False
    )
    def whoami(ctx: Context) -> str:
        request = ctx.request_context.request
        return json.dumps(dict(request.headers) if request is not None else {})

    @server.tool(description="Always fails", structured_output=False)
    def fail() -> str:
        raise ToolError("the CRM is down")

    @server.tool(description="Sleeps", structured_output=False)
    async def slow(seconds: float) -> str:
        import anyio

        await anyio.sleep(seconds)
        return "late"

    @server.tool(description="Plain words", structured_output=False)
    def words() -> str:
        return "not json at all"

    @server.tool(description="Answers JSON nested too deep", structured_output=False)
    def deep(levels: int) -> str:
        return "[" * levels + "]" * levels

    return server


class Recorder:
    """ASGI wrapper: records each POST's headers and method; optionally plays a
    handshake-era server that does not know `server/discover`."""

    def __init__(self, app: Any, *, legacy: bool) -> None:
        self.app = app
        self.legacy = legacy
        self.seen: list[dict[str, Any]] = []

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        try:
            parsed = json.loads(body) if body else None
            method = parsed.get("method")
        except (ValueError, AttributeError):
            parsed, method = None, None
        self.seen.append({"method": method, "headers": headers, "body": parsed})
        if self.legacy and method == "server/discover":
            reply = json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": json.loads(body).get("id"),
                    "error": {"code": -32601, "message": "Method not found"},
                }
            ).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": reply})
            return
        sent = False

        async def with_cookie(message: dict) -> None:
            # Every answer sets a cookie: the gateway's shared client must never send one.
            if message["type"] == "http.response.start":
                message = {
                    **message,
                    "headers": [
                        *message.get("headers", []),
                        (b"set-cookie", b"sid=someone; Path=/"),
                    ],
                }
            await send(message)

        async def replay() -> dict:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, with_cookie)


class Upstream:
    def __init__(
        self,
        *,
        legacy: bool = False,
        json_response: bool = True,
        path: str = "/mcp",
        odd: bool = False,
        stateless: bool = True,
        any_host: bool = False,
    ) -> None:
        self.mcp = build_server(odd=odd)
        app = self.mcp.streamable_http_app(
            stateless_http=stateless,
            json_response=json_response,
            streamable_http_path=path,
            # The SDK refuses a Host header other than loopback's unless told it serves
            # elsewhere (`any_host`: a test name that resolves to loopback).
            host="0.0.0.0" if any_host else "127.0.0.1",  # noqa: S104 - bound to loopback
        )
        self.recorder = Recorder(app, legacy=legacy)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.url = self.base_url + path
        self.server = uvicorn.Server(
            uvicorn.Config(self.recorder, log_level="warning", lifespan="on")
        )
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.01)

    @property
    def seen(self) -> list[dict[str, Any]]:
        return self.recorder.seen

    def calls(self, tool: str | None = None) -> list[dict[str, Any]]:
        return [s for s in self.seen if s["method"] == "tools/call"]

    def redescribe(self, name: str, description: str) -> None:
        """Change a tool's description (the rug pull a pin must catch)."""
        self.mcp._tool_manager._tools[name].description = description

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
