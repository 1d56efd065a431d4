"""Contracts, OpenAPI, docs and health endpoints."""

import copy
import json

import pytest

from gateway import demo

from .conftest import Api, error_of


def test_it_serves_the_tool_manifest_schema(alice):
    schema = alice.get("/v1/contracts/tool-manifest").json()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["properties"]["kind"] == {"enum": ["Tool", "Policy", "SandboxProfile"]}


def test_it_answers_404_for_an_unknown_contract(alice):
    response = alice.get("/v1/contracts/nope")
    assert response.status_code == 404
    assert error_of(response)["code"] == "contract_not_found"
    assert alice.post("/v1/contracts/nope/validate", {}).status_code == 404


def test_it_validates_a_document(alice):
    ok = alice.post("/v1/contracts/tool-manifest/validate", demo.JIRA_SEARCH).json()
    assert ok == {"valid": True, "errors": []}
    bad = copy.deepcopy(demo.JIRA_SEARCH)
    bad["spec"]["risk_class"] = "extreme"
    bad["spec"]["endpoint"] = {"type": "http", "url": "http://169.254.169.254/"}
    result = alice.post("/v1/contracts/tool-manifest/validate", bad).json()
    assert result["valid"] is False
    assert "/spec/risk_class" in [e["path"] for e in result["errors"]]
    assert all(set(e) == {"path", "message"} for e in result["errors"])


def test_it_needs_the_validate_scope(make_api, tenant_a):
    api = make_api(tenant_a, scopes=["tools:read"])
    assert api.get("/v1/contracts/tool-manifest").status_code == 200
    response = api.post("/v1/contracts/tool-manifest/validate", demo.JIRA_SEARCH)
    assert error_of(response)["code"] == "insufficient_scope"


def test_it_serves_openapi_and_docs_without_a_key(db):
    api = Api(None)
    spec = api.get("/v1/openapi.json")
    assert spec.status_code == 200
    paths = json.loads(spec.content)["paths"]
    assert "post" in paths["/v1/tools/{name}/invoke"]
    assert "get" in paths["/v1/tools/invocations/{invocation_id}"]
    assert api.get("/v1/docs").status_code == 200


@pytest.mark.parametrize("path", ["/v1/docs", "/v1/openapi.json"])
@pytest.mark.parametrize("method", ["options", "post", "put", "delete", "patch"])
def test_the_docs_answer_other_methods_with_405_in_the_envelope(db, path, method):
    from django.test import Client

    response = getattr(Client(), method)(path)
    assert response.status_code == 405, (method, path, response.content[:200])
    assert error_of(response)["code"] == "method_not_allowed"
    assert "GET" in response["Allow"]


def test_it_answers_health_and_readiness(db):
    api = Api(None)
    assert api.get("/healthz").json() == {"status": "ok"}
    ready = api.get("/readyz")
    assert ready.status_code == 200 and ready.json()["checks"]["database"] == "ok"
