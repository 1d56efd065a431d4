"""The MCP server at `POST /v1/mcp` (SPEC §10): the governed catalog for MCP clients.

One synchronous JSON-RPC exchange per POST, JSON answers only, nothing kept between
requests (no `Mcp-Session-Id`), so any worker serves any request. One URL serves both
protocol eras, routed as the official SDK routes them: an `MCP-Protocol-Version` header
naming a handshake revision (or none) is the handshake era (`initialize`, `ping`,
`notifications/initialized`); any other value is the stateless era (2026-07-28:
`server/discover`, headers checked against the body, `resultType` in results).

The wire shapes come from the official SDK's pure parts: `mcp_types.methods` checks each
request against its revision's schema and shapes each result, and
`mcp.shared.inbound.classify_inbound_request` runs the stateless era's header ladder.
No ASGI app or event loop is involved: an MCP call costs what a REST invoke costs, plus
the JSON-RPC wrapping.

`tools/call` goes through `pipeline.invoke`, the one governed path (§1), marked as
coming through MCP (`Invocation.door`, the audit entries, `eai_mcp_tool_calls_total`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import orjson
from django.db.models.signals import post_delete, post_save
from django.utils import translation
from django.utils.translation import gettext_lazy as _
from mcp.shared.inbound import (
    ERROR_CODE_HTTP_STATUS,
    MCP_METHOD_HEADER,
    MCP_NAME_HEADER,
    MCP_PROTOCOL_VERSION_HEADER,
    InboundLadderRejection,
    classify_inbound_request,
    unsupported_protocol_version_rejection,
    validate_mcp_param_headers,
)
from mcp_types import jsonrpc
from mcp_types import methods as wire
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION
from pydantic import ValidationError

from eai.errors import ApiError, Text, envelope, render_message, request_language
from eai.parsers import JSONInvalid, loads_strict
from eai.process_cache import ProcessCache
from gateway import dlp, metrics, pipeline, policy
from gateway.models import (
    MCP_GATEWAY_TOOLS,
    RUN_ID_RE,
    Invocation,
    Tool,
    mcp_tool_name,
)
from tenants.models import ApiKey
from tenants.scope import tenant_scope

logger = logging.getLogger(__name__)

MODERN_VERSION = "2026-07-28"
# The handshake revisions `initialize` agrees to; any other offer gets the latest.
HANDSHAKE_VERSIONS = ("2025-06-18", "2025-11-25")
# A request of the handshake era without the header is read as the spec says to.
UNVERSIONED = "2025-03-26"
SERVER_INFO = {"name": "eai-tool-gateway", "title": "EAI Tool Gateway", "version": "1.0.0"}
SERVER_INFO_META_KEY = "io.modelcontextprotocol/serverInfo"
INSTRUCTIONS = (
    "Governed tools of your organisation. Every call is checked by policy, may be held "
    "for human approval (then call eai_invocation_get later; never repeat the call), "
    "and is audited."
)
CAPABILITIES = {"tools": {"listChanged": False}}
PAGE_SIZE = 100
# An implementation-defined JSON-RPC code (-32000..-32019): the key lacks a scope.
FORBIDDEN = -32003


# The invocation object (SPEC §2) as JSON Schema 2020-12, self-contained: every
# `structuredContent` a call answers satisfies it, a refusal made before any invocation
# exists (`{status, error, decision_id}`) included.
_NULLABLE_STRING = {"type": ["string", "null"]}
_REFS = {"type": "array"}
INVOCATION_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "Invocation",
    "type": "object",
    "required": ["status"],
    "properties": {
        "invocation_id": {"type": "string"},
        "tool": {"type": "string"},
        "tool_version": {"type": "string"},
        "status": {"enum": Invocation.STATUSES},
        "input": {"type": "object"},
        "output": {},
        "decision_id": _NULLABLE_STRING,
        "approval_id": _NULLABLE_STRING,
        "cost": {
            "type": ["object", "null"],
            "required": ["amount", "currency"],
            "properties": {"amount": {"type": "string"}, "currency": {"type": "string"}},
        },
        "run_id": _NULLABLE_STRING,
        "step_index": {"type": ["integer", "null"]},
        "redactions": {"type": "array", "items": {"$ref": "#/$defs/redaction"}},
        "agent": _NULLABLE_STRING,
        "created_at": {"type": "string"},
        "finished_at": _NULLABLE_STRING,
        "object_refs": _REFS,
        "artifacts": _REFS,
        "observations": _REFS,
        "provenance_refs": _REFS,
        "diagnostic": _NULLABLE_STRING,
        "error": {"$ref": "#/$defs/error"},
    },
    "$defs": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "details": {"type": "object"},
            },
        },
        "redaction": {
            "type": "object",
            "required": ["entity", "count", "where"],
            "properties": {
                "entity": {"type": "string"},
                "count": {"type": "integer"},
                "where": {"enum": ["input", "output"]},
            },
        },
    },
}

_INVOCATION_ID_INPUT = {
    "type": "object",
    "required": ["invocation_id"],
    "properties": {
        "invocation_id": {"type": "string", "pattern": "^tinv_[A-Za-z0-9]{1,35}$"},
    },
    "additionalProperties": False,
}
_GATEWAY_COST = {"amount": "0", "currency": "EUR"}
GATEWAY_TOOLS: dict[str, dict[str, Any]] = {
    "eai_invocation_get": {
        "name": "eai_invocation_get",
        "title": "Get an invocation",
        "description": (
            "Read one of your tool calls by its invocation_id (tinv_...): its status and, "
            "once it has run, its output. This is how you learn the outcome of a call that "
            "waits for human approval."
        ),
        "inputSchema": _INVOCATION_ID_INPUT,
        "outputSchema": INVOCATION_SCHEMA,
        "annotations": {
            "readOnlyHint": True,
            "destructiveHint": False,
            "idempotentHint": True,
            "openWorldHint": False,
        },
        "_meta": {
            "eai/tool": {
                "name": "eai_invocation_get",
                "version": SERVER_INFO["version"],
                "risk_class": "low",
                "action_class": "read",
                "requires_approval": False,
                "cost": _GATEWAY_COST,
            }
        },
    },
    "eai_invocation_cancel": {
        "name": "eai_invocation_cancel",
        "title": "Cancel an invocation",
        "description": (
            "Cancel one of your tool calls that still waits for approval or in a queue, by "
            "its invocation_id (tinv_...). A call that has started cannot be cancelled."
        ),
        "inputSchema": _INVOCATION_ID_INPUT,
        "outputSchema": INVOCATION_SCHEMA,
        "annotations": {
            "readOnlyHint": False,
            "destructiveHint": True,
            "idempotentHint": False,
            "openWorldHint": False,
        },
        "_meta": {
            "eai/tool": {
                "name": "eai_invocation_cancel",
                "version": SERVER_INFO["version"],
                "risk_class": "low",
                "action_class": "write",
                "requires_approval": False,
                "cost": _GATEWAY_COST,
            }
        },
    },
}
assert tuple(sorted(GATEWAY_TOOLS)) == MCP_GATEWAY_TOOLS


class RpcError(Exception):
    """A JSON-RPC error: `code`, and the envelope's `error` object as its `data`."""

    def __init__(
        self, code: int, error: ApiError, *, status: int | None = None, extra: Any = None
    ) -> None:
        self.code = code
        self.error = error
        self.status = status or ERROR_CODE_HTTP_STATUS.get(code, 200)
        self.extra = extra or {}
        super().__init__(error.code)


@dataclass
class Reply:
    """What the view sends: an HTTP status and a JSON-RPC body (None: 202, no body)."""

    status: int
    body: dict[str, Any] | None


# ------------------------------------------------------------------------ entry


def answer(*, key: ApiKey, raw: bytes, request: Any) -> Reply:
    """The reply to one POSTed JSON-RPC message, for a caller whose key is valid."""
    request_id: Any = None
    try:
        message = _decode(raw)
        if "id" not in message:
            return _notification(message, request)
        request_id = _request_id(message)
        version, params = _route(message, request)
        result = _dispatch(key, message["method"], version, params, request)
        return Reply(200, {"jsonrpc": "2.0", "id": request_id, "result": result})
    except RpcError as exc:
        return Reply(exc.status, _error_body(request_id, exc, request))
    except Exception:
        # A fault of ours, said as JSON-RPC so the client can match it to its request.
        logger.exception("MCP request failed")
        exc = RpcError(jsonrpc.INTERNAL_ERROR, ApiError("internal_error"), status=500)
        return Reply(500, _error_body(request_id, exc, request))


def _error_body(request_id: Any, exc: RpcError, request: Any) -> dict[str, Any]:
    data = envelope(request, exc.error)["error"]
    data.update(exc.extra)
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "error": {"code": exc.code, "message": data["message"], "data": data},
    }


def _decode(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        reason = Text(_("the body is empty"))
        raise RpcError(jsonrpc.PARSE_ERROR, ApiError("invalid_json", reason=reason))
    try:
        message = loads_strict(raw)
    except JSONInvalid as exc:
        raise RpcError(jsonrpc.PARSE_ERROR, ApiError("invalid_json", reason=exc.reason)) from exc
    except UnicodeDecodeError as exc:
        reason = Text(_("the body is not UTF-8"))
        raise RpcError(jsonrpc.PARSE_ERROR, ApiError("invalid_json", reason=reason)) from exc
    if isinstance(message, list):
        raise _invalid_request(_("a batch (a JSON array) is not accepted: send one message"))
    if not isinstance(message, dict):
        raise _invalid_request(_("the body must be one JSON-RPC message (a JSON object)"))
    return message


def _invalid_request(why: Any) -> RpcError:
    return RpcError(jsonrpc.INVALID_REQUEST, ApiError("invalid_request", reason=Text(why)))


def _request_id(message: dict[str, Any]) -> Any:
    """The request's id, once its envelope is a JSON-RPC 2.0 request's."""
    request_id = message["id"]
    valid_id = isinstance(request_id, str) or (
        isinstance(request_id, int) and not isinstance(request_id, bool)
    )
    if (
        message.get("jsonrpc") != "2.0"
        or not valid_id
        or not isinstance(message.get("method"), str)
        or not isinstance(message.get("params", {}), dict)
        or "result" in message
        or "error" in message
    ):
        raise _invalid_request(_("the body is not a JSON-RPC 2.0 request"))
    return request_id


def _notification(message: dict[str, Any], request: Any) -> Reply:
    """A notification is acknowledged (202, no body) and dropped: nothing is kept
    between requests for one to act on. A version the server does not serve is said."""
    if (
        message.get("jsonrpc") != "2.0"
        or not isinstance(message.get("method"), str)
        or not isinstance(message.get("params", {}), dict)
    ):
        raise _invalid_request(_("the body is not a JSON-RPC 2.0 message"))
    version = request.headers.get(MCP_PROTOCOL_VERSION_HEADER)
    if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
        rejection = unsupported_protocol_version_rejection(version)
        if rejection is not None:
            raise _ladder_error(rejection)
    return Reply(202, None)


def _route(message: dict[str, Any], request: Any) -> tuple[str, dict[str, Any] | None]:
    """The protocol revision the request is read at, after the stateless era's header
    ladder; and its params, checked against that revision's schema."""
    method, params = message["method"], message.get("params")
    header = request.headers.get(MCP_PROTOCOL_VERSION_HEADER)
    if header is None or header in HANDSHAKE_PROTOCOL_VERSIONS:
        version = header or UNVERSIONED
    else:
        headers = {
            name: value
            for name in (MCP_PROTOCOL_VERSION_HEADER, MCP_METHOD_HEADER, MCP_NAME_HEADER)
            if (value := request.headers.get(name)) is not None
        }
        verdict = classify_inbound_request(message, headers=headers)
        if isinstance(verdict, InboundLadderRejection):
            raise _ladder_error(verdict)
        version = verdict.protocol_version
    try:
        wire.validate_client_request(method, version, params)
    except KeyError:
        raise RpcError(
            jsonrpc.METHOD_NOT_FOUND, ApiError("mcp_method_not_found", method=method[:100])
        ) from None
    except ValidationError as exc:
        raise _invalid_params(_first_problem(exc)) from None
    return version, params


def _ladder_error(rejection: InboundLadderRejection) -> RpcError:
    if rejection.code == jsonrpc.UNSUPPORTED_PROTOCOL_VERSION:
        data = rejection.data or {}
        error = ApiError(
            "mcp_unsupported_version",
            version=str(data.get("requested", ""))[:50],
            supported=", ".join(data.get("supported", [])),
            details=data,
        )
        return RpcError(rejection.code, error, extra=data)
    if rejection.code == jsonrpc.HEADER_MISMATCH:
        reason = next(
            (why for head, why in _MISMATCHES if rejection.message.lower().startswith(head)),
            rejection.message,
        )
        return RpcError(rejection.code, ApiError("mcp_header_mismatch", reason=reason))
    why = Text(_("params._meta must carry the protocol version and the client capabilities"))
    return RpcError(rejection.code, ApiError("mcp_invalid_params", reason=why))


# The SDK's ladder says which header disagrees, in English; the envelope says it in both.
_MISMATCHES = (
    (
        MCP_PROTOCOL_VERSION_HEADER,
        Text(_("MCP-Protocol-Version differs from the protocol version in params._meta")),
    ),
    (MCP_METHOD_HEADER, Text(_("Mcp-Method differs from the method"))),
    (MCP_NAME_HEADER, Text(_("Mcp-Name differs from the name in params"))),
    ("mcp-param-", Text(_("an Mcp-Param header differs from its argument"))),
)


# What a validation error of the SDK's wire models says, in both languages (pydantic's
# own messages are English only); any other kind reads "is invalid".
_PROBLEMS = {
    "missing": _("%(where)s is required"),
    "dict_type": _("%(where)s must be an object"),
    "model_type": _("%(where)s must be an object"),
    "model_attributes_type": _("%(where)s must be an object"),
    "list_type": _("%(where)s must be an array"),
    "string_type": _("%(where)s must be a string"),
    "int_type": _("%(where)s must be an integer"),
    "int_parsing": _("%(where)s must be an integer"),
    "int_from_float": _("%(where)s must be an integer"),
    "float_type": _("%(where)s must be a number"),
    "float_parsing": _("%(where)s must be a number"),
    "bool_type": _("%(where)s must be a boolean"),
    "bool_parsing": _("%(where)s must be a boolean"),
    "literal_error": _("%(where)s is not one of the allowed values"),
    "enum": _("%(where)s is not one of the allowed values"),
    "extra_forbidden": _("%(where)s is not allowed"),
    "string_too_long": _("%(where)s is too long"),
    "string_too_short": _("%(where)s is too short"),
}


def _first_problem(exc: ValidationError) -> Text:
    """Where and what, never the offending value (it may be personal data)."""
    problem = exc.errors(include_input=False, include_url=False)[0]
    where = ".".join(str(part) for part in problem["loc"] if part not in ("params",))
    template = _PROBLEMS.get(problem["type"], _("%(where)s is invalid"))
    return Text(template, where=(where or "params")[:200])


def _invalid_params(reason: Any) -> RpcError:
    return RpcError(jsonrpc.INVALID_PARAMS, ApiError("mcp_invalid_params", reason=reason))


# --------------------------------------------------------------------- methods


def _dispatch(
    key: ApiKey, method: str, version: str, params: dict[str, Any] | None, request: Any
) -> dict[str, Any]:
    params = params or {}
    if method == "initialize":
        offered = params.get("protocolVersion")
        result: dict[str, Any] = {
            "protocolVersion": offered
            if offered in HANDSHAKE_VERSIONS
            else LATEST_HANDSHAKE_VERSION,
            "capabilities": CAPABILITIES,
            "serverInfo": SERVER_INFO,
            "instructions": INSTRUCTIONS,
        }
    elif method == "ping":
        result = {}
    elif method == "server/discover":
        result = {
            "supportedVersions": [MODERN_VERSION],
            "capabilities": CAPABILITIES,
            "instructions": INSTRUCTIONS,
            "cacheScope": "private",
            "ttlMs": 0,
        }
    elif method == "tools/list":
        result = list_tools(key, params.get("cursor"))
        if version == MODERN_VERSION:
            # Per key: never shared across authorization contexts, never kept stale.
            result.update(cacheScope="private", ttlMs=0)
    elif method == "tools/call":
        result = call_tool(key, params, request, version)
    else:  # a method of the schema this server does not offer (resources, prompts, …)
        error = ApiError("mcp_method_not_found", method=method[:100])
        raise RpcError(jsonrpc.METHOD_NOT_FOUND, error)
    if version == MODERN_VERSION:
        result["resultType"] = "complete"
        result["_meta"] = {**result.get("_meta", {}), SERVER_INFO_META_KEY: SERVER_INFO}
    if method == "tools/call":
        # Built here in one fixed shape (the conformance suite's wire-schema check holds
        # it to both revisions' schemas); validating every call's structuredContent
        # again would cost the hot path a copy of the whole invocation.
        return result
    return wire.serialize_server_result(method, version, result)


# ----------------------------------------------------------------- tools/list


def list_tools(key: ApiKey, cursor: Any) -> dict[str, Any]:
    """One page of the tools this key may call, sorted by MCP name; `nextCursor` is the
    last name given. The filter is the policy's scope predicate (`policy.missing_scopes`,
    the query the call's decision reads), so a listed tool is never refused for scopes
    and an unlisted one never allowed."""
    if not key.has_scope("tools:read"):
        raise RpcError(FORBIDDEN, ApiError("insufficient_scope", scope="tools:read"), status=403)
    if cursor is not None and (not isinstance(cursor, str) or mcp_tool_name(cursor) != cursor):
        raise RpcError(jsonrpc.INVALID_PARAMS, ApiError("invalid_cursor"))
    principal = policy.principal_input(key)
    with tenant_scope(key.tenant, readonly=True):
        tools = list(Tool.objects.for_tenant(key.tenant).filter(disabled=False))
    listed: dict[str, dict[str, Any]] = {}
    for tool in tools:
        tool_facts = policy.tool_input(tool.name, tool.version, tool.spec)
        if not policy.missing_scopes(principal, tool_facts):
            listed.setdefault(tool.mcp_name, _tool_entry(tool))
    if key.has_scope("tools:invoke") or key.has_scope("invocations:read"):
        listed["eai_invocation_get"] = GATEWAY_TOOLS["eai_invocation_get"]
    if key.has_scope("tools:invoke"):
        listed["eai_invocation_cancel"] = GATEWAY_TOOLS["eai_invocation_cancel"]
    names = sorted(name for name in listed if cursor is None or name > cursor)
    page = names[:PAGE_SIZE]
    result: dict[str, Any] = {"tools": [listed[name] for name in page]}
    if len(names) > PAGE_SIZE:
        result["nextCursor"] = page[-1]
    return result


def _tool_entry(tool: Tool) -> dict[str, Any]:
    """A catalog tool as MCP lists it (SPEC §10)."""
    spec, meta = tool.spec, tool.manifest["metadata"]
    action, risk = spec["action_class"], spec["risk_class"]
    return {
        "name": tool.mcp_name,
        "title": tool.name,
        "description": meta.get("description", ""),
        # MCP requires `type: object` at the root (one tool without it would make hosts
        # drop the whole list), and an invoke's input is always a JSON object anyway.
        "inputSchema": {**spec["input_schema"], "type": "object"},
        "outputSchema": INVOCATION_SCHEMA,
        "annotations": {
            "readOnlyHint": action == "read",
            "destructiveHint": action in ("write", "execute", "payment")
            or risk in ("high", "critical"),
            "idempotentHint": bool(spec["idempotent"]),
            "openWorldHint": spec["network"] == "external",
        },
        "_meta": {
            "eai/tool": {
                "name": tool.name,
                "version": tool.version,
                "risk_class": risk,
                "action_class": action,
                "requires_approval": bool(spec["requires_approval"]),
                "cost": spec["cost"],
            }
        },
    }


# MCP name -> manifest name, per tenant, kept as the pipeline keeps tools (1 s; forgotten
# when a tool changes in this process). Only names: the pipeline reads the tool itself.
_names: ProcessCache[dict[str, str]] = ProcessCache(pipeline.TOOL_CACHE_S)


def _forget_names(**kwargs: Any) -> None:
    _names.clear()


post_save.connect(_forget_names, sender=Tool, dispatch_uid="eai-mcp-names")
post_delete.connect(_forget_names, sender=Tool, dispatch_uid="eai-mcp-names-del")


def _manifest_name(tenant: Any, name: str) -> str | None:
    """The tenant's tool a `tools/call` names, by MCP or manifest name; None if none."""

    def read(_key: Any) -> dict[str, str]:
        with tenant_scope(tenant, readonly=True):
            rows = Tool.objects.for_tenant(tenant).order_by("name").values_list("name", flat=True)
            found: dict[str, str] = {}
            for manifest_name in rows:
                # Apply refuses collisions; a pair applied before that rule keeps the
                # first by name (the other stays callable by its manifest name).
                found.setdefault(mcp_tool_name(manifest_name), manifest_name)
                found.setdefault(manifest_name, manifest_name)
            return found

    return _names.get(tenant.pk, read).get(name)


# ----------------------------------------------------------------- tools/call

_PARKED = _(
    "This call waits for human approval %(approval_id)s. Do not call the tool again: "
    "call eai_invocation_get with invocation_id %(invocation_id)s later to learn its outcome."
)


def call_tool(key: ApiKey, params: dict[str, Any], request: Any, version: str) -> dict[str, Any]:
    """`tools/call`: a gateway tool, or a catalog tool through the pipeline (§1)."""
    name = params["name"]
    arguments = params.get("arguments") or {}
    if name in GATEWAY_TOOLS:
        invocation, is_error = _gateway_tool(key, name, arguments)
        return _tool_result(invocation, is_error, request)
    tool_name = _manifest_name(key.tenant, name)
    if tool_name is None:
        shown = dlp.scrub_text(name)[0][:200]
        raise RpcError(jsonrpc.INVALID_PARAMS, ApiError("tool_not_found", tool=shown))
    if version == MODERN_VERSION:
        _check_param_headers(key, tool_name, arguments, request)
    meta = params.get("_meta") or {}
    body: dict[str, Any] = {"input": arguments}
    run_id, step = meta.get("eai/run_id"), meta.get("eai/step_index")
    if run_id is not None:
        if not isinstance(run_id, str) or not RUN_ID_RE.match(run_id):
            raise _invalid_params(_("_meta eai/run_id is not a valid run id"))
        body["run_id"] = run_id
    if step is not None:
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 2**31:
            why = _("_meta eai/step_index must be a non-negative integer")
            raise _invalid_params(why)
        body["step_index"] = step
    idempotency_key = meta.get("eai/idempotency_key")
    if idempotency_key is not None:
        if not isinstance(idempotency_key, str):
            why = _("_meta eai/idempotency_key must be a string")
            raise _invalid_params(why)
        body["idempotency_key"] = idempotency_key
    traceparent = meta.get("traceparent")
    if isinstance(traceparent, str):
        # The MCP convention for trace context is `_meta`; the pipeline's span reads it
        # where it reads the HTTP header (this request's META: it lives for this call).
        request.META["HTTP_TRACEPARENT"] = traceparent
        if isinstance(meta.get("tracestate"), str):
            request.META["HTTP_TRACESTATE"] = meta["tracestate"]
    outcome = pipeline.invoke(
        key=key,
        tool_name=tool_name,
        body=body,
        request=request,
        idempotency_key=request.headers.get("Idempotency-Key"),
        door=Invocation.MCP,
    )
    invocation, is_error = _from_outcome(key, outcome)
    metrics.observe_mcp_call(tool_name, invocation["status"])
    # A 2xx answer's bytes are the invocation's JSON already: the text block reuses them.
    text = outcome.content.decode() if outcome.status < 300 else None
    result = _tool_result(invocation, is_error, request, text)
    if outcome.headers.get("Idempotent-Replayed"):
        result["_meta"] = {"eai/idempotent_replayed": True}
    return result


def _check_param_headers(key: ApiKey, tool_name: str, arguments: Any, request: Any) -> None:
    """The stateless era's `Mcp-Param-*` headers (mirrors of arguments a tool's input
    schema marks with `x-mcp-header`, for proxies that route on them) must agree with the
    body, as the SDK's check says; a disagreement is refused before anything runs."""
    headers = {k: v for k, v in request.headers.items() if k.lower().startswith("mcp-param-")}
    if not headers and not arguments:
        return
    tool = pipeline.read_tool(key.tenant, tool_name)
    if tool is None or not isinstance(arguments, dict):
        return
    rejection = validate_mcp_param_headers(tool.spec["input_schema"], arguments, headers)
    if rejection is not None:
        raise _ladder_error(rejection)


# The status a refusal made before any invocation exists is reported with.
_REFUSAL_STATUS = {403: Invocation.DENIED, 429: Invocation.DENIED, 503: Invocation.UNAVAILABLE}


def _from_outcome(key: ApiKey, outcome: pipeline.Outcome) -> tuple[dict[str, Any], bool]:
    """The invocation object an answer of the pipeline stands for, and whether it is an
    error: the stored (masked) invocation when one exists, else `{status, error,
    decision_id}`."""
    body = orjson.loads(outcome.content)
    if outcome.status < 300:
        return body, False
    error = body["error"]
    invocation_id = error.get("invocation_id")
    if invocation_id:
        with tenant_scope(key.tenant, readonly=True):
            stored = Invocation.objects.for_tenant(key.tenant).filter(pk=invocation_id).first()
        if stored is not None:
            return stored.as_dict(), True
    refusal: dict[str, Any] = {
        "status": _REFUSAL_STATUS.get(outcome.status, Invocation.FAILED),
        "error": {"code": error["code"], "message": error["message"]},
        "decision_id": error.get("decision_id"),
    }
    if error.get("details"):
        refusal["error"]["details"] = error["details"]
    if invocation_id:
        refusal["invocation_id"] = invocation_id
    return refusal, True


def _gateway_tool(key: ApiKey, name: str, arguments: Any) -> tuple[dict[str, Any], bool]:
    invocation_id = arguments.get("invocation_id") if isinstance(arguments, dict) else None
    if not isinstance(invocation_id, str) or set(arguments) != {"invocation_id"}:
        return _refused(ApiError("invalid_input", details={"errors": [_ID_REQUIRED]})), True
    try:
        if name == "eai_invocation_cancel":
            if not key.has_scope("tools:invoke"):
                raise ApiError("insufficient_scope", scope="tools:invoke")
            cancelled = pipeline.cancel_invocation(key=key, invocation_id=invocation_id)
            return cancelled.as_dict(), False
        with tenant_scope(key.tenant, readonly=True):
            found = Invocation.objects.for_tenant(key.tenant).filter(pk=invocation_id).first()
        # An agent reads its own calls; another key's needs `invocations:read`.
        if found is None or not (
            found.api_key_id == key.public_id or key.has_scope("invocations:read")
        ):
            raise ApiError("not_found")
        return found.as_dict(), False
    except ApiError as error:
        return _refused(error), True


_ID_REQUIRED = {"path": "", "message": "'invocation_id' (a tinv_... string) is required"}


def _refused(error: ApiError) -> dict[str, Any]:
    """A gateway tool's refusal as the invocation schema's refusal shape (English, as a
    stored invocation's error is)."""
    refusal: dict[str, Any] = {
        "status": _REFUSAL_STATUS.get(error.status, Invocation.FAILED),
        "error": {"code": error.code, "message": render_message(error.code, error.params, "en")},
        "decision_id": None,
    }
    if error.details:
        refusal["error"]["details"] = error.details
    return refusal


def _tool_result(
    invocation: dict[str, Any], is_error: bool, request: Any, text: str | None = None
) -> dict[str, Any]:
    if text is None:
        text = json.dumps(invocation, ensure_ascii=False)
    if invocation.get("status") == Invocation.WAITING_APPROVAL and not is_error:
        params = {
            "approval_id": invocation.get("approval_id"),
            "invocation_id": invocation.get("invocation_id"),
        }
        text = render_message_text(_PARKED, params, request) + "\n\n" + text
    return {
        "content": [{"type": "text", "text": text}],
        "structuredContent": invocation,
        "isError": is_error,
    }


def render_message_text(template: Any, params: dict[str, Any], request: Any) -> str:
    """`template` in the request's language (Accept-Language)."""
    with translation.override(request_language(request)):
        return str(template) % params
