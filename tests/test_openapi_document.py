"""The OpenAPI 3.1 document (`GET /v1/openapi.json`) is exact: every body a named
component, every answer the server gives matches the operation's documented status and
schema. (schemathesis checks the same against a live server in CI: .ci/schemathesis.)"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from referencing import Registry, Resource

from gateway import demo


@pytest.fixture
def document(alice) -> dict[str, Any]:
    response = alice.get("/v1/openapi.json")
    assert response.status_code == 200
    return response.json()


def operation_for(document: dict[str, Any], method: str, path: str) -> dict[str, Any]:
    # Literal paths first: /v1/tools/invocations before /v1/tools/{name}.
    for template, operations in sorted(document["paths"].items(), key=lambda t: t[0].count("{")):
        pattern = "^" + re.sub(r"\{[^}]+\}", "[^/]+", template) + "$"
        if re.match(pattern, path) and method in operations:
            return operations[method]
    raise AssertionError(f"{method.upper()} {path} is not in the document")


def check(document: dict[str, Any], method: str, path: str, response: Any) -> None:
    """The answer's status is documented for the operation, and its body validates."""
    operation = operation_for(document, method, path.split("?")[0])
    status = str(response.status_code)
    assert status in operation["responses"], (method, path, status, response.content[:300])
    content = operation["responses"][status].get("content", {})
    if "application/json" not in content:
        return
    registry = Registry().with_resource(
        "urn:openapi",
        Resource.from_contents(
            {**document, "$schema": "https://json-schema.org/draft/2020-12/schema"}
        ),
    )
    schema = json.loads(
        json.dumps(content["application/json"]["schema"]).replace('"#/', '"urn:openapi#/')
    )
    jsonschema.Draft202012Validator(schema, registry=registry).validate(response.json())


ERROR = {"$ref": "#/components/schemas/Error"}


def test_it_is_openapi_3_1_with_named_components(document):
    assert document["openapi"].startswith("3.1")
    schemas = document["components"]["schemas"]
    for name in (
        "Invocation",
        "Decision",
        "Approval",
        "Run",
        "Event",
        "Tool",
        "UsageAggregate",
        "AuditEvent",
        "AuditVerification",
        "Error",
        "InvocationPage",
    ):
        assert name in schemas
    for path, operations in document["paths"].items():
        if not path.startswith("/v1/") or path in ("/v1/openapi.json", "/v1/docs"):
            continue
        for method, operation in operations.items():
            responses = operation["responses"]
            for status in ("400", "401", "429"):
                assert status in responses, (method, path, status)
            for status, response in responses.items():
                if status.startswith(("4", "5")):
                    schema = response["content"]["application/json"]["schema"]
                    if path == "/v1/mcp":  # JSON-RPC errors, or the envelope before them
                        allowed = [{"$ref": "#/components/schemas/McpResponse"}, ERROR]
                        assert schema in (*allowed, {"anyOf": allowed}), (status, schema)
                        continue
                    assert schema == ERROR, (method, path)


def test_it_describes_every_route_of_the_spec(document):
    """SPEC §4's table, the MCP door and the machine routes included (SPEC §12)."""
    for method, path in [
        ("post", "/v1/mcp"),
        ("get", "/v1/openapi.json"),
        ("get", "/v1/docs"),
        ("get", "/metrics"),
        ("get", "/healthz"),
        ("get", "/readyz"),
        ("post", "/v1/tools/{name}/invoke"),
        ("get", "/v1/audit/verify"),
    ]:
        assert method in document["paths"][path], (method, path)
    mcp = document["paths"]["/v1/mcp"]["post"]
    assert {"200", "202", "400", "401", "404", "413", "415", "429"} <= set(mcp["responses"])
    assert document["paths"]["/healthz"]["get"]["security"] == []


def test_every_answer_matches_the_document(alice, bob, document):
    ok = alice.invoke("jira.search", {"q": "INC-42"}, run_id="run_doc", step_index=1)
    check(document, "post", "/v1/tools/jira.search/invoke", ok)
    invocation = ok.json()
    parked = alice.invoke(
        "payments.transfer", {"iban": "FR7630006000011234567890189", "amount": "1.00"}
    )
    check(document, "post", "/v1/tools/payments.transfer/invoke", parked)
    assert parked.status_code == 202
    for response, method, path in (
        (alice.invoke("secret.tool", {}), "post", "/v1/tools/secret.tool/invoke"),
        (alice.invoke("no.such.tool", {}), "post", "/v1/tools/no.such.tool/invoke"),
        (alice.invoke("jira.search", {}), "post", "/v1/tools/jira.search/invoke"),
        (alice.post("/v1/tools/jira.search/invoke", raw="{bad"), "post", "/v1/tools/x/invoke"),
        (alice.get("/v1/tools"), "get", "/v1/tools"),
        (alice.get("/v1/tools/jira.search"), "get", "/v1/tools/jira.search"),
        (alice.get("/v1/tools/invocations", limit=1), "get", "/v1/tools/invocations"),
        (alice.get("/v1/tools/invocations", limit=["1", "2"]), "get", "/v1/tools/invocations"),
        (
            alice.get(f"/v1/tools/invocations/{invocation['invocation_id']}"),
            "get",
            "/v1/tools/invocations/x",
        ),
        (
            bob.get(f"/v1/tools/invocations/{invocation['invocation_id']}"),
            "get",
            "/v1/tools/invocations/x",
        ),
        (
            alice.post(f"/v1/tools/invocations/{parked.json()['invocation_id']}/cancel", {}),
            "post",
            "/v1/tools/invocations/x/cancel",
        ),
        (alice.get(f"/v1/decisions/{invocation['decision_id']}"), "get", "/v1/decisions/x"),
        (alice.post("/v1/runs", {"run_id": "run_doc2", "goal": "g"}), "post", "/v1/runs"),
        (alice.post("/v1/runs", {"run_id": None}), "post", "/v1/runs"),
        (alice.get("/v1/runs/run_doc"), "get", "/v1/runs/x"),
        (alice.post("/v1/runs/run_doc/resume", {}), "post", "/v1/runs/x/resume"),
        (alice.get("/v1/events", limit=2), "get", "/v1/events"),
        (alice.get("/v1/finops/usage", group_by="tool"), "get", "/v1/finops/usage"),
        (alice.get("/v1/audit/events", limit=2), "get", "/v1/audit/events"),
        (alice.get("/v1/audit/verify"), "get", "/v1/audit/verify"),
        (alice.get("/v1/contracts/tool-manifest"), "get", "/v1/contracts/tool-manifest"),
        (
            alice.post("/v1/contracts/tool-manifest/validate", {"apiVersion": "eai/v1"}),
            "post",
            "/v1/contracts/x/validate",
        ),
        (
            alice.post("/v1/manifests/apply?dry_run=true", demo.JIRA_SEARCH),
            "post",
            "/v1/manifests/apply",
        ),
        (alice.post("/v1/manifests/apply", {"kind": "Tool"}), "post", "/v1/manifests/apply"),
        (alice.get("/v1/approvals"), "get", "/v1/approvals"),
    ):
        check(document, method, path, response)


def test_the_mcp_door_and_the_machine_routes_answer_as_described(alice, document):
    handshake = {"MCP-Protocol-Version": "2025-11-25"}

    def mcp(body, headers=handshake, **kwargs):
        return alice.post("/v1/mcp", body, headers=headers, **kwargs)

    listed = mcp({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert listed.status_code == 200
    for response in (
        listed,
        mcp({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        mcp({"jsonrpc": "2.0", "id": 2, "method": "tools/destroy"}),
        mcp({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": 4}}),
        mcp([{"jsonrpc": "2.0", "id": 4, "method": "ping"}]),
        mcp(None, raw="{bad"),
        alice.client.post("/v1/mcp", "{}", content_type="application/json"),  # no key
        alice.get("/healthz"),
        alice.get("/readyz"),
        alice.get("/metrics"),  # the agent's key is not the metrics token
        alice.get("/v1/openapi.json"),
    ):
        path = response.request["PATH_INFO"]
        check(document, response.request["REQUEST_METHOD"].lower(), path, response)
    assert {r.status_code for r in (mcp({"jsonrpc": "2.0", "id": 5, "method": "x/y"}),)} == {404}


def test_a_repeated_limit_is_refused(alice):
    response = alice.get("/v1/tools/invocations", limit=["1", "500"])
    assert response.status_code == 400
    assert response.json()["error"]["details"] == {"field": "limit"}
    french = alice.get("/v1/tools/invocations", {"Accept-Language": "fr"}, limit=["1", "2"])
    assert "une fois" in french.json()["error"]["message"]


def test_the_committed_document_is_the_served_one(document):
    """contracts/v1/openapi.json (the TypeScript SDK's types come from it) is regenerated
    with `make openapi` whenever a route changes."""
    committed = json.loads((Path(__file__).parent.parent / "contracts/v1/openapi.json").read_text())
    assert committed == document, "run `make openapi` and commit contracts/v1/openapi.json"
