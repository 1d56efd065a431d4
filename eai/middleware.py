"""Request-wide middleware: request ids, the request body limit, and the portal-only
wrappers of Django's session, authentication and message middleware."""

from __future__ import annotations

import io
import json
import secrets
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from django.conf import settings
from django.contrib.auth import middleware as _auth
from django.contrib.messages import middleware as _messages
from django.contrib.sessions import middleware as _sessions
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.utils.translation import gettext_lazy as _

from eai.errors import ApiError, Text, envelope, is_api_request, json_error


def new_request_id() -> str:
    return "req_" + secrets.token_hex(12)


class RequestIdMiddleware:
    """Gives every request a `req_…` id, echoed in errors and the X-Request-Id header."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        request.request_id = new_request_id()
        response = self.get_response(request)
        response["X-Request-Id"] = request.request_id
        return response


def declared_length(environ: dict[str, Any]) -> int:
    """The request's Content-Length, 0 when absent or not a number."""
    try:
        return int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return 0


def wsgi_error(environ: dict[str, Any], start_response: Callable, error: ApiError) -> list[bytes]:
    """The envelope, answered at the WSGI layer before Django has a request."""

    class _Bare:  # what envelope() reads of a request
        META = environ
        request_id = new_request_id()

    body = json.dumps(envelope(_Bare, error), ensure_ascii=False).encode()
    headers = [
        ("Content-Type", "application/json"),
        ("Content-Length", str(len(body))),
        ("X-Request-Id", _Bare.request_id),
        *error.headers.items(),
    ]
    start_response(f"{error.status} {HTTPStatus(error.status).phrase}", headers)
    return [body]


def read_declared_body(environ: dict[str, Any]) -> bool:
    """Reads a body of declared length (within EAI_MAX_REQUEST_BYTES) whole, and hands
    it on in memory; False when the stream ended before its Content-Length. A client
    that half-closes after part of its body has not sent the request it declared: the
    part must not be run as if it were the whole (it may even parse as JSON)."""
    length = declared_length(environ)
    if length <= 0 or length > settings.EAI_MAX_REQUEST_BYTES:
        return True
    stream = environ.get("wsgi.input")
    if stream is None:
        return False
    parts = []
    got = 0
    while got < length:
        part = stream.read(length - got)
        if not part:
            return False
        parts.append(part)
        got += len(part)
    environ["wsgi.input"] = io.BytesIO(parts[0] if len(parts) == 1 else b"".join(parts))
    return True


def too_slow() -> ApiError:
    """The body did not arrive within the server's deadline (eai/workers.py)."""
    return ApiError("invalid_request", status=408, reason=Text(_("it was not received in time")))


def short_body() -> ApiError:
    return ApiError("invalid_request", reason=Text(_("its body ended before its Content-Length")))


_DRAIN_FACTOR = 16  # past 16 times the limit a chunked body is left unread


def buffer_chunked_body(environ: dict[str, Any]) -> None:
    """A body sent with `Transfer-Encoding: chunked` has no Content-Length, and Django
    reads none without one: the body would look empty. The server has undone the
    chunking; read the body here and give it a length. Past EAI_MAX_REQUEST_BYTES only
    the count goes on (the rest is read and dropped, as the 413 answer expects), so
    `BodySizeLimitMiddleware` refuses it like any other oversized body."""
    if "chunked" not in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
        return
    if environ.get("CONTENT_LENGTH"):
        return
    stream = environ.get("wsgi.input")
    if stream is None:
        return
    limit = settings.EAI_MAX_REQUEST_BYTES
    kept = bytearray()
    total = 0
    while total <= limit * _DRAIN_FACTOR:
        chunk = stream.read(BodySizeLimitMiddleware.CHUNK)
        if not chunk:
            break
        total += len(chunk)
        if len(kept) <= limit:
            kept += chunk[: limit + 1 - len(kept)]
    environ["wsgi.input"] = io.BytesIO(bytes(kept))
    environ["CONTENT_LENGTH"] = str(total)


class BodySizeLimitMiddleware:
    """Answers 413 `payload_too_large` for API bodies over EAI_MAX_REQUEST_BYTES, and 415
    for a body sent with a content coding (gzip, …).

    The body is read and discarded first: a client still sending would otherwise see a
    reset connection instead of the answer.
    """

    CHUNK = 64 * 1024

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        limit = settings.EAI_MAX_REQUEST_BYTES
        length = declared_length(request.META)
        if length > limit and request.path.startswith("/v1/"):
            stream = request.META.get("wsgi.input")
            remaining = length
            while stream is not None and remaining > 0:
                chunk = stream.read(min(self.CHUNK, remaining))
                if not chunk:
                    break
                remaining -= len(chunk)
            return json_error(request, ApiError("payload_too_large", limit=limit))
        coding = request.META.get("HTTP_CONTENT_ENCODING", "").strip().lower()
        if coding not in ("", "identity") and request.path.startswith("/v1/"):
            # A compressed body is not JSON to any parser here: say so (RFC 7694), rather
            # than "not UTF-8" from the JSON parser.
            media_type = f"Content-Encoding: {coding[:50]}"
            return json_error(request, ApiError("unsupported_media_type", media_type=media_type))
        return self.get_response(request)


def holds_nul(environ: dict[str, Any]) -> bool:
    """Whether the request's path or query string carries a NUL character, raw or
    percent-encoded (`%00`), the way Django decodes both."""
    path = environ.get("PATH_INFO", "")
    query = environ.get("QUERY_STRING", "")
    return "\x00" in path or "%00" in path or "\x00" in query or "%00" in query


class NulRefusalMiddleware:
    """A NUL character in a path id (`/v1/runs/%00`) answers 404, as an unknown id
    does, and in a query filter (`?run_id=%00`) 400 `invalid_request`, before any view.

    PostgreSQL's text cannot hold NUL: every id and filter that reached a query raised
    there, a 500 with a traceback per request (12 routes, the admin's too). Refused once
    here, for every route present and to come; SQLite answers the same."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not holds_nul(request.META):
            return self.get_response(request)
        if "\x00" in request.path_info:
            if is_api_request(request):
                return json_error(request, ApiError("not_found"))
            raise Http404("no such page")  # the portal's own 404 page
        query = request.GET.lists()
        if not any("\x00" in name or "\x00" in "".join(values) for name, values in query):
            return self.get_response(request)  # "%00" was literal text, e.g. "%2500"
        if not is_api_request(request):
            return HttpResponseBadRequest()
        reason = Text(_("a query parameter holds a NUL character"))
        return json_error(request, ApiError("invalid_request", reason=reason))


def _portal_only(middleware: type) -> type:
    """`middleware`, skipped for API calls (`/v1/…`). The API authenticates with keys and
    keeps no session, cookie or flash message; building a session store and a signed
    message storage for every tool call is wasted work on the hot path. A subclass, so
    the admin's checks still find the middleware; the wrapped classes have no
    `process_view`/`process_exception` hooks, so nothing else changes."""

    class PortalOnly(middleware):
        def __call__(self, request: HttpRequest) -> HttpResponse:
            if request.path_info.startswith("/v1/"):
                return self.get_response(request)
            return super().__call__(request)

    PortalOnly.__name__ = PortalOnly.__qualname__ = f"PortalOnly{middleware.__name__}"
    return PortalOnly


SessionMiddleware = _portal_only(_sessions.SessionMiddleware)
AuthenticationMiddleware = _portal_only(_auth.AuthenticationMiddleware)
MessageMiddleware = _portal_only(_messages.MessageMiddleware)
