"""The error envelope of SPEC §3, for every error the API can return.

An `ApiError` names a stable snake_case code, an HTTP status and a message template
marked for translation; the envelope renders that template in English and in French
(Django's gettext catalogues) and picks `message` from `Accept-Language`. DRF's own
exceptions and Django's 404/500 are mapped onto the same envelope here, so no view
builds an error body by hand.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import Http404, HttpResponse, JsonResponse
from django.utils import translation
from django.utils.translation import gettext_lazy as _
from django.views import defaults
from rest_framework import exceptions as drf_exceptions
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response

# code -> (HTTP status, message template). Templates use %(name)s parameters.
MESSAGES: dict[str, tuple[int, Any]] = {
    "unauthenticated": (401, _("Authentication required: a valid API key is needed.")),
    "insufficient_scope": (403, _("This API key lacks the scope '%(scope)s'.")),
    "forbidden": (403, _("You are not allowed to perform this action.")),
    "policy_denied": (403, _("Denied by policy: %(reason)s.")),
    "endpoint_forbidden": (
        403,
        _("The tool's endpoint address is forbidden (link-local or cloud metadata)."),
    ),
    "dlp_blocked": (
        403,
        _("Blocked by data-loss prevention: %(where)s holds %(entities)s."),
    ),
    "budget_exceeded": (
        403,
        _("The tenant's monthly budget of %(budget)s %(currency)s is spent."),
    ),
    "usage_invalid": (400, _("The usage events are invalid; none was recorded.")),
    "not_found": (404, _("Not found.")),
    "tool_not_found": (404, _("Tool '%(tool)s' does not exist in this tenant's catalog.")),
    "contract_not_found": (404, _("Contract '%(name)s' does not exist.")),
    "method_not_allowed": (405, _("Method '%(method)s' is not allowed on this route.")),
    "not_acceptable": (406, _("The requested response format is not available.")),
    "invalid_json": (400, _("The request body is not valid JSON: %(reason)s")),
    "invalid_request": (400, _("The request is invalid: %(reason)s")),
    "invalid_input": (400, _("The tool input does not match the tool's input schema.")),
    "invalid_cursor": (400, _("The pagination cursor is invalid.")),
    "payload_too_large": (413, _("The request body exceeds the limit of %(limit)s bytes.")),
    "unsupported_media_type": (
        415,
        _("Unsupported media type '%(media_type)s': send application/json."),
    ),
    "manifest_invalid": (422, _("The manifest is invalid; nothing was applied.")),
    "idempotency_conflict": (
        409,
        _("This Idempotency-Key was already used with a different tool or request."),
    ),
    "idempotency_in_progress": (
        409,
        _("A request with this Idempotency-Key is still being processed."),
    ),
    "invalid_verdict": (400, _("The verdict must be 'approve' or 'deny'.")),
    "reason_required": (400, _("A reason is required to decide.")),
    "reason_too_long": (400, _("The reason is longer than %(limit)s characters.")),
    "reviewer_required": (
        403,
        _(
            "Only a staff reviewer's own key (not one issued to them by another user) can "
            "decide approvals; agent keys cannot."
        ),
    ),
    "separation_of_duties": (
        403,
        _("You cannot decide on a call made with a key you own or created."),
    ),
    "already_decided": (409, _("You have already decided on this approval.")),
    "approval_closed": (409, _("The approval is already '%(current)s'.")),
    "run_exists": (409, _("The run '%(run_id)s' already exists.")),
    "invalid_state": (409, _("The invocation is '%(current)s' and cannot be %(action)s.")),
    "rate_limited": (429, _("Too many requests; retry after %(retry_after)s seconds.")),
    "tool_error": (502, _("The tool failed: %(reason)s")),
    "invalid_output": (502, _("The tool returned an invalid output: %(reason)s")),
    "tool_unavailable": (503, _("The tool is unavailable: %(reason)s")),
    "tool_timeout": (504, _("The tool did not answer within %(timeout_ms)s ms.")),
    "audit_unavailable": (503, _("The audit log is unavailable; the call was not made.")),
    "internal_error": (500, _("An internal error occurred.")),
    "origin_not_allowed": (403, _("Requests from the origin '%(origin)s' are not allowed.")),
    "mcp_method_not_found": (
        404,
        _("The MCP method '%(method)s' is not available on this server."),
    ),
    "mcp_invalid_params": (400, _("The MCP request's parameters are invalid: %(reason)s")),
    "mcp_header_mismatch": (400, _("The MCP request's headers do not match its body: %(reason)s")),
    "mcp_unsupported_version": (
        400,
        _("The MCP protocol version '%(version)s' is not supported (supported: %(supported)s)."),
    ),
}


class Text:
    """A translatable fragment used as a message parameter, rendered in the language of
    the message it is placed in (so a French envelope gets a French fragment)."""

    def __init__(self, template: Any, **params: Any) -> None:
        self.template = template
        self.params = params

    def __str__(self) -> str:
        text = str(self.template)
        return text % self.params if self.params else text


def join_texts(parts: list[Any]) -> Any:
    """Several fragments as one parameter, separated by '; '."""
    return Text(
        "; ".join(f"%(p{i})s" for i in range(len(parts))),
        **{f"p{i}": part for i, part in enumerate(parts)},
    )


class ApiError(Exception):
    """An error answered with the envelope. `params` fill the message template."""

    def __init__(
        self,
        code: str,
        *,
        status: int | None = None,
        details: dict | None = None,
        headers: dict[str, str] | None = None,
        **params: Any,
    ) -> None:
        self.code = code
        self.status = status or MESSAGES[code][0]
        self.details = details or {}
        self.headers = headers or {}
        # decision_id / invocation_id travel at the top of the envelope, not in params.
        self.refs = {k: params.pop(k) for k in ("decision_id", "invocation_id") if k in params}
        self.params = params
        super().__init__(code)


def request_language(request: Any) -> str:
    """'fr' when Accept-Language prefers French, else 'en' (the default)."""
    header = ""
    if request is not None:
        meta = getattr(request, "META", {})
        header = meta.get("HTTP_ACCEPT_LANGUAGE", "")
    for lang, q in translation.trans_real.parse_accept_lang_header(header):
        primary = lang.split("-")[0].lower()
        if primary in ("fr", "en") and q > 0:  # q=0: "not acceptable" (RFC 9110)
            return primary
    return "en"


def render_message(code: str, params: dict[str, Any], lang: str) -> str:
    template = MESSAGES.get(code, MESSAGES["internal_error"])[1]
    with translation.override(lang):
        text = str(template)
        return text % params if params else text


def envelope(request: Any, error: ApiError) -> dict:
    """The body `{"error": {...}}` for `error`, messages in both languages."""
    i18n = {lang: render_message(error.code, error.params, lang) for lang in ("en", "fr")}
    body: dict[str, Any] = {
        "code": error.code,
        "message": i18n[request_language(request)],
        "message_i18n": i18n,
        "details": error.details,
        "request_id": getattr(request, "request_id", None),
    }
    body.update(error.refs)
    return {"error": body}


def error_response(request: Any, error: ApiError) -> Response:
    response = Response(envelope(request, error), status=error.status)
    for name, value in error.headers.items():
        response[name] = value
    return response


def json_error(request: Any, error: ApiError) -> JsonResponse:
    """The envelope outside DRF (middleware, Django's handler404/500)."""
    response = JsonResponse(envelope(request, error), status=error.status)
    for name, value in error.headers.items():
        response[name] = value
    return response


def _from_drf(exc: Exception, request: Any) -> ApiError | None:
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, (drf_exceptions.NotAuthenticated, drf_exceptions.AuthenticationFailed)):
        return ApiError("unauthenticated")
    if isinstance(exc, drf_exceptions.PermissionDenied):
        return ApiError("forbidden")
    if isinstance(exc, (Http404, drf_exceptions.NotFound)):
        return ApiError("not_found")
    if isinstance(exc, drf_exceptions.MethodNotAllowed):
        return ApiError("method_not_allowed", method=getattr(request, "method", "?"))
    if isinstance(exc, drf_exceptions.NotAcceptable):
        return ApiError("not_acceptable")
    if isinstance(exc, drf_exceptions.UnsupportedMediaType):
        media_type = getattr(request, "content_type", "") or ""
        return ApiError("unsupported_media_type", media_type=media_type.split(";")[0][:100])
    if isinstance(exc, drf_exceptions.ParseError):
        return ApiError("invalid_json", reason=str(exc.detail)[:200])
    if isinstance(exc, drf_exceptions.Throttled):
        wait = int(exc.wait or 1)
        return ApiError("rate_limited", retry_after=wait, headers={"Retry-After": str(wait)})
    if isinstance(exc, drf_exceptions.ValidationError):
        return ApiError("invalid_request", reason="see details", details={"errors": exc.detail})
    return None


def exception_handler(exc: Exception, context: dict) -> Response | None:
    """DRF's EXCEPTION_HANDLER: every API exception leaves as the envelope."""
    request = context.get("request")
    error = _from_drf(exc, request)
    if error is None:
        return None  # unexpected: Django's handler500 answers with the envelope
    response = error_response(request, error)
    if request is not None:
        # The envelope is JSON whatever the view renders otherwise (the docs page's HTML,
        # the OpenAPI document's own media type).
        request.accepted_renderer = _ERROR_RENDERER
        request.accepted_media_type = _ERROR_RENDERER.media_type
    if error.status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="eai"'
    return response


_ERROR_RENDERER = JSONRenderer()


def is_api_request(request: Any) -> bool:
    """Whether a refusal is the API's (the envelope) rather than the portal's (an HTML
    page): everything but the admin portal and its static files, so that a mistyped
    API path (`/V1/tools`, `//v1/tools`, `/healthz/`) still gets the envelope."""
    path = request.path
    portal = ("/admin/", "/" + settings.STATIC_URL.strip("/") + "/")
    return not (path.startswith(portal) or path == "/admin")


def handler404(request: Any, exception: Exception | None = None) -> HttpResponse:
    if not is_api_request(request):
        return defaults.page_not_found(request, exception)
    return json_error(request, ApiError("not_found"))


def handler400(request: Any, exception: Exception | None = None) -> HttpResponse:
    """Django's refusals before any view (a Host not allowed, too many fields...)."""
    if not is_api_request(request):
        return defaults.bad_request(request, exception)
    reason = Text(_("its Host header or form data is not accepted"))
    return json_error(request, ApiError("invalid_request", reason=reason))


def handler500(request: Any) -> HttpResponse:
    if not is_api_request(request):
        return defaults.server_error(request)
    return json_error(request, ApiError("internal_error"))
