"""Request-wide middleware: request ids and the request body limit."""

from __future__ import annotations

import secrets
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse

from eai.errors import ApiError, json_error


class RequestIdMiddleware:
    """Gives every request a `req_…` id, echoed in errors and the X-Request-Id header."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        request.request_id = "req_" + secrets.token_hex(12)
        response = self.get_response(request)
        response["X-Request-Id"] = request.request_id
        return response


class BodySizeLimitMiddleware:
    """Answers 413 `payload_too_large` for API bodies over EAI_MAX_REQUEST_BYTES.

    The body is read and discarded first: a client still sending would otherwise see a
    reset connection instead of the answer.
    """

    CHUNK = 64 * 1024

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        limit = settings.EAI_MAX_REQUEST_BYTES
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if length > limit and request.path.startswith("/v1/"):
            stream = request.META.get("wsgi.input")
            remaining = length
            while stream is not None and remaining > 0:
                chunk = stream.read(min(self.CHUNK, remaining))
                if not chunk:
                    break
                remaining -= len(chunk)
            return json_error(request, ApiError("payload_too_large", limit=limit))
        return self.get_response(request)
