"""Typed exceptions raised by the SDK.

Every non-2xx answer of the gateway carries the error envelope::

    {"error": {"code", "message", "message_i18n": {"en", "fr"}, "details",
               "request_id", ...optional "decision_id", "invocation_id"}}

and is raised as a subclass of :class:`EnterpriseAIError`, chosen first by HTTP status and,
for statuses without a dedicated class, by error code. Network failures (connection
refused, DNS, timeouts, broken connections) raise :class:`APIConnectionError` whose
``status`` is ``None``.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping
from typing import Any


class EnterpriseAIError(Exception):
    """Base class of every SDK error.

    Attributes:
        code: stable snake_case error code (``"http_error"`` when the body was not an
            envelope, ``"connection_error"`` for network failures).
        message: human message in the requested language (``Accept-Language``).
        message_i18n: ``{"en": ..., "fr": ...}`` as sent by the server (may be empty).
        status: HTTP status, or ``None`` when no response was received.
        details: structured details (e.g. schema violations); ``{}`` when absent.
        request_id: server request id (``req_…``) if any.
        decision_id: policy decision id (``dec_…``) if the error came from a decision.
        invocation_id: invocation id (``tinv_…``) if one exists for the failed call.
        retry_after: seconds from the ``Retry-After`` header, if present.
        body: the decoded JSON body (or raw text) of the response, for debugging.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str = "error",
        status: int | None = None,
        message_i18n: Mapping[str, str] | None = None,
        details: Any = None,
        request_id: str | None = None,
        decision_id: str | None = None,
        invocation_id: str | None = None,
        retry_after: float | None = None,
        body: Any = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.message_i18n: dict[str, str] = dict(message_i18n or {})
        self.details: Any = details if details is not None else {}
        self.request_id = request_id
        self.decision_id = decision_id
        self.invocation_id = invocation_id
        self.retry_after = retry_after
        self.body = body

    def __str__(self) -> str:
        prefix = f"[{self.status}] " if self.status is not None else ""
        return f"{prefix}{self.code}: {self.message}"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(code={self.code!r}, status={self.status!r}, "
            f"message={self.message!r}, request_id={self.request_id!r})"
        )


class APIConnectionError(EnterpriseAIError):
    """The request could not be sent or no response was received (``status`` is None)."""


class AuthenticationError(EnterpriseAIError):
    """401: missing, malformed, unknown or revoked API key (code ``unauthenticated``)."""


class PermissionDeniedError(EnterpriseAIError):
    """403: ``policy_denied``, ``insufficient_scope`` or ``dlp_blocked``.

    ``decision_id`` is set when a policy decision was recorded.
    """


class NotFoundError(EnterpriseAIError):
    """404: ``tool_not_found``, or ``not_found`` (also for other tenants' objects)."""


class ConflictError(EnterpriseAIError):
    """409: ``idempotency_conflict``, ``idempotency_in_progress`` or a state conflict."""


class ValidationError(EnterpriseAIError):
    """400/413/415/422: ``invalid_input``, ``invalid_json``, ``payload_too_large``,
    ``unsupported_media_type``, ``manifest_invalid``…; see ``details``."""


class RateLimitError(EnterpriseAIError):
    """429 ``rate_limited``; ``retry_after`` holds the advised delay in seconds."""


class ToolError(EnterpriseAIError):
    """502 ``tool_error`` / ``invalid_output`` or 504 ``tool_timeout``: the tool failed."""


class UnavailableError(EnterpriseAIError):
    """503: ``tool_unavailable`` (circuit open, tool disabled) or ``audit_unavailable``."""


_BY_STATUS: dict[int, type[EnterpriseAIError]] = {
    400: ValidationError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: ValidationError,
    415: ValidationError,
    422: ValidationError,
    429: RateLimitError,
    502: ToolError,
    503: UnavailableError,
    504: ToolError,
}

_BY_CODE: dict[str, type[EnterpriseAIError]] = {
    "unauthenticated": AuthenticationError,
    "policy_denied": PermissionDeniedError,
    "insufficient_scope": PermissionDeniedError,
    "dlp_blocked": PermissionDeniedError,
    "not_found": NotFoundError,
    "tool_not_found": NotFoundError,
    "idempotency_conflict": ConflictError,
    "idempotency_in_progress": ConflictError,
    "invalid_input": ValidationError,
    "invalid_json": ValidationError,
    "payload_too_large": ValidationError,
    "unsupported_media_type": ValidationError,
    "manifest_invalid": ValidationError,
    "rate_limited": RateLimitError,
    "tool_error": ToolError,
    "invalid_output": ToolError,
    "tool_timeout": ToolError,
    "tool_unavailable": UnavailableError,
    "audit_unavailable": UnavailableError,
}


def parse_retry_after(value: str | None) -> float | None:
    """Parse a ``Retry-After`` header (delta-seconds or HTTP-date) into seconds."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - time.time())


def error_class_for(status: int | None, code: str | None) -> type[EnterpriseAIError]:
    """Pick the exception class: by status first, then by code, else the base class."""
    if status is not None and status in _BY_STATUS:
        return _BY_STATUS[status]
    if code and code in _BY_CODE:
        return _BY_CODE[code]
    return EnterpriseAIError


def error_from_response(
    status: int, body: Any, raw_text: str, retry_after_header: str | None
) -> EnterpriseAIError:
    """Build the typed exception for a non-2xx response.

    ``body`` is the decoded JSON (or ``None`` if the body was not JSON). A body that is not
    the error envelope yields code ``"http_error"`` with the HTTP status.
    """
    retry_after = parse_retry_after(retry_after_header)
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        snippet = raw_text.strip()[:200]
        message = f"HTTP {status}" + (f": {snippet}" if snippet else "")
        cls = error_class_for(status, None)
        return cls(
            message,
            code="http_error",
            status=status,
            retry_after=retry_after,
            body=body if body is not None else raw_text,
        )
    code = str(err.get("code") or "http_error")
    i18n = err.get("message_i18n")
    i18n = {str(k): str(v) for k, v in i18n.items()} if isinstance(i18n, dict) else {}
    message = err.get("message")
    if not isinstance(message, str) or not message:
        message = i18n.get("en") or f"HTTP {status}"
    cls = error_class_for(status, code)
    return cls(
        message,
        code=code,
        status=status,
        message_i18n=i18n,
        details=err.get("details"),
        request_id=err.get("request_id"),
        decision_id=err.get("decision_id"),
        invocation_id=err.get("invocation_id"),
        retry_after=retry_after,
        body=body,
    )
