"""The OpenAPI 3.1 document's bodies and statuses (`GET /v1/openapi.json`).

drf-spectacular derives the paths, methods and parameters from the views; this module
gives every body a named component and every operation every status it can answer, in
one table, through a post-processing hook (`describe`). The components are the wire
shapes the views produce (`Invocation.as_dict`, `runs.run_state`, …); the TypeScript
SDK's types are generated from this document, so a shape that changes here breaks that
build, and tests/test_openapi_document.py checks real answers against it.
"""

from __future__ import annotations

import copy
from typing import Any

REF = "#/components/schemas/"


def ref(name: str) -> dict[str, Any]:
    return {"$ref": REF + name}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def page(item: str) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["results", "next_cursor"],
        "properties": {
            "results": {"type": "array", "items": ref(item)},
            "next_cursor": {
                "type": ["string", "null"],
                "description": "Give it as `cursor` for the next page; null at the end.",
            },
        },
    }


STRING = {"type": "string"}
TIME = {"type": "string", "format": "date-time"}
ID = {"type": "string", "minLength": 1}
RUN_ID = {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.:\\-]{0,199}$"}
OBJECT = {"type": "object", "additionalProperties": True}
STATUSES = [
    "waiting_approval",
    "queued",
    "running",
    "succeeded",
    "failed",
    "denied",
    "unavailable",
    "timed_out",
    "cancelled",
    "expired",
]

SCHEMAS: dict[str, dict[str, Any]] = {
    "Error": {
        "type": "object",
        "description": "The error envelope every non-2xx answer carries (SPEC §3).",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message", "message_i18n", "request_id"],
                "properties": {
                    "code": {"type": "string", "description": "Stable snake_case code."},
                    "message": {"type": "string", "description": "In Accept-Language."},
                    "message_i18n": {
                        "type": "object",
                        "required": ["en", "fr"],
                        "properties": {"en": STRING, "fr": STRING},
                    },
                    "details": OBJECT,
                    "request_id": {"type": "string", "pattern": "^req_"},
                    "decision_id": {"type": ["string", "null"]},
                    "invocation_id": {"type": ["string", "null"]},
                },
            }
        },
    },
    "Money": {
        "type": "object",
        "required": ["amount", "currency"],
        "properties": {
            "amount": {"type": "string", "description": 'A decimal, e.g. "0.001".'},
            "currency": {"type": "string", "minLength": 3, "maxLength": 3},
        },
    },
    "Redaction": {
        "type": "object",
        "required": ["entity", "count", "where"],
        "properties": {
            "entity": {"enum": ["IBAN", "CREDIT_CARD", "EMAIL", "PHONE", "NIR", "SECRET"]},
            "count": {"type": "integer", "minimum": 1},
            "where": {"type": "string"},
        },
    },
    "InvocationError": {
        "type": "object",
        "required": ["code", "message"],
        "properties": {"code": STRING, "message": STRING},
    },
    "Invocation": {
        "type": "object",
        "description": "One tool call, the same shape everywhere (input and output masked).",
        "required": [
            "invocation_id",
            "tool",
            "tool_version",
            "status",
            "input",
            "output",
            "decision_id",
            "approval_id",
            "cost",
            "run_id",
            "step_index",
            "redactions",
            "created_at",
            "finished_at",
        ],
        "properties": {
            "invocation_id": {"type": "string", "pattern": "^tinv_"},
            "tool": STRING,
            "tool_version": STRING,
            "status": {"enum": STATUSES},
            "input": {"type": ["object", "null"], "additionalProperties": True},
            "output": {"description": "The tool's output (masked, bounded), null until done."},
            "decision_id": {"type": ["string", "null"]},
            "approval_id": {"type": ["string", "null"]},
            "cost": nullable(ref("Money")),
            "run_id": {"type": ["string", "null"]},
            "step_index": {"type": ["integer", "null"]},
            "redactions": {"type": "array", "items": ref("Redaction")},
            "agent": {"type": ["string", "null"]},
            "created_at": TIME,
            "finished_at": {"type": ["string", "null"], "format": "date-time"},
            "object_refs": {"type": "array"},
            "artifacts": {"type": "array"},
            "observations": {"type": "array"},
            "provenance_refs": {"type": "array"},
            "diagnostic": {"type": ["string", "null"]},
            "error": ref("InvocationError"),
        },
    },
    "InvocationPage": page("Invocation"),
    "InvokeRequest": {
        "type": "object",
        "required": ["input"],
        "additionalProperties": False,
        "properties": {
            "input": {
                "type": "object",
                "additionalProperties": True,
                "description": "Checked against the tool's input_schema.",
            },
            "run_id": {**RUN_ID, "description": "An unknown run id creates that run."},
            "step_index": {"type": "integer", "minimum": 0, "maximum": 2147483647},
            "idempotency_key": {"type": "string", "pattern": "^[\\x21-\\x7e]{1,255}$"},
        },
    },
    "Tool": {
        "type": "object",
        "description": "A tool of the catalog: its manifest's spec fields at top level.",
        "required": ["name", "version"],
        "properties": {
            "name": STRING,
            "version": STRING,
            "description": STRING,
            "availability": {},
            "input_schema": OBJECT,
            "output_schema": {"type": ["object", "null"]},
            "scopes_required": {"type": "array", "items": STRING},
            "requires_approval": {"type": "boolean"},
            "risk_class": {"enum": ["low", "medium", "high", "critical"]},
            "action_class": {"enum": ["read", "write", "execute", "payment", "communication"]},
            "idempotent": {"type": "boolean"},
            "cost": nullable(ref("Money")),
        },
    },
    "ToolPage": page("Tool"),
    "Decision": {
        "type": "object",
        "required": ["decision_id", "action", "result", "obligations", "policy_version"],
        "properties": {
            "decision_id": {"type": "string", "pattern": "^dec_"},
            "action": STRING,
            "tool": {"type": ["string", "null"]},
            "tool_version": {"type": ["string", "null"]},
            "result": {"type": "string"},
            "allow": {"type": "boolean"},
            "reasons": {"type": "array", "items": STRING},
            "obligations": {"type": "array"},
            "policy_version": STRING,
            "input_digest": STRING,
            "api_key_id": {"type": ["string", "null"]},
            "agent": {"type": ["string", "null"]},
            "created_at": TIME,
        },
    },
    "Approval": {
        "type": "object",
        "required": ["approval_id", "status", "tool", "invocation_id"],
        "properties": {
            "approval_id": {"type": "string", "pattern": "^apr_"},
            "status": STRING,
            "tool": STRING,
            "risk_class": STRING,
            "invocation_id": STRING,
            "decision_id": {"type": ["string", "null"]},
            "policy_version": {"type": ["string", "null"]},
            "input_digest": {"type": ["string", "null"]},
            "input": {"type": ["object", "null"]},
            "agent": {"type": ["string", "null"]},
            "run_id": {"type": ["string", "null"]},
            "min_approvers": {"type": "integer"},
            "decisions": {"type": "array", "items": OBJECT},
            "created_at": TIME,
            "expires_at": {"type": ["string", "null"], "format": "date-time"},
            "decided_at": {"type": ["string", "null"], "format": "date-time"},
        },
    },
    "ApprovalPage": page("Approval"),
    "ApprovalDecisionRequest": {
        "type": "object",
        "required": ["verdict", "reason"],
        "additionalProperties": False,
        "properties": {
            "verdict": {"enum": ["approve", "deny"]},
            "reason": {"type": "string", "minLength": 1},
        },
    },
    "Run": {
        "type": "object",
        "description": "An agent turn: its state and its calls.",
        "required": ["run_id", "status"],
        "properties": {
            "run_id": STRING,
            "status": STRING,
            "agent": {"type": ["string", "null"]},
            "created_at": TIME,
            "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
            "pending_invocations": {"type": "array"},
            "invocations": {"type": "array", "items": ref("Invocation")},
            "last_sequence": {"type": ["integer", "null"]},
        },
    },
    "RunCreateRequest": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "run_id": {"anyOf": [RUN_ID, {"type": "null"}], "description": "Null: one is made."},
            "goal": STRING,
        },
    },
    "Event": {
        "type": "object",
        "required": [
            "sequence",
            "type",
            "created_at",
            "run_id",
            "invocation_id",
            "refs",
            "payload",
        ],
        "properties": {
            "event_id": STRING,
            "sequence": {"type": "integer"},
            "type": {
                "enum": [
                    "agent.turn.started",
                    "agent.plan.updated",
                    "agent.tool.requested",
                    "agent.tool.started",
                    "agent.tool.completed",
                    "agent.authorization.required",
                    "agent.authorization.decided",
                    "agent.turn.completed",
                    "agent.error",
                ]
            },
            "created_at": TIME,
            "run_id": {"type": ["string", "null"]},
            "invocation_id": {"type": ["string", "null"]},
            "refs": OBJECT,
            "payload": OBJECT,
        },
    },
    "EventPage": page("Event"),
    "UsageAggregate": {
        "type": "object",
        "required": ["unit", "currency", "events", "quantity", "amount"],
        "properties": {
            "unit": STRING,
            "currency": {"type": ["string", "null"]},
            "events": {"type": "integer"},
            "quantity": STRING,
            "amount": {"type": ["string", "null"]},
            "tool": {"type": ["string", "null"]},
            "agent": {"type": ["string", "null"]},
            "run_id": {"type": ["string", "null"]},
        },
    },
    "UsageAggregatePage": page("UsageAggregate"),
    "UsageAccepted": {
        "type": "object",
        "required": ["accepted", "usage_ids"],
        "properties": {"accepted": {"type": "integer"}, "usage_ids": {"type": "array"}},
    },
    "UsageEventIn": {
        "type": "object",
        "required": ["unit"],
        "additionalProperties": False,
        "properties": {
            "unit": STRING,
            "quantity": {"type": ["string", "number"]},
            "amount": {"type": ["string", "number"]},
            "currency": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "tool": {"type": "string", "maxLength": 200},
            "agent": {"type": "string", "maxLength": 200},
            "run_id": RUN_ID,
            "occurred_at": {"type": "string", "format": "date-time"},
        },
    },
    "UsageReport": {
        "anyOf": [
            {
                "type": "object",
                "required": ["events"],
                "additionalProperties": False,
                "properties": {
                    "events": {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": 1000,
                        "items": ref("UsageEventIn"),
                    }
                },
            },
            ref("UsageEventIn"),
            {"type": "array", "minItems": 1, "maxItems": 1000, "items": ref("UsageEventIn")},
        ]
    },
    "AuditEvent": {
        "type": "object",
        "required": [
            "seq",
            "action",
            "actor",
            "object_ref",
            "created_at",
            "payload",
            "prev_hash",
            "hash",
        ],
        "properties": {
            "seq": {"type": "integer", "minimum": 1},
            "action": STRING,
            "actor": STRING,
            "object_ref": STRING,
            "created_at": TIME,
            "payload": OBJECT,
            "prev_hash": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
            "hash": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
        },
    },
    "AuditEventPage": page("AuditEvent"),
    "AuditVerification": {
        "type": "object",
        "required": ["valid", "length", "head_hash", "first_invalid_seq"],
        "properties": {
            "valid": {"type": "boolean"},
            "length": {"type": "integer"},
            "head_hash": {"type": ["string", "null"]},
            "first_invalid_seq": {"type": ["integer", "null"]},
            "proven_through_seq": {"type": ["integer", "null"]},
            "last_full_verification_at": {"type": ["string", "null"], "format": "date-time"},
            "unproven_entries": {
                "type": "integer",
                "description": "Entries after proven_through_seq: the next checkpoint covers them.",
            },
            "coverage": {"type": "string", "description": "The same, said in Accept-Language."},
        },
    },
    "ManifestApplyResult": {
        "type": "object",
        "required": ["dry_run", "results"],
        "properties": {
            "dry_run": {"type": "boolean"},
            "results": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["kind", "name", "version", "status", "diff"],
                    "properties": {
                        "kind": STRING,
                        "name": STRING,
                        "version": STRING,
                        "status": {"enum": ["created", "updated", "unchanged"]},
                        "diff": {"type": "array"},
                    },
                },
            },
        },
    },
    "ManifestApplyRequest": {
        "description": 'One manifest, or {"manifests": [...]}, in JSON or YAML.',
        "type": "object",
    },
    "ContractValidation": {
        "type": "object",
        "required": ["valid", "errors"],
        "properties": {
            "valid": {"type": "boolean"},
            "errors": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["path", "message"],
                    "properties": {"path": STRING, "message": STRING},
                },
            },
        },
    },
    "JsonSchema": {"type": "object", "description": "A JSON Schema (2020-12)."},
    "AnyDocument": {"description": "Any JSON document: the verdict says whether it conforms."},
}

# Statuses every API route can answer: a body that is not JSON or too deep (400), no or
# a bad key (401), a missing scope (403), a tenant over its share of the server (429),
# the database or the audit chain unavailable (503).
COMMON = {
    "400": "Malformed request (`invalid_json`, `invalid_request`).",
    "401": "Missing, malformed, unknown or revoked API key (`unauthenticated`).",
    "403": "A scope the key lacks (`insufficient_scope`).",
    "406": "The Accept header asks for something other than JSON (`not_acceptable`).",
    "429": "The tenant holds its share of the server (`rate_limited`, Retry-After).",
    "503": "A dependency is unavailable (`audit_unavailable`, …).",
}
BODY = {
    "413": "The body is larger than EAI_MAX_REQUEST_BYTES (`payload_too_large`).",
    "415": "The body is not JSON (`unsupported_media_type`).",
}

# operationId → (request body component or None, {status: (description, component)}).
OPERATIONS: dict[str, tuple[str | None, dict[str, tuple[str, str | None]]]] = {
    "Invoke_post": (
        "InvokeRequest",
        {
            "200": ("The finished invocation (`succeeded`).", "Invocation"),
            "202": ("Waiting for approval, queued or running.", "Invocation"),
            "403": ("Denied (`policy_denied`, `dlp_blocked`, `budget_exceeded`, …).", "Error"),
            "404": ("No such tool in this tenant's catalog (`tool_not_found`).", "Error"),
            "409": ("`idempotency_conflict` or `idempotency_in_progress`.", "Error"),
            "429": ("`rate_limited` (Retry-After).", "Error"),
            "502": ("The tool failed (`tool_error`, `invalid_output`).", "Error"),
            "503": ("`tool_unavailable` or `audit_unavailable`.", "Error"),
            "504": ("The tool timed out (`tool_timeout`).", "Error"),
        },
    ),
    "ToolList_get": (None, {"200": ("A page of the catalog.", "ToolPage")}),
    "ToolDetail_get": (
        None,
        {"200": ("One tool.", "Tool"), "404": ("`tool_not_found`.", "Error")},
    ),
    "InvocationList_get": (None, {"200": ("A page of invocations.", "InvocationPage")}),
    "InvocationDetail_get": (
        None,
        {
            "200": ("The invocation, whatever its status.", "Invocation"),
            "404": ("`not_found`.", "Error"),
        },
    ),
    "InvocationCancel_post": (
        None,
        {
            "200": ("The cancelled invocation.", "Invocation"),
            "404": ("`not_found`.", "Error"),
            "409": ("The invocation can no longer be cancelled.", "Error"),
        },
    ),
    "Decision_get": (
        None,
        {"200": ("One decision.", "Decision"), "404": ("`not_found`.", "Error")},
    ),
    "Artifact_get": (
        None,
        {
            "200": ("The artifact's body, as stored after DLP.", None),
            "404": ("`not_found`.", "Error"),
        },
    ),
    "Contract_get": (
        None,
        {"200": ("The JSON Schema.", "JsonSchema"), "404": ("`contract_not_found`.", "Error")},
    ),
    "ContractValidate_post": (
        "AnyDocument",
        {"200": ("The verdict.", "ContractValidation"), "404": ("`contract_not_found`.", "Error")},
    ),
    "ManifestApply_post": (
        "ManifestApplyRequest",
        {
            "200": ("What was (or would be) applied.", "ManifestApplyResult"),
            "422": ("`manifest_invalid`: nothing applied; details.errors.", "Error"),
        },
    ),
    "AuditEvents_get": (None, {"200": ("A page of the chain, oldest first.", "AuditEventPage")}),
    "AuditVerify_get": (None, {"200": ("The chain's verification.", "AuditVerification")}),
    "Events_get": (None, {"200": ("Events after the cursor.", "EventPage")}),
    "FinopsUsage_get": (None, {"200": ("Aggregates.", "UsageAggregatePage")}),
    "FinopsUsage_post": (
        "UsageReport",
        {"201": ("Recorded.", "UsageAccepted")},
    ),
    "Runs_post": (
        "RunCreateRequest",
        {"201": ("The run.", "Run"), "409": ("`run_exists`.", "Error")},
    ),
    "RunDetail_get": (None, {"200": ("The run.", "Run"), "404": ("`not_found`.", "Error")}),
    "RunResume_post": (None, {"200": ("The run.", "Run"), "404": ("`not_found`.", "Error")}),
    "ApprovalList_get": (None, {"200": ("A page of approval requests.", "ApprovalPage")}),
    "ApprovalDecision_post": (
        "ApprovalDecisionRequest",
        {
            "200": ("The approval request after the decision.", "Approval"),
            "404": ("`not_found`.", "Error"),
            "409": ("Already decided, expired, or the reviewer's own call.", "Error"),
        },
    ),
}


# Routes outside DRF (SPEC §4's table): MCP's JSON-RPC door and the machine routes.
MACHINE_SCHEMAS: dict[str, Any] = {
    "McpMessage": {
        "type": "object",
        "description": (
            "One JSON-RPC 2.0 message (SPEC §10): a request (`id`: a string or an integer) "
            "or a notification (no `id`). Methods: initialize, ping, server/discover, "
            "tools/list, tools/call, notifications/*. A batch (an array) is refused. "
            "Headers: MCP-Protocol-Version (2025-06-18, 2025-11-25 or 2026-07-28), and "
            "for 2026-07-28 Mcp-Method and Mcp-Name."
        ),
        "required": ["jsonrpc", "method"],
        "properties": {
            "jsonrpc": {"type": "string", "const": "2.0"},
            "id": {"type": ["string", "integer"]},
            "method": {"type": "string"},
            "params": {"type": "object"},
        },
    },
    "McpResponse": {
        "type": "object",
        "description": (
            "A JSON-RPC 2.0 response: `result`, or `error` whose `data` is the error "
            "envelope's `error` object (SPEC §3), in Accept-Language."
        ),
        "required": ["jsonrpc", "id"],
        "properties": {
            "jsonrpc": {"type": "string", "const": "2.0"},
            "id": {"type": ["string", "integer", "null"]},
            "result": {"type": "object"},
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {
                    "code": {"type": "integer"},
                    "message": {"type": "string"},
                    "data": {"type": "object"},
                },
            },
        },
    },
    "Health": {
        "type": "object",
        "required": ["status"],
        "properties": {"status": {"type": "string", "const": "ok"}},
    },
    "Readiness": {
        "type": "object",
        "required": ["status", "checks"],
        "properties": {
            "status": {"type": "string", "enum": ["ok", "unavailable"]},
            "checks": {
                "type": "object",
                "description": (
                    "database, redis, broker, opa, openbao (`ok`, `unavailable` or "
                    "`in_process`), sandbox (`ok` or why not)."
                ),
                "additionalProperties": {"type": "string"},
            },
        },
    },
}


def _json(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _machine_paths() -> dict[str, Any]:
    error, rpc = ref("Error"), ref("McpResponse")
    either = {"anyOf": [rpc, error]}
    mcp_answers = {
        "200": _json("The JSON-RPC response (a result, or an error the client can read).", rpc),
        "202": {"description": "A notification, acknowledged (no body)."},
        "400": _json(
            "-32700 parse error, -32600 not a request (a batch included), -32602 bad params, "
            "-32020/-32021/-32022 the 2026-07-28 header checks; or the envelope.",
            either,
        ),
        "401": _json("Missing or unknown key (`unauthenticated`).", error),
        "403": _json(
            "An `Origin` not allowed (`origin_not_allowed`), or a scope the key lacks.", either
        ),
        "404": _json("-32601: no such method.", rpc),
        "406": _json("The Accept header excludes JSON (`not_acceptable`).", error),
        "413": _json(BODY["413"], error),
        "415": _json("The body is not `application/json` (`unsupported_media_type`).", error),
        "429": _json(COMMON["429"], error),
        "500": _json("-32603: a fault of the gateway's.", rpc),
        "503": _json(COMMON["503"], either),
    }
    return {
        "/v1/mcp": {
            "post": {
                "operationId": "Mcp_post",
                "summary": "MCP over Streamable HTTP (stateless, JSON responses only)",
                "description": (
                    "The tenant's governed tools for MCP clients (SPEC §10): `tools/list` "
                    "needs `tools:read`, `tools/call` runs the same pipeline as invoke. GET "
                    "and DELETE answer 405."
                ),
                "tags": ["mcp"],
                "security": [{"apiKey": []}],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": ref("McpMessage")}},
                },
                "responses": mcp_answers,
            }
        },
        "/v1/openapi.json": {
            "get": {
                "operationId": "OpenApi_get",
                "summary": "This document (OpenAPI 3.1)",
                "tags": ["docs"],
                "security": [],
                "responses": {"200": _json("The document.", {"type": "object"})},
            }
        },
        "/v1/docs": {
            "get": {
                "operationId": "Docs_get",
                "summary": "This document, browsable",
                "tags": ["docs"],
                "security": [],
                "responses": {
                    "200": {
                        "description": "An HTML page.",
                        "content": {"text/html": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
        "/healthz": {
            "get": {
                "operationId": "Healthz_get",
                "summary": "Liveness: the process answers",
                "tags": ["health"],
                "security": [],
                "responses": {"200": _json("Alive.", ref("Health"))},
            }
        },
        "/readyz": {
            "get": {
                "operationId": "Readyz_get",
                "summary": "Readiness of the database, broker, OPA and OpenBao",
                "tags": ["health"],
                "security": [],
                "responses": {
                    "200": _json("Ready.", ref("Readiness")),
                    "503": _json("A dependency is unavailable (see `checks`).", ref("Readiness")),
                },
            }
        },
        "/metrics": {
            "get": {
                "operationId": "Metrics_get",
                "summary": "Prometheus text format, for a scraper holding the metrics token",
                "tags": ["health"],
                "security": [{"metricsToken": []}],
                "responses": {
                    "200": {
                        "description": "The metrics.",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    "401": _json("Missing or wrong metrics token (`unauthenticated`).", error),
                },
            }
        },
    }


def _response(description: str, component: str | None, content_type: str) -> dict[str, Any]:
    if component is None:
        return {"description": description, "content": {"application/octet-stream": {"schema": {}}}}
    return {"description": description, "content": {content_type: {"schema": ref(component)}}}


def describe(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular post-processing hook: the components and every operation's bodies
    and statuses from the tables above."""
    result.setdefault("components", {}).setdefault("schemas", {}).update(copy.deepcopy(SCHEMAS))
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            spec = OPERATIONS.get(operation.get("operationId", ""))
            if spec is None:
                continue
            request_body, answers = spec
            for parameter in operation.get("parameters", []):
                if parameter.get("in") == "path" and parameter.get("name") == "name":
                    known = "tool-manifest" if path.startswith("/v1/contracts") else "jira.search"
                    parameter["schema"] = {**parameter.get("schema", {}), "examples": [known]}
            responses: dict[str, Any] = {}
            for status, text in COMMON.items():
                responses[status] = _response(text, "Error", "application/json")
            if method in ("post", "put", "patch"):
                for status, text in BODY.items():
                    responses[status] = _response(text, "Error", "application/json")
            if "{" in path:
                responses.setdefault("404", _response("`not_found`.", "Error", "application/json"))
            for status, (text, component) in answers.items():
                responses[status] = _response(text, component, "application/json")
            operation["responses"] = dict(sorted(responses.items()))
            if request_body is not None:
                content = {"application/json": {"schema": ref(request_body)}}
                if operation["operationId"] == "ManifestApply_post":
                    content["application/yaml"] = {"schema": {"type": "string"}}
                operation["requestBody"] = {
                    "required": request_body not in ("RunCreateRequest",),
                    "content": content,
                }
            elif method == "post":
                operation.pop("requestBody", None)
    result["components"]["schemas"].update(copy.deepcopy(MACHINE_SCHEMAS))
    result["components"].setdefault("securitySchemes", {})["metricsToken"] = {
        "type": "http",
        "scheme": "bearer",
        "description": "EAI_METRICS_TOKEN",
    }
    result["paths"].update(_machine_paths())
    return result
