"""The `/v1` API of the gateway. Views parse, call one function, and answer.

Tenant scoping happens once, in `TenantAPIView`, which binds the request to the key's
tenant: `Model.objects` then holds that tenant's rows only, so another tenant's id is
a 404 like an unknown one.
"""

from __future__ import annotations

import functools
import hmac
import re
import threading
import time
from contextlib import ExitStack
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import translation
from django.utils.translation import gettext_lazy as _
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from eai import bulkheads, workers
from eai.errors import ApiError, Text, json_error, request_language
from eai.integrations import opa, openbao
from eai.integrations import redis as shared_redis
from eai.jsoncodec import answer_json
from eai.parsers import (
    JSONInvalid,
    StrictJSONParser,
    TextXYAMLParser,
    TextYAMLParser,
    XYAMLParser,
    YAMLParser,
    loads_strict,
)
from gateway import audit, breakers, dlp, finops, metrics, pipeline, runs
from gateway import sandbox as sandboxes
from gateway.contracts import contract_validator, load_contract, schema_errors
from gateway.manifests import ManifestInvalid, apply_manifests, split_documents, validate_manifests
from gateway.models import (
    Artifact,
    AuditEvent,
    Decision,
    Event,
    Invocation,
    Run,
    Tool,
)
from tenants.auth import ApiKeyAuthentication, ApiPrincipal
from tenants.models import ApiKey, Tenant
from tenants.scope import tenant_session

ERROR = OpenApiResponse(OpenApiTypes.OBJECT, description="The error envelope (SPEC §3)")
LIST_PARAMS = [
    OpenApiParameter("limit", int, description="Page size: 50 by default, at most 500."),
    OpenApiParameter("cursor", str, description="`next_cursor` of the previous page."),
]


class ApiKeyScheme(OpenApiAuthenticationExtension):
    """The API key as an OpenAPI security scheme (HTTP bearer)."""

    target_class = "tenants.auth.ApiKeyAuthentication"
    name = "apiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "bearerFormat": "eai_<id>_<secret>"}


def api_doc(summary: str, *, request: Any = None, params: list | None = None, ok: int = 200):
    """OpenAPI metadata for a view method (bodies are described as JSON objects); the
    operation id is the view and method, e.g. `ToolList_get`."""
    responses = {ok: OpenApiTypes.OBJECT, 400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR}

    def decorate(method: Any) -> Any:
        view, verb = method.__qualname__.split(".")
        return extend_schema(
            operation_id=f"{view.removesuffix('View')}_{verb}",
            summary=summary,
            request=request,
            parameters=params or [],
            responses=responses,
        )(method)

    return decorate


DEFAULT_LIMIT = 50
MAX_LIMIT = 500
MAX_WAIT_S = 30.0


class TenantAPIView(APIView):
    """Base of every tenant API view: key auth, scopes, and the key's tenant's scope."""

    # (The docstring above is the description of operations without their own in the
    # OpenAPI document.) After authentication and the scope check, the rest of the
    # request (handler, error handling) runs bound to the key's tenant, entered here
    # once (`tenant_session`): handlers read `self.tenant` and `Model.objects`, which
    # hold that tenant's rows only, and never enter a scope themselves.

    required_scopes: dict[str, str] = {}
    # No OPTIONS: DRF's metadata answer is nowhere in the OpenAPI document, and the
    # server answers nothing the document does not describe (SPEC §12): 405 like any
    # other method a route does not take.
    http_method_names = ["get", "post", "put", "patch", "delete", "head"]
    # Whether the request's reads outside a transaction need PostgreSQL's setting (see
    # tenant_session): True unless the view's work is all in tenant_scope transactions.
    session_setting = True

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        with ExitStack() as self._scope:
            return super().dispatch(request, *args, **kwargs)

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)  # authentication, scopes, throttles
        tenant = request.auth.tenant
        self._scope.enter_context(tenant_session(tenant, database=self.session_setting))

    def perform_authentication(self, request: Request) -> None:
        """Authenticates, then takes the request's slot in its tenant's share of this
        process (429 `rate_limited` past it: eai/bulkheads.py)."""
        super().perform_authentication(request)
        if isinstance(request.auth, ApiKey):
            bulkheads.enter_tenant(request.META, request.auth.tenant_id)

    @property
    def tenant(self) -> Tenant:
        return self.request.auth.tenant

    def get_or_404(self, model: Any, **lookup: Any) -> Any:
        """The scope's row matching `lookup`; another tenant's is `not_found`, as one
        that does not exist."""
        obj = model.objects.filter(**lookup).first()
        if obj is None:
            raise ApiError("not_found")
        return obj


def json_body(request: Request) -> Any:
    """The parsed body; an absent body is `invalid_json`, not an empty dict."""
    if request.stream is None:
        raise ApiError("invalid_json", reason=Text(_("the body is empty")))
    return request.data


def no_body_or_json(request: Request) -> None:
    """For routes that read no body: one sent must still be JSON (400 `invalid_json`,
    415 `unsupported_media_type`), as on every route, rather than be ignored."""
    if request.stream is not None:
        request.data  # noqa: B018 - parsing is what raises


def query_limit(request: Request) -> int:
    if len(request.query_params.getlist("limit")) > 1:
        raise ApiError(
            "invalid_request",
            reason=Text(_("limit must be given once")),
            details={"field": "limit"},
        )
    raw = request.query_params.get("limit")
    if raw is None or raw == "":
        return DEFAULT_LIMIT
    try:
        value = int(raw)
    except ValueError as exc:
        raise ApiError(
            "invalid_request",
            reason=Text(_("limit must be an integer")),
            details={"field": "limit"},
        ) from exc
    return max(1, min(value, MAX_LIMIT))


def query_bool(request: Request, name: str) -> bool:
    raw = request.query_params.get(name, "false").lower()
    if raw in ("true", "1", "yes"):
        return True
    if raw in ("false", "0", "no", ""):
        return False
    raise ApiError(
        "invalid_request",
        reason=Text(_("%(name)s must be true or false"), name=name),
        details={"field": name},
    )


def page(rows: list[Any], limit: int, cursor_of: Any, render: Any) -> dict[str, Any]:
    """`{"results", "next_cursor"}` from `limit + 1` fetched rows."""
    more = len(rows) > limit
    rows = rows[:limit]
    return {
        "results": [render(row) for row in rows],
        "next_cursor": cursor_of(rows[-1]) if more and rows else None,
    }


def raw_json(outcome: pipeline.Outcome) -> HttpResponse:
    response = HttpResponse(outcome.content, status=outcome.status, content_type="application/json")
    for name, value in outcome.headers.items():
        response[name] = value
    return response


# ------------------------------------------------------------------------ catalog


_TOOL_CURSOR_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}\Z")


class ToolListView(TenantAPIView):
    required_scopes = {"GET": "tools:read"}

    @api_doc("List the tenant's tools (the catalog)", params=LIST_PARAMS)
    def get(self, request: Request) -> Response:
        limit = query_limit(request)
        cursor = request.query_params.get("cursor")
        if cursor is not None and not _TOOL_CURSOR_RE.match(cursor):
            raise ApiError("invalid_cursor")  # a cursor is a tool's name (the last listed)
        rows = Tool.objects.order_by("name")
        if cursor:
            rows = rows.filter(name__gt=cursor)
        rows = list(rows[: limit + 1])
        return Response(page(rows, limit, lambda t: t.name, self.catalog_entry))

    def catalog_entry(self, tool: Tool) -> dict[str, Any]:
        return tool.as_catalog(breakers.state(str(tool.tenant_id), tool.name))


class ToolDetailView(TenantAPIView):
    required_scopes = {"GET": "tools:read"}

    @api_doc("One tool of the catalog, with its availability")
    def get(self, request: Request, name: str) -> Response:
        tool = Tool.objects.filter(name=name).first()
        if tool is None:
            raise ApiError("tool_not_found", tool=dlp.scrub_text(name)[0][:200])
        return Response(tool.as_catalog(breakers.state(str(tool.tenant_id), tool.name)))


# ------------------------------------------------------------------------- invoke


class InvokeView(TenantAPIView):
    """POST /v1/tools/{name}/invoke. Scopes are the policy's to check, not this view's."""

    # The pipeline reads and writes only inside its own tenant_scope transactions, each
    # setting the tenant for PostgreSQL: the session's setting would cost two
    # statements a call and serve nothing.
    session_setting = False

    @api_doc(
        "Invoke a tool through the governed pipeline",
        request=OpenApiTypes.OBJECT,
        params=[
            OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER),
            OpenApiParameter("Prefer", str, OpenApiParameter.HEADER, description="respond-async"),
        ],
    )
    def post(self, request: Request, name: str) -> HttpResponse:
        return self._invoke(request, request.auth, name, json_body(request))

    def _invoke(self, request: Any, key: ApiKey, name: str, body: Any) -> HttpResponse:
        prefer = request.headers.get("Prefer", "")
        outcome = pipeline.invoke(
            key=key,
            tool_name=name,
            body=body,
            request=request,
            idempotency_key=request.headers.get("Idempotency-Key"),
            prefer_async="respond-async" in prefer.lower(),
        )
        return raw_json(outcome)

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        """The hot route skips DRF's request wrapping, negotiation and permission
        machinery (about 0.3 ms a call) when the call is plainly well formed: a POST
        with a valid key, a JSON body that parses, and an Accept that admits JSON.
        Anything else goes through DRF, which answers exactly as it always has; the
        checks here have no side effects, so running DRF's after them changes nothing."""
        if request.method == "POST" and _accepts_json(request.META.get("HTTP_ACCEPT", "")):
            key = _bearer_key(request)
            content_type = request.META.get("CONTENT_TYPE", "")
            if key is not None and content_type.partition(";")[0].strip() == "application/json":
                try:
                    raw = request.body
                    body = loads_strict(raw) if raw.strip() else _NO_BODY
                except (JSONInvalid, RequestDataTooBig, UnicodeDecodeError):
                    body = _NO_BODY
                if body is not _NO_BODY and _entered(request, key):
                    self.args, self.kwargs, self.request = args, kwargs, request
                    request.user, request.auth = ApiPrincipal(key), key
                    with tenant_session(key.tenant, database=self.session_setting):
                        response = self._invoke(request, key, kwargs["name"], body)
                    response["Allow"] = ", ".join(self._allowed_methods())
                    return response
        return super().dispatch(request, *args, **kwargs)


_NO_BODY = object()


def _entered(request: HttpRequest, key: ApiKey) -> bool:
    """Whether the call took a slot of its tenant; if not, DRF's path refuses it with
    the envelope (`TenantAPIView.perform_authentication` meets the same refusal)."""
    try:
        bulkheads.enter_tenant(request.META, key.tenant_id)
    except ApiError:
        return False
    return True


def _accepts_json(accept: str) -> bool:
    """Whether DRF's negotiation would pick the JSON renderer for this Accept."""
    if not accept:
        return True
    return any(
        part.split(";")[0].strip() in ("application/json", "application/*", "*/*")
        for part in accept.split(",")
    )


def _bearer_key(request: HttpRequest) -> ApiKey | None:
    """The key of a valid `Authorization: Bearer` header, or None for anything else
    (DRF then answers the refusal, through the same authentication class)."""
    try:
        found = ApiKeyAuthentication().authenticate(request)
    except ApiError:
        return None
    return found[1] if found else None


# ---------------------------------------------------------------------------- mcp


@csrf_exempt
def mcp_view(request: HttpRequest) -> HttpResponse:
    """POST /v1/mcp: MCP over Streamable HTTP (SPEC §10). The refusals made before any
    JSON-RPC is read (method, origin, key, content type; the size limit is the
    middleware's) answer with the envelope; `mcp_server.answer` does the rest."""
    if request.method != "POST":
        # No GET stream (nothing is ever pushed) and no DELETE (there are no sessions).
        response = json_error(request, ApiError("method_not_allowed", method=request.method[:20]))
        response["Allow"] = "POST"
        return response
    origin = request.headers.get("Origin")
    if origin is not None and not _mcp_origin_allowed(request, origin):
        return json_error(request, ApiError("origin_not_allowed", origin=origin[:200]))
    key = _bearer_key(request)
    if key is None:
        # A plain key realm, no `resource_metadata`: a client must not start an OAuth
        # discovery that cannot succeed.
        response = json_error(request, ApiError("unauthenticated"))
        response["WWW-Authenticate"] = 'Bearer realm="eai"'
        return response
    content_type = request.META.get("CONTENT_TYPE", "").partition(";")[0].strip().lower()
    if content_type != "application/json":
        error = ApiError("unsupported_media_type", media_type=content_type[:100])
        return json_error(request, error)
    if not _accepts_json(request.META.get("HTTP_ACCEPT", "")):
        return json_error(request, ApiError("not_acceptable"))
    # Imported at a process's first MCP request, not when every worker boots: the SDK's
    # wire models take most of a second of CPU to import (the whole `mcp` package comes
    # with its inbound checks), which a worker that never serves MCP need not pay.
    from gateway import mcp_server  # noqa: PLC0415

    reply = mcp_server.answer(key=key, raw=request.body, request=request)
    if reply.body is None:
        return HttpResponse(status=202)
    return HttpResponse(
        answer_json(reply.body), status=reply.status, content_type="application/json"
    )


def _mcp_origin_allowed(request: HttpRequest, origin: str) -> bool:
    """A listed origin, or the gateway's own (a page it serves; its Host has passed
    ALLOWED_HOSTS by now, so a rebound name never matches)."""
    allowed = settings.EAI_MCP_ALLOWED_ORIGINS
    origin = origin.rstrip("/")
    return (
        "*" in allowed or origin in allowed or origin == f"{request.scheme}://{request.get_host()}"
    )


# -------------------------------------------------------------------- invocations


class InvocationListView(TenantAPIView):
    required_scopes = {"GET": "invocations:read"}

    @api_doc(
        "List invocations",
        params=[
            *LIST_PARAMS,
            OpenApiParameter("status", str),
            OpenApiParameter("tool", str),
            OpenApiParameter("run_id", str),
            OpenApiParameter("agent", str),
        ],
    )
    def get(self, request: Request) -> Response:
        params = request.query_params
        limit = query_limit(request)
        status = params.get("status")
        if status is not None and status not in Invocation.STATUSES:
            raise ApiError(
                "invalid_request",
                reason=Text(_("unknown status '%(value)s'"), value=status[:50]),
                details={"field": "status", "allowed": Invocation.STATUSES},
            )
        cursor = params.get("cursor")
        if cursor is not None and not (cursor.startswith("tinv_") and len(cursor) <= 40):
            raise ApiError("invalid_cursor")
        rows = Invocation.objects.order_by("-id")
        for field in ("status", "tool", "run_id", "agent"):
            if params.get(field):
                rows = rows.filter(**{field: params[field]})
        if cursor:
            rows = rows.filter(id__lt=cursor)
        rows = list(rows[: limit + 1])
        return Response(page(rows, limit, lambda i: i.id, Invocation.as_dict))


class LongPollSlots:
    """The request threads long polls may hold in this process: EAI_LONG_POLL_SLOTS in
    all, at most half of them (at least one) for one tenant, so one tenant's waiting
    clients cannot turn every other tenant's `?wait=` into an immediate answer."""

    def __init__(self, total: int) -> None:
        self.total = max(0, total)
        self.per_tenant = max(1, self.total // 2)
        self.lock = threading.Lock()
        self.held: dict[int, int] = {}

    def acquire(self, tenant_id: int) -> bool:
        with self.lock:
            if sum(self.held.values()) >= self.total:
                return False
            if self.held.get(tenant_id, 0) >= self.per_tenant:
                return False
            self.held[tenant_id] = self.held.get(tenant_id, 0) + 1
            return True

    def release(self, tenant_id: int) -> None:
        with self.lock:
            left = self.held.get(tenant_id, 0) - 1
            if left > 0:
                self.held[tenant_id] = left
            else:
                self.held.pop(tenant_id, None)


@functools.cache
def _long_poll_slots() -> LongPollSlots:
    # Never every request thread of the process: with a single one (gunicorn's `sync`
    # worker) a waiting client would hold the whole process, so there a long poll
    # answers at once, and the client polls again.
    threads = workers.REQUEST_THREADS
    if threads is None:
        return LongPollSlots(settings.EAI_LONG_POLL_SLOTS)
    return LongPollSlots(min(settings.EAI_LONG_POLL_SLOTS, threads - 1))


class InvocationDetailView(TenantAPIView):
    required_scopes = {"GET": "invocations:read"}

    @api_doc(
        "One invocation; `wait` long-polls up to 30 s for a final status",
        params=[OpenApiParameter("wait", float)],
    )
    def get(self, request: Request, invocation_id: str) -> Response:
        wait = self._wait_seconds(request)
        invocation = self.get_or_404(Invocation, id=invocation_id)
        if invocation.is_final or wait <= 0:
            return Response(invocation.as_dict())
        # A waiting client holds a request thread: past EAI_LONG_POLL_SLOTS of them the
        # answer comes at once (a long poll may always end early), so the others,
        # health checks included, are still served.
        slots = _long_poll_slots()  # once: the release must reach the same object
        if not slots.acquire(self.tenant.pk):
            return Response(invocation.as_dict())
        try:
            deadline = time.monotonic() + wait
            while not invocation.is_final and time.monotonic() < deadline:
                time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
                invocation = self.get_or_404(Invocation, id=invocation_id)
        finally:
            slots.release(self.tenant.pk)
        return Response(invocation.as_dict())

    @staticmethod
    def _wait_seconds(request: Request) -> float:
        raw = request.query_params.get("wait")
        if not raw:
            return 0.0
        try:
            value = float(raw)
        except ValueError as exc:
            raise ApiError(
                "invalid_request",
                reason=Text(_("wait must be a number of seconds")),
                details={"field": "wait"},
            ) from exc
        if value != value or value < 0:  # NaN or negative
            raise ApiError(
                "invalid_request",
                reason=Text(_("wait must be a number of seconds")),
                details={"field": "wait"},
            )
        return min(value, MAX_WAIT_S)


class ArtifactView(TenantAPIView):
    """The full output of a call too large to store inline: the invocation's `output` is
    a preview with `artifact_ref`, and its `artifacts` list names it. The body is the
    output as stored, after DLP, never the upstream's raw bytes."""

    required_scopes = {"GET": "invocations:read"}

    @api_doc("The full body of an artifact (`art_…`)")
    def get(self, request: Request, artifact_id: str) -> HttpResponse:
        artifact = self.get_or_404(Artifact, id=artifact_id)
        return HttpResponse(bytes(artifact.content), content_type=artifact.content_type)


class InvocationCancelView(TenantAPIView):
    required_scopes = {"POST": "tools:invoke"}

    @api_doc("Cancel a waiting_approval or queued invocation")
    def post(self, request: Request, invocation_id: str) -> Response:
        no_body_or_json(request)
        cancelled = pipeline.cancel_invocation(key=request.auth, invocation_id=invocation_id)
        return Response(cancelled.as_dict())


class DecisionView(TenantAPIView):
    required_scopes = {"GET": "audit:read"}

    @api_doc("One policy decision")
    def get(self, request: Request, decision_id: str) -> Response:
        return Response(self.get_or_404(Decision, id=decision_id).as_dict())


# ------------------------------------------------------------ contracts, manifests


class ContractView(TenantAPIView):
    @api_doc("A published JSON Schema (tool-manifest)")
    def get(self, request: Request, name: str) -> Response:
        schema = load_contract(name)
        if schema is None:
            raise ApiError("contract_not_found", name=name[:100])
        return Response(schema)


class ContractValidateView(TenantAPIView):
    required_scopes = {"POST": "contracts:validate"}
    parser_classes = [StrictJSONParser, YAMLParser, TextYAMLParser, XYAMLParser, TextXYAMLParser]

    @api_doc("Validate a document against a contract", request=OpenApiTypes.OBJECT)
    def post(self, request: Request, name: str) -> Response:
        validator = contract_validator(name)
        if validator is None:
            raise ApiError("contract_not_found", name=name[:100])
        document = json_body(request)
        errors = schema_errors(validator, document)
        if not errors and name == "tool-manifest":
            try:
                validate_manifests([document], tenant=self.tenant)
            except ManifestInvalid as exc:
                errors = [{"path": e["path"], "message": e["message"]} for e in exc.errors]
        return Response({"valid": not errors, "errors": errors})


class ManifestApplyView(TenantAPIView):
    required_scopes = {"POST": "manifests:apply"}
    parser_classes = [StrictJSONParser, YAMLParser, TextYAMLParser, XYAMLParser, TextXYAMLParser]

    @api_doc(
        "Apply manifests (JSON or YAML), all or nothing",
        request=OpenApiTypes.OBJECT,
        params=[OpenApiParameter("dry_run", bool)],
    )
    def post(self, request: Request) -> Response:
        dry_run = query_bool(request, "dry_run")
        try:
            documents = split_documents(json_body(request))
            results = apply_manifests(
                tenant=self.tenant,
                documents=documents,
                dry_run=dry_run,
                actor=request.auth.public_id,
            )
        except ManifestInvalid as exc:
            raise ApiError("manifest_invalid", details={"errors": exc.errors[:500]}) from exc
        return Response({"dry_run": dry_run, "results": [r.as_dict() for r in results]})


# ------------------------------------------------------------------- audit, events


_MAX_QUERY_INT = 2**53


def query_int(request: Request, name: str, default: int | None = None) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ApiError(
            "invalid_cursor" if name == "cursor" else "invalid_request",
            reason=Text(_("%(name)s must be an integer"), name=name),
            details={"field": name},
        ) from exc
    if value < 0 or value > _MAX_QUERY_INT:  # beyond any sequence, and PostgreSQL's bigint
        raise ApiError(
            "invalid_cursor" if name == "cursor" else "invalid_request",
            reason=Text(_("%(name)s must be an integer"), name=name),
            details={"field": name},
        )
    return value


class AuditEventsView(TenantAPIView):
    required_scopes = {"GET": "audit:read"}

    @api_doc("The tenant's audit chain, oldest first (cursor: last seq seen)", params=LIST_PARAMS)
    def get(self, request: Request) -> Response:
        limit = query_limit(request)
        cursor = query_int(request, "cursor", 0)
        rows = AuditEvent.objects.filter(seq__gt=cursor).order_by("seq")
        if request.query_params.get("action"):
            rows = rows.filter(action=request.query_params["action"])
        rows = list(rows[: limit + 1])
        return Response(page(rows, limit, lambda e: str(e.seq), audit.event_view))


class AuditVerifyView(TenantAPIView):
    required_scopes = {"GET": "audit:read"}

    @api_doc(
        "Verify the tenant's audit chain from the genesis, against its signed checkpoints "
        "and the anchor log kept outside the database. Entries after proven_through_seq "
        "are covered by the next checkpoint (every 5 minutes by default)."
    )
    def get(self, request: Request) -> Response:
        result = audit.verify_chain(self.tenant)
        # What no checkpoint covers yet, said beside the verdict (SPEC §14).
        result["unproven_entries"] = result["length"] - result["proven_through_seq"]
        with translation.override(request_language(request)):
            result["coverage"] = audit.coverage_note()
        return Response(result)


class EventsView(TenantAPIView):
    required_scopes = {"GET": "events:read"}

    @api_doc(
        "The event feed: events with sequence > cursor, in increasing order",
        params=[*LIST_PARAMS, OpenApiParameter("run_id", str)],
    )
    def get(self, request: Request) -> Response:
        limit = query_limit(request)
        cursor = query_int(request, "cursor", 0)
        rows = Event.objects.filter(sequence__gt=cursor).order_by("sequence")
        if request.query_params.get("run_id"):
            rows = rows.filter(run_id=request.query_params["run_id"])
        rows = list(rows[:limit])
        return Response(
            {
                "results": [e.as_dict() for e in rows],
                "next_cursor": str(rows[-1].sequence) if rows else None,
            }
        )


class RunsView(TenantAPIView):
    required_scopes = {"POST": "tools:invoke"}

    @api_doc("Start a run (an agent turn)", request=OpenApiTypes.OBJECT, ok=201)
    def post(self, request: Request) -> Response:
        body = json_body(request) if request.stream is not None else {}
        if not isinstance(body, dict) or set(body) - {"run_id", "goal"}:
            raise ApiError(
                "invalid_request",
                reason=Text(_("the body may hold only run_id and goal")),
            )
        run_id, goal = body.get("run_id"), body.get("goal", "")
        if run_id is not None and (
            not isinstance(run_id, str) or not pipeline.RUN_ID_RE.match(run_id)
        ):
            raise ApiError(
                "invalid_request",
                reason=Text(
                    _("run_id must be a string of 1 to 200 letters, digits, '_', '.', ':' or '-'")
                ),
                details={"field": "run_id"},
            )
        if not isinstance(goal, str):
            raise ApiError("invalid_request", reason=Text(_("goal must be a string")))
        try:
            run = runs.start_run(key=request.auth, run_id=run_id, goal=goal)
        except runs.RunExists as exc:
            raise ApiError("run_exists", run_id=str(exc)[:200]) from exc
        return Response(runs.run_state(run), status=201)


class RunDetailView(TenantAPIView):
    required_scopes = {"GET": "events:read"}

    @api_doc("A run's state and calls")
    def get(self, request: Request, run_id: str) -> Response:
        run = self.get_or_404(Run, run_id=run_id)
        return Response(runs.run_state(run))


class RunResumeView(TenantAPIView):
    required_scopes = {"POST": "tools:invoke"}

    @api_doc("Re-read a run after human decisions and publish the outcome")
    def post(self, request: Request, run_id: str) -> Response:
        no_body_or_json(request)
        run = self.get_or_404(Run, run_id=run_id)
        return Response(runs.resume_run(key=request.auth, run=run))


# ------------------------------------------------------------------------ finops


def query_time(request: Request, name: str) -> Any:
    raw = request.query_params.get(name)
    if not raw:
        return None
    parsed = finops.parse_moment(raw, dates=True, clamp=True)  # from=1900-01-01: all time
    if parsed is None:
        raise ApiError(
            "invalid_request",
            reason=Text(_("%(name)s must be an ISO 8601 date or time"), name=name),
            details={"field": name},
        )
    return parsed


class FinopsUsageView(TenantAPIView):
    required_scopes = {"GET": "finops:read", "POST": "finops:write"}

    @api_doc(
        "Usage aggregates",
        params=[
            OpenApiParameter("group_by", str, enum=["tool", "agent", "run"]),
            OpenApiParameter("from", str),
            OpenApiParameter("to", str),
            OpenApiParameter("limit", int),
            OpenApiParameter("cursor", str, description="next_cursor of the page before"),
        ],
    )
    def get(self, request: Request) -> Response:
        group_by = request.query_params.get("group_by") or None
        if group_by is not None and group_by not in finops.GROUPS:
            raise ApiError(
                "invalid_request",
                reason=Text(_("group_by must be tool, agent or run")),
                details={"field": "group_by"},
            )
        start, end = query_time(request, "from"), query_time(request, "to")
        if start is not None and end is not None and start > end:
            raise ApiError(
                "invalid_request",
                reason=Text(_("from must not be later than to")),
                details={"field": "from"},
            )
        limit = query_limit(request)
        offset = query_int(request, "cursor", 0) or 0  # groups already returned
        rows = finops.aggregate(
            self.tenant, group_by=group_by, start=start, end=end, offset=offset, limit=limit + 1
        )
        return Response(page(rows, limit, lambda _row: str(offset + limit), lambda row: row))

    @api_doc("Report usage events", request=OpenApiTypes.OBJECT, ok=201)
    def post(self, request: Request) -> Response:
        try:
            rows = finops.parse_events(json_body(request), agent=request.auth.agent)
        except finops.UsageInvalid as exc:
            raise ApiError("usage_invalid", details={"errors": exc.errors}) from exc
        count = finops.ingest(self.tenant, rows)
        return Response({"accepted": count, "usage_ids": [r.id for r in rows]}, status=201)


# ------------------------------------------------------------------------ health


def _machine_route(view: Any) -> Any:
    """A route for probes and scrapers: GET and HEAD only, without CSRF (no session or
    form ever reaches it); any other method answers 405 with the error envelope."""

    @functools.wraps(view)
    def guarded(request: Any) -> HttpResponse:
        if request.method not in ("GET", "HEAD"):
            response = json_error(request, ApiError("method_not_allowed", method=request.method))
            response["Allow"] = "GET, HEAD"
            return response
        return view(request)

    return csrf_exempt(guarded)


@_machine_route
def metrics_view(request: Any) -> HttpResponse:
    """GET /metrics: Prometheus text, for a scraper holding the metrics token."""
    scheme, _sep, presented = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(presented.strip(), metrics.token()):
        response = json_error(request, ApiError("unauthenticated"))
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    body, content_type = metrics.render()
    return HttpResponse(body, content_type=content_type)


@_machine_route
def healthz(request: Any) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def _broker_ok() -> bool:
    from eai.celery import app  # noqa: PLC0415 - only when a broker is configured

    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=1)
    except Exception:  # kombu raises many kinds; any means not ready
        return False
    return True


@_machine_route
def readyz(request: Any) -> JsonResponse:
    """Readiness of the database and of each configured external system."""
    checks: dict[str, str] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception:  # any failure means not ready
        checks["database"] = "unavailable"
    probes = {
        "redis": (settings.EAI_REDIS_URL, shared_redis.healthy),
        "broker": (settings.EAI_BROKER_URL, _broker_ok),
        "opa": (settings.EAI_OPA_URL, opa.healthy),
        "openbao": (settings.EAI_BAO_ADDR, openbao.healthy),
    }
    for name, (configured, probe) in probes.items():
        if configured:
            checks[name] = "ok" if probe() else "unavailable"
        else:  # its in-process fallback serves (SPEC §8): nothing to wait for
            checks[name] = "in_process"
    ready = all(v in ("ok", "in_process") for v in checks.values())
    # Sandboxed tools only: without a runtime they answer 503, the rest serves (SPEC §11).
    state, why = sandboxes.runtime_state()
    checks["sandbox"] = "ok" if state == "ok" else f"{state}: {why}"
    return JsonResponse(
        {"status": "ok" if ready else "unavailable", "checks": checks},
        status=200 if ready else 503,
    )
