"""The bench's upstream: a tiny ASGI app that answers POST with the JSON body it got.

Served by uvicorn (`uvicorn echo_app:app --app-dir bench`); no framework, so the bare
figures measure little more than uvicorn's HTTP handling on loopback.
"""

from __future__ import annotations

from typing import Any

JSON_HEADERS = [(b"content-type", b"application/json")]


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _respond(send: Any, status: int, body: bytes) -> None:
    headers = [*JSON_HEADERS, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    if scope["type"] != "http":
        return
    chunks = []
    more = True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    if scope["method"] != "POST":
        await _respond(send, 405, b'{"error":"method not allowed"}')
        return
    await _respond(send, 200, b"".join(chunks) or b"{}")
