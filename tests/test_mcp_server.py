"""The MCP server at /v1/mcp (SPEC §10), driven by the official MCP SDK's client over
real HTTP against a live server, in both protocol eras (`mode="legacy"`: the initialize
handshake; `mode="auto"`: `server/discover`, the stateless 2026-07-28 revision), and by
raw HTTP for every malformed input. Alice (acme) and Bob (globex) each have their own
catalog; Bob's tools are never listed or callable with Alice's key."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import anyio
import httpx2
import pytest
from django.core.management import call_command
from django.test import override_settings
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from gateway import metrics
from gateway.manifests import apply_manifests
from gateway.mcp_server import GATEWAY_TOOLS
from gateway.models import Invocation, Tool
from tenants.scope import tenant_scope

from .conftest import echo_manifest, error_of
from .test_observability import spans  # noqa: F401 - the in-memory span exporter fixture

MODES = ["legacy", "auto"]
IBAN = "FR7630006000011234567890189"
META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
}
GLOBEX_ONLY = echo_manifest("globex.only", {"type": "object"})


def with_client(url: str, raw_key: str, mode: str, work: Any, **headers: str) -> Any:
    """Run `work(client)` with the official client connected to `url` with `raw_key`."""

    async def main() -> Any:
        auth = {"Authorization": f"Bearer {raw_key}", **headers}
        async with httpx2.AsyncClient(headers=auth, timeout=30) as http:
            transport = streamable_http_client(url, http_client=http)
            async with Client(transport, mode=mode) as client:
                return await work(client)

    return anyio.run(main)


@pytest.fixture
def mcp_url(live_server) -> str:
    return f"{live_server.url}/v1/mcp"


@pytest.fixture
def globex(tenant_b):
    apply_manifests(tenant=tenant_b, documents=[GLOBEX_ONLY])
    return tenant_b


# ------------------------------------------------------------ the official client


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", MODES)
def test_it_lists_the_tools_alices_key_may_call(mcp_url, alice, bob, globex, mode):
    async def work(client):
        return (await client.list_tools()).tools

    tools = with_client(mcp_url, alice.raw_key, mode, work)
    names = [t.name for t in tools]
    # secret.tool needs secret:read, which Alice's key lacks: the policy would deny it.
    assert names == [
        "eai_invocation_cancel",
        "eai_invocation_get",
        "jira_search",
        "payments_transfer",
    ]
    jira = tools[2]
    assert jira.title == "jira.search"
    assert jira.description == "Search Jira issues"
    assert jira.input_schema["required"] == ["q"]
    assert jira.annotations.read_only_hint is True
    assert jira.annotations.destructive_hint is False
    assert jira.annotations.idempotent_hint is True
    assert jira.annotations.open_world_hint is False
    assert jira.meta["eai/tool"] == {
        "name": "jira.search",
        "version": "1.0.0",
        "risk_class": "low",
        "action_class": "read",
        "requires_approval": False,
        "cost": {"amount": "0.001", "currency": "EUR"},
    }
    payments = tools[3]
    assert payments.annotations.destructive_hint is True
    assert payments.annotations.read_only_hint is False
    assert payments.output_schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    # Bob sees his own extra tool, never Alice's view of it.
    bob_names = [t.name for t in with_client(mcp_url, bob.raw_key, mode, work)]
    assert "globex_only" in bob_names


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", MODES)
def test_it_calls_a_tool_through_the_pipeline_and_masks_the_iban(mcp_url, alice, mode):
    async def work(client):
        return await client.call_tool(
            "jira_search",
            {"q": "INC-42"},
            meta={"eai/run_id": "run_mcp1", "eai/step_index": 3},
        )

    result = with_client(mcp_url, alice.raw_key, mode, work)
    assert result.is_error is False
    invocation = result.structured_content
    assert invocation["status"] == "succeeded"
    assert invocation["tool"] == "jira.search"
    assert invocation["run_id"] == "run_mcp1" and invocation["step_index"] == 3
    assert IBAN not in json.dumps(invocation)
    assert "FR76*******************0189" in json.dumps(invocation["output"])
    assert json.loads(result.content[0].text) == invocation
    # The same object GET /v1/tools/invocations/{id} shows, and recorded as MCP's.
    shown = alice.get(f"/v1/tools/invocations/{invocation['invocation_id']}").json()
    assert shown == invocation
    with tenant_scope(alice.key.tenant, readonly=True):
        stored = Invocation.objects.get(pk=invocation["invocation_id"])
    assert stored.door == Invocation.MCP
    chain = alice.get("/v1/audit/events", limit=500).json()["results"]
    entries = {e["action"]: e["payload"] for e in chain}
    assert entries["tool.invoke"]["door"] == "mcp"
    assert entries["policy.decision"]["door"] == "mcp"
    events = alice.get("/v1/events", run_id="run_mcp1").json()["results"]
    assert [e["type"] for e in events] == [
        "agent.tool.requested",
        "agent.tool.started",
        "agent.tool.completed",
    ]
    assert alice.get("/v1/audit/verify").json()["valid"] is True


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", MODES)
def test_it_refuses_through_the_policy_with_a_recorded_decision(mcp_url, alice, mode):
    async def work(client):
        return await client.call_tool("secret_tool", {})

    result = with_client(mcp_url, alice.raw_key, mode, work)
    assert result.is_error is True
    invocation = result.structured_content
    assert invocation["status"] == "denied"
    assert invocation["error"]["code"] == "policy_denied"
    assert invocation["decision_id"].startswith("dec_")
    decision = alice.get(f"/v1/decisions/{invocation['decision_id']}").json()
    assert decision["allow"] is False


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", MODES)
def test_it_parks_a_call_for_approval_as_a_normal_result(mcp_url, alice, mode):
    async def work(client):
        parked = await client.call_tool(
            "payments_transfer", {"iban": IBAN, "amount": "12.50", "currency": "EUR"}
        )
        invocation_id = parked.structured_content["invocation_id"]
        read = await client.call_tool("eai_invocation_get", {"invocation_id": invocation_id})
        cancelled = await client.call_tool(
            "eai_invocation_cancel", {"invocation_id": invocation_id}
        )
        again = await client.call_tool("eai_invocation_cancel", {"invocation_id": invocation_id})
        return parked, read, cancelled, again

    parked, read, cancelled, again = with_client(mcp_url, alice.raw_key, mode, work)
    assert parked.is_error is False
    invocation = parked.structured_content
    assert invocation["status"] == "waiting_approval"
    approval_id = invocation["approval_id"]
    assert approval_id.startswith("apr_")
    text = parked.content[0].text
    assert approval_id in text and "Do not call the tool again" in text
    assert IBAN not in text
    assert read.is_error is False
    assert read.structured_content["status"] == "waiting_approval"
    assert read.structured_content["approval_id"] == approval_id
    assert cancelled.structured_content["status"] == "cancelled"
    assert again.is_error is True
    assert again.structured_content["error"]["code"] == "invalid_state"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", MODES)
def test_it_replays_an_idempotent_call(mcp_url, alice, mode):
    async def work(client):
        meta = {"eai/idempotency_key": "mcp-once-1"}
        first = await client.call_tool("jira_search", {"q": "INC-1"}, meta=meta)
        second = await client.call_tool("jira_search", {"q": "INC-1"}, meta=meta)
        other = await client.call_tool("jira_search", {"q": "INC-2"}, meta=meta)
        return first, second, other

    first, second, other = with_client(mcp_url, alice.raw_key, mode, work)
    assert first.structured_content == second.structured_content
    assert second.meta["eai/idempotent_replayed"] is True
    assert other.is_error is True
    assert other.structured_content["error"]["code"] == "idempotency_conflict"
    with tenant_scope(alice.key.tenant, readonly=True):
        assert Invocation.objects.filter(tool="jira.search").count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", MODES)
def test_it_never_lets_alice_reach_bobs_tools_or_calls(mcp_url, alice, bob, globex, mode):
    bobs_call = bob.invoke("jira.search", {"q": "INC-7"}).json()["invocation_id"]

    async def work(client):
        names = [t.name for t in (await client.list_tools()).tools]
        with pytest.raises(MCPError) as unknown:
            await client.call_tool("globex_only", {})
        read = await client.call_tool("eai_invocation_get", {"invocation_id": bobs_call})
        cancel = await client.call_tool("eai_invocation_cancel", {"invocation_id": bobs_call})
        return names, unknown.value, read, cancel

    names, unknown, read, cancel = with_client(mcp_url, alice.raw_key, mode, work)
    assert "globex_only" not in names
    assert unknown.error.code == -32602
    assert unknown.error.data["code"] == "tool_not_found"
    assert read.is_error is True and read.structured_content["error"]["code"] == "not_found"
    assert cancel.is_error is True and cancel.structured_content["error"]["code"] == "not_found"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", MODES)
def test_it_speaks_french_with_accept_language(mcp_url, alice, mode):
    async def work(client):
        with pytest.raises(MCPError) as unknown:
            await client.call_tool("no_such_tool", {})
        return unknown.value

    error = with_client(mcp_url, alice.raw_key, mode, work, **{"Accept-Language": "fr"})
    assert error.error.code == -32602
    assert error.error.data["message"] == error.error.data["message_i18n"]["fr"]
    assert "n’existe pas" in error.error.message


# ------------------------------------------------------------------- raw HTTP

HANDSHAKE = {"MCP-Protocol-Version": "2025-11-25"}


def rpc(method: str, params: dict[str, Any] | None = None, request_id: Any = 1) -> dict:
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        body["params"] = params
    return body


def modern(method: str, name: str | None = None, **overrides: str) -> dict[str, str]:
    headers = {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": method}
    if name is not None:
        headers["Mcp-Name"] = name
    headers.update(overrides)
    return headers


def rpc_error(response, code: int, request_id: Any = 1) -> dict[str, Any]:
    """The JSON-RPC error, after checking it carries the envelope's `error` as data."""
    body = response.json()
    assert body["jsonrpc"] == "2.0" and body["id"] == request_id, body
    error = body["error"]
    assert error["code"] == code, body
    data = error["data"]
    assert set(data["message_i18n"]) == {"en", "fr"}
    assert data["request_id"].startswith("req_")
    assert error["message"] == data["message"]
    return error


def test_it_answers_initialize_with_the_clients_version_when_served(alice, bob):
    offer = {"capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    for offered, agreed in [
        ("2025-06-18", "2025-06-18"),
        ("2025-11-25", "2025-11-25"),
        ("2024-11-05", "2025-11-25"),
        ("2030-01-01", "2025-11-25"),
    ]:
        response = alice.post("/v1/mcp", rpc("initialize", {**offer, "protocolVersion": offered}))
        assert response.status_code == 200
        assert response.json()["result"]["protocolVersion"] == agreed
        assert "Mcp-Session-Id" not in response.headers


def test_it_acknowledges_notifications_without_a_body(alice):
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    response = alice.post("/v1/mcp", note, headers=HANDSHAKE)
    assert response.status_code == 202 and response.content == b""
    response = alice.post("/v1/mcp", note, headers={"MCP-Protocol-Version": "1999-01-01"})
    rpc_error(response, -32022, request_id=None)


def test_it_answers_ping_and_ignores_a_session_id(alice):
    response = alice.post(
        "/v1/mcp", rpc("ping"), headers={**HANDSHAKE, "Mcp-Session-Id": "made-up"}
    )
    assert response.status_code == 200 and response.json()["result"] == {}
    assert "Mcp-Session-Id" not in response.headers


def test_it_serves_the_stateless_revision_with_checked_headers(alice):
    discover = alice.post(
        "/v1/mcp", rpc("server/discover", {"_meta": META}), headers=modern("server/discover")
    )
    assert discover.status_code == 200
    result = discover.json()["result"]
    assert result["supportedVersions"] == ["2026-07-28"]
    assert result["resultType"] == "complete"
    listed = alice.post("/v1/mcp", rpc("tools/list", {"_meta": META}), headers=modern("tools/list"))
    assert listed.json()["result"]["resultType"] == "complete"
    call = rpc("tools/call", {"name": "jira_search", "arguments": {"q": "x"}, "_meta": META})
    wrong_name = alice.post("/v1/mcp", call, headers=modern("tools/call", "payments_transfer"))
    assert wrong_name.status_code == 400
    rpc_error(wrong_name, -32020)
    wrong_method = alice.post("/v1/mcp", call, headers=modern("tools/list", "jira_search"))
    rpc_error(wrong_method, -32020)
    ok = alice.post("/v1/mcp", call, headers=modern("tools/call", "jira_search"))
    assert ok.status_code == 200 and ok.json()["result"]["resultType"] == "complete"
    # Nothing ran for the refused ones.
    with tenant_scope(alice.key.tenant, readonly=True):
        assert Invocation.objects.count() == 1


def test_it_names_the_supported_versions_for_an_unknown_one(alice):
    meta = {**META, "io.modelcontextprotocol/protocolVersion": "2099-01-01"}
    response = alice.post(
        "/v1/mcp",
        rpc("tools/list", {"_meta": meta}),
        headers=modern("tools/list", **{"MCP-Protocol-Version": "2099-01-01"}),
    )
    assert response.status_code == 400
    error = rpc_error(response, -32022)
    assert error["data"]["supported"] == ["2026-07-28"]
    assert error["data"]["code"] == "mcp_unsupported_version"


def test_it_refuses_get_and_delete(alice):
    for response in (
        alice.get("/v1/mcp"),
        alice.client.delete("/v1/mcp", headers={"Authorization": f"Bearer {alice.raw_key}"}),
    ):
        assert response.status_code == 405
        assert response["Allow"] == "POST"
        assert error_of(response)["code"] == "method_not_allowed"


def test_it_refuses_a_batch(alice):
    response = alice.post("/v1/mcp", [rpc("ping"), rpc("ping", request_id=2)])
    assert response.status_code == 400
    rpc_error(response, -32600, request_id=None)


def test_it_answers_malformed_json_with_a_parse_error(alice):
    for raw in (b'{"jsonrpc": "2.0", "id": 1,', b" ", b"[" * 200 + b"]" * 200, b"\xff\xfe"):
        response = alice.post("/v1/mcp", raw=raw)
        assert response.status_code == 400, raw
        error = rpc_error(response, -32700, request_id=None)
        assert error["data"]["code"] == "invalid_json"


def test_it_answers_what_is_not_a_request_with_invalid_request(alice):
    for body in (
        "just a string",
        {"jsonrpc": "1.0", "id": 1, "method": "ping"},
        {"jsonrpc": "2.0", "id": True, "method": "ping"},
        {"jsonrpc": "2.0", "id": 1, "method": 7},
        {"jsonrpc": "2.0", "id": 1, "method": "ping", "params": [1]},
        {"jsonrpc": "2.0", "id": 1, "result": {}},
    ):
        response = alice.post("/v1/mcp", body)
        assert response.status_code == 400, body
        rpc_error(response, -32600, request_id=None)


def test_it_answers_an_unknown_method_with_method_not_found(alice):
    for method in ("tools/destroy", "resources/list", "server/discover"):
        response = alice.post("/v1/mcp", rpc(method), headers=HANDSHAKE)
        error = rpc_error(response, -32601)
        assert error["data"]["code"] == "mcp_method_not_found"


def test_it_answers_bad_params_with_invalid_params(alice):
    for params in (
        {"arguments": {"q": "x"}},  # no name
        {"name": 42},
        {"name": "jira_search", "arguments": ["q"]},
        {"name": "jira_search", "arguments": {"q": "x"}, "_meta": {"eai/step_index": -1}},
        {"name": "jira_search", "arguments": {"q": "x"}, "_meta": {"eai/run_id": "bad id!"}},
        {"name": "nope_tool"},
    ):
        response = alice.post("/v1/mcp", rpc("tools/call", params), headers=HANDSHAKE)
        assert response.status_code == 400, params
        rpc_error(response, -32602)
    cursor = alice.post("/v1/mcp", rpc("tools/list", {"cursor": "a.b"}), headers=HANDSHAKE)
    assert rpc_error(cursor, -32602)["data"]["code"] == "invalid_cursor"
    modern_without_meta = alice.post("/v1/mcp", rpc("tools/list"), headers=modern("tools/list"))
    rpc_error(modern_without_meta, -32602)


@pytest.mark.parametrize(
    ("params", "en", "fr"),
    [
        ({"name": "jira_search", "arguments": "notobj"}, "arguments must be an object",
         "arguments doit être un objet"),
        ({"arguments": {}}, "name is required", "name est obligatoire"),
        ({"name": 42}, "name must be a string", "name doit être une chaîne de caractères"),
    ],
)  # fmt: skip
def test_a_bad_param_is_said_in_both_languages_without_its_value(alice, params, en, fr):
    headers = {**HANDSHAKE, "Accept-Language": "fr"}
    response = alice.post("/v1/mcp", rpc("tools/call", params), headers=headers)
    data = rpc_error(response, -32602)["data"]
    assert en in data["message_i18n"]["en"] and fr in data["message_i18n"]["fr"]
    assert data["message"] == data["message_i18n"]["fr"]
    assert "Input should" not in json.dumps(data) and "notobj" not in json.dumps(data)


def test_it_reports_a_bad_input_as_a_tool_error_the_model_can_fix(alice):
    response = alice.post(
        "/v1/mcp", rpc("tools/call", {"name": "jira_search", "arguments": {}}), headers=HANDSHAKE
    )
    result = response.json()["result"]
    assert result["isError"] is True
    refusal = result["structuredContent"]
    assert refusal["status"] == "failed" and refusal["decision_id"] is None
    assert refusal["error"]["code"] == "invalid_input"
    assert refusal["error"]["details"]["errors"]


def test_it_refuses_a_missing_or_bad_key_with_a_bearer_challenge(alice, make_api):
    for headers in ({}, {"Authorization": "Bearer eai_nope_nope"}, {"Authorization": "Basic x"}):
        body = json.dumps(rpc("ping"))
        response = alice.client.post(
            "/v1/mcp", data=body, content_type="application/json", headers=headers
        )
        assert response.status_code == 401
        assert response["WWW-Authenticate"] == 'Bearer realm="eai"'
        assert error_of(response)["code"] == "unauthenticated"


def test_it_refuses_a_foreign_origin(alice):
    response = alice.post("/v1/mcp", rpc("ping"), headers={"Origin": "https://evil.example"})
    assert response.status_code == 403
    assert error_of(response)["code"] == "origin_not_allowed"
    with override_settings(EAI_MCP_ALLOWED_ORIGINS=["https://ide.example"]):
        allowed = alice.post("/v1/mcp", rpc("ping"), headers={"Origin": "https://ide.example"})
        assert allowed.status_code == 200


def test_it_refuses_an_oversized_body_and_other_media_types(alice):
    with override_settings(EAI_MAX_REQUEST_BYTES=1000):
        big = rpc("tools/call", {"name": "jira_search", "arguments": {"q": "x" * 2000}})
        response = alice.post("/v1/mcp", big)
        assert response.status_code == 413
        assert error_of(response)["code"] == "payload_too_large"
    response = alice.post("/v1/mcp", raw="ping", content_type="text/plain")
    assert response.status_code == 415
    assert error_of(response)["code"] == "unsupported_media_type"


def test_it_needs_tools_read_to_list(make_api, tenant_a):
    agent = make_api(tenant_a, scopes=["tools:invoke", "jira:read"])
    response = agent.post("/v1/mcp", rpc("tools/list"), headers=HANDSHAKE)
    assert response.status_code == 403
    assert rpc_error(response, -32003)["data"]["code"] == "insufficient_scope"
    # Calling is the policy's to decide: jira:read and tools:invoke are enough.
    call = rpc("tools/call", {"name": "jira_search", "arguments": {"q": "x"}})
    result = agent.post("/v1/mcp", call, headers=HANDSHAKE).json()["result"]
    assert result["structuredContent"]["status"] == "succeeded"


def test_it_says_errors_in_french(alice):
    french = {**HANDSHAKE, "Accept-Language": "fr"}
    response = alice.post("/v1/mcp", rpc("tools/destroy"), headers=french)
    error = rpc_error(response, -32601)
    assert error["message"] == error["data"]["message_i18n"]["fr"]
    assert "n’est pas disponible" in error["message"]
    transfer = {"name": "payments_transfer", "arguments": {"iban": IBAN, "amount": "1"}}
    parked = alice.post("/v1/mcp", rpc("tools/call", transfer), headers=french).json()["result"]
    assert parked["content"][0]["text"].startswith("Cet appel attend une approbation humaine")
    response = alice.post("/v1/mcp", [], headers={"Accept-Language": "fr"})
    assert "un lot" in rpc_error(response, -32600, request_id=None)["message"]


def test_it_lists_the_same_tools_the_policy_lets_the_key_call(make_api, tenant_a):
    """For every combination of scopes, a listed tool's call is never refused for a scope
    and an unlisted one's always is: one predicate decides both."""
    for scopes in (
        ["tools:read"],
        ["tools:read", "tools:invoke"],
        ["tools:read", "tools:invoke", "jira:read"],
        ["tools:read", "tools:invoke", "payments:write", "secret:read"],
    ):
        agent = make_api(tenant_a, scopes=scopes)
        listed = agent.post("/v1/mcp", rpc("tools/list"), headers=HANDSHAKE).json()["result"]
        names = {t["name"] for t in listed["tools"]} - set(GATEWAY_TOOLS)
        for name in ("jira_search", "secret_tool"):
            call = rpc("tools/call", {"name": name, "arguments": {"q": "x"}})
            result = agent.post("/v1/mcp", call, headers=HANDSHAKE).json()["result"]
            code = (result["structuredContent"].get("error") or {}).get("code")
            assert (code == "policy_denied") == (name not in names), (scopes, name, result)


def test_it_paginates_the_list_by_name(alice, tenant_a):
    apply_manifests(
        tenant=tenant_a,
        documents=[echo_manifest(f"bulk.t{i:03d}", {"type": "object"}) for i in range(120)],
    )
    seen: list[str] = []
    cursor = None
    while True:
        params = {"cursor": cursor} if cursor else None
        page = alice.post("/v1/mcp", rpc("tools/list", params), headers=HANDSHAKE).json()["result"]
        seen += [t["name"] for t in page["tools"]]
        cursor = page.get("nextCursor")
        if cursor is None:
            break
    assert seen == sorted(seen) and len(seen) == len(set(seen)) == 124


def test_it_refuses_a_tool_whose_mcp_name_collides(alice, tenant_a):
    response = alice.post("/v1/manifests/apply", echo_manifest("jira_search", {"type": "object"}))
    assert response.status_code == 422
    errors = error_of(response)["details"]["errors"]
    assert errors[0]["path"] == "/metadata/name" and "jira.search" in errors[0]["message"]
    both = {
        "manifests": [
            echo_manifest("a.b", {"type": "object"}),
            echo_manifest("a-b", {"type": "object"}),
            echo_manifest("a_b", {"type": "object"}),
        ]
    }
    response = alice.post("/v1/manifests/apply", both)
    assert response.status_code == 422
    reserved = alice.post(
        "/v1/manifests/apply", echo_manifest("eai.invocation.get", {"type": "object"})
    )
    assert reserved.status_code == 422
    # Applying the same tool again is no collision with itself.
    again = alice.post("/v1/manifests/apply", echo_manifest("x" * 70, {"type": "object"}))
    assert again.status_code == 200
    assert alice.post("/v1/manifests/apply", echo_manifest("x" * 70, {})).status_code == 200
    longer = alice.post("/v1/manifests/apply", echo_manifest("x" * 71, {"type": "object"}))
    assert longer.status_code == 422


def test_it_accepts_the_gateways_own_origin(alice):
    response = alice.post("/v1/mcp", rpc("ping"), headers={"Origin": "http://testserver"})
    assert response.status_code == 200
    rebound = alice.post("/v1/mcp", rpc("ping"), headers={"Origin": "http://testserver.evil"})
    assert rebound.status_code == 403


def test_it_checks_mcp_param_headers_against_the_arguments(alice, tenant_a):
    region = {"type": "string", "x-mcp-header": "Region"}
    schema = {"type": "object", "required": ["region"], "properties": {"region": region}}
    apply_manifests(tenant=tenant_a, documents=[echo_manifest("geo.echo", schema)])
    call = rpc("tools/call", {"name": "geo_echo", "arguments": {"region": "eu"}, "_meta": META})
    headers = modern("tools/call", "geo_echo")
    for sent in ({"Mcp-Param-Region": "us"}, {}):
        refused = alice.post("/v1/mcp", call, headers={**headers, **sent})
        assert refused.status_code == 400, sent
        assert rpc_error(refused, -32020)["data"]["code"] == "mcp_header_mismatch"
    ok = alice.post("/v1/mcp", call, headers={**headers, "Mcp-Param-Region": "eu"})
    assert ok.json()["result"]["structuredContent"]["status"] == "succeeded"
    with tenant_scope(tenant_a, readonly=True):
        assert Invocation.objects.filter(tool="geo.echo").count() == 1


def test_it_counts_mcp_calls_apart(alice):
    call = rpc("tools/call", {"name": "jira_search", "arguments": {"q": "x"}})
    alice.post("/v1/mcp", call, headers=HANDSHAKE)
    scraped = alice.client.get(
        "/metrics", headers={"Authorization": f"Bearer {metrics.token()}"}
    ).content.decode()
    assert 'eai_mcp_tool_calls_total{status="succeeded",tool="jira.search"}' in scraped
    assert 'eai_tool_invocations_total{status="succeeded",tool="jira.search"}' in scraped


def test_it_takes_the_idempotency_key_header_and_refuses_two_different_keys(alice):
    call = rpc("tools/call", {"name": "jira_search", "arguments": {"q": "x"}})
    keyed = {**HANDSHAKE, "Idempotency-Key": "hdr-1"}
    first = alice.post("/v1/mcp", call, headers=keyed).json()["result"]
    again = alice.post("/v1/mcp", call, headers=keyed).json()["result"]
    assert again["structuredContent"] == first["structuredContent"]
    assert again["_meta"] == {"eai/idempotent_replayed": True}
    both = rpc(
        "tools/call",
        {"name": "jira_search", "arguments": {"q": "x"}, "_meta": {"eai/idempotency_key": "other"}},
    )
    refused = alice.post("/v1/mcp", both, headers=keyed).json()["result"]
    assert refused["isError"] is True
    assert refused["structuredContent"]["error"]["code"] == "invalid_request"


def test_it_continues_the_trace_of_meta_traceparent(alice, spans):  # noqa: F811
    inbound = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    call = rpc(
        "tools/call",
        {"name": "jira_search", "arguments": {"q": "x"}, "_meta": {"traceparent": inbound}},
    )
    alice.post("/v1/mcp", call, headers=HANDSHAKE)
    span = [s for s in spans.get_finished_spans() if s.name == "execute_tool jira.search"][0]
    assert format(span.context.trace_id, "032x") == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert dict(span.attributes)["eai.door"] == "mcp"


def test_it_hides_a_disabled_tool_and_refuses_its_calls(alice, tenant_a):
    with tenant_scope(tenant_a):
        tool = Tool.objects.for_tenant(tenant_a).get(name="jira.search")
        tool.disabled = True
        tool.save()  # as the admin does: the process caches forget it
    listed = alice.post("/v1/mcp", rpc("tools/list"), headers=HANDSHAKE).json()["result"]
    assert "jira_search" not in {t["name"] for t in listed["tools"]}
    call = rpc("tools/call", {"name": "jira_search", "arguments": {"q": "x"}})
    result = alice.post("/v1/mcp", call, headers=HANDSHAKE).json()["result"]
    assert result["isError"] is True
    assert result["structuredContent"]["error"]["code"] == "tool_unavailable"


def test_it_lets_a_key_read_its_own_calls_and_others_only_with_invocations_read(
    alice, make_api, tenant_a
):
    made = alice.invoke("jira.search", {"q": "x"}).json()["invocation_id"]
    narrow = make_api(tenant_a, scopes=["tools:invoke", "tools:read", "jira:read"])
    get = rpc("tools/call", {"name": "eai_invocation_get", "arguments": {"invocation_id": made}})
    refused = narrow.post("/v1/mcp", get, headers=HANDSHAKE).json()["result"]
    assert refused["structuredContent"]["error"]["code"] == "not_found"
    own_call = rpc("tools/call", {"name": "jira_search", "arguments": {"q": "y"}})
    own = narrow.post("/v1/mcp", own_call, headers=HANDSHAKE).json()["result"]
    own_id = own["structuredContent"]["invocation_id"]
    get_own = rpc(
        "tools/call", {"name": "eai_invocation_get", "arguments": {"invocation_id": own_id}}
    )
    read = narrow.post("/v1/mcp", get_own, headers=HANDSHAKE).json()["result"]
    assert read["isError"] is False and read["structuredContent"]["invocation_id"] == own_id
    for arguments in ({}, {"invocation_id": 5}, {"invocation_id": made, "extra": 1}):
        bad = rpc("tools/call", {"name": "eai_invocation_get", "arguments": arguments})
        result = alice.post("/v1/mcp", bad, headers=HANDSHAKE).json()["result"]
        assert result["structuredContent"]["error"]["code"] == "invalid_input", arguments


@pytest.mark.django_db(transaction=True)
def test_the_demo_prints_how_to_reach_mcp():
    out = StringIO()
    call_command("demo", stdout=out)
    text = out.getvalue()
    assert "/v1/mcp" in text and "Authorization: Bearer eai_" in text


def test_it_lists_a_tool_whose_input_schema_does_not_say_object(alice, tenant_a):
    apply_manifests(
        tenant=tenant_a,
        documents=[
            echo_manifest("loose.any", {}),
            echo_manifest("loose.nullable", {"type": ["object", "null"], "required": ["a"]}),
        ],
    )
    listed = alice.post("/v1/mcp", rpc("tools/list"), headers=HANDSHAKE)
    assert listed.status_code == 200
    tools = {t["name"]: t for t in listed.json()["result"]["tools"]}
    assert tools["loose_any"]["inputSchema"] == {"type": "object"}
    assert tools["loose_nullable"]["inputSchema"] == {"type": "object", "required": ["a"]}
