"""Every `/v1` route, aimed by one tenant at another tenant's objects.

Alice's agent (acme, every scope) and Rita (an acme reviewer's key) know the ids of
everything Bob's agent made in globex: a finished call and its decision, a parked call
with its approval, a run, an artifact, usage, and a tool only globex has. Each route
answers as if those did not exist (404 `not_found`, or a list holding nothing of
globex's), no answer carries a globex id the caller did not send itself, and globex's
rows are exactly what they were. The routes are read from the URLconf: a route added
without a case here fails the walk.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.apps import apps
from django.contrib.auth import get_user_model
from django.db import connection
from django.urls import URLResolver, get_resolver
from guardian.shortcuts import assign_perm

from gateway.keys import issue_api_key
from gateway.manifests import apply_manifests
from gateway.models import Artifact, AuditEvent, Invocation, TenantOwned, Tool, new_id
from tenants.models import Membership, Tenant

from .conftest import ALL_SCOPES, Api, echo_manifest, error_of, scope
from .test_postgres_rls import app_role, as_app_role  # noqa: F401 - fixtures

IBAN = "FR7630006000011234567890189"
B_TOOL = "globex.ledger"
B_RUN = "run_globex_only"
METHODS = ("get", "post", "put", "patch", "delete")


def v1_routes() -> list[tuple[str, str]]:
    """(route, METHOD) for every `/v1` route of the URLconf and each method its view
    handles (OPTIONS and HEAD aside: DRF's metadata and GET's twin)."""
    found = []

    def walk(patterns: list[Any], prefix: str) -> None:
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, route)
                continue
            if not route.startswith("v1/"):
                continue
            view = getattr(pattern.callback, "view_class", None)
            methods = [m.upper() for m in METHODS if hasattr(view, m)] if view else ["GET"]
            found.extend((route, method) for method in methods)

    walk(get_resolver().url_patterns, "")
    return sorted(set(found))


@dataclass
class World:
    a: Tenant
    b: Tenant
    alice: Api
    rita: Api
    finished: str  # B's succeeded call
    parked: str  # B's call waiting for approval
    approval: str
    decisions: list[str]
    artifact: str

    @property
    def traces(self) -> list[str]:
        """What of B's must never appear in an answer to A (unless A sent it)."""
        return [
            self.finished,
            self.parked,
            self.approval,
            *self.decisions,
            self.artifact,
            B_RUN,
            B_TOOL,
            "bob-agent",
            str(self.b.pk),
            self.b.pk.hex,
            self.b.slug,
        ]


@pytest.fixture
def world(tenant_a, tenant_b, make_api, bob) -> World:
    # Every scope there is, the approval ones included.
    alice = make_api(tenant_a, [*ALL_SCOPES, "approvals:read", "approvals:decide"], "alice")
    apply_manifests(tenant=tenant_b, documents=[echo_manifest(B_TOOL, {"type": "object"})])
    done = bob.invoke("jira.search", {"q": "INC-1"}, run_id=B_RUN)
    assert done.status_code == 200, done.content
    parked = bob.invoke("payments.transfer", {"iban": IBAN, "amount": "5"}, run_id=B_RUN)
    assert parked.status_code == 202, parked.content
    usage = bob.post("/v1/finops/usage", {"events": [{"unit": "llm_tokens", "run_id": B_RUN}]})
    assert usage.status_code == 201, usage.content
    with scope(tenant_b):
        artifact = Artifact.objects.create(
            id=new_id("art"),
            tenant=tenant_b,
            invocation_id=done.json()["invocation_id"],
            content=b'{"ledger": 1}',
            size=13,
        )
    rita = get_user_model().objects.create_user("rita", password="pw-ritarita", is_staff=True)
    Membership.objects.create(user=rita, tenant=tenant_a)
    with scope(tenant_a):
        assign_perm("gateway.review_tool", rita, Tool.objects.get(name="payments.transfer"))
    _, raw = issue_api_key(
        tenant=tenant_a, scopes=["approvals:read", "approvals:decide"], user=rita
    )
    # A has rows of its own on every route, so that lists are not empty by accident.
    assert alice.invoke("jira.search", {"q": "INC-2"}, run_id="run_acme").status_code == 200
    assert alice.invoke("payments.transfer", {"iban": IBAN, "amount": "1"}).status_code == 202
    return World(
        a=tenant_a,
        b=tenant_b,
        alice=alice,
        rita=Api(raw),
        finished=done.json()["invocation_id"],
        parked=parked.json()["invocation_id"],
        approval=parked.json()["approval_id"],
        decisions=[done.json()["decision_id"], parked.json()["decision_id"]],
        artifact=artifact.id,
    )


def snapshot(tenant: Tenant) -> dict[str, Any]:
    """Every row of `tenant` in every tenant-owned table, and the tenant's own row."""
    rows: dict[str, Any] = {"tenant": list(Tenant.objects.filter(pk=tenant.pk).values())}
    with scope(tenant):
        for model in apps.get_models():
            if issubclass(model, TenantOwned):
                rows[model.__name__] = list(model.objects.order_by("pk").values())
    return rows


def no_trace(w: World, response: Any, sent: str = "") -> None:
    text = response.content.decode("utf-8", "replace")
    leaked = [t for t in w.traces if t in text and t not in sent]
    assert not leaked, (leaked, text[:500])


def hidden(w: World, response: Any, sent: str, code: str = "not_found") -> None:
    """Answered exactly as for an id that does not exist."""
    assert response.status_code == 404, response.content
    assert error_of(response)["code"] == code
    no_trace(w, response, sent)


def listed(w: World, response: Any, sent: str = "") -> Any:
    assert response.status_code == 200, response.content
    no_trace(w, response, sent)
    return response.json() if response["Content-Type"] == "application/json" else None


# ------------------------------------------------------------------------ cases


def tools_list(w: World) -> None:
    body = listed(w, w.alice.get("/v1/tools", limit=500))
    assert body["results"] and B_TOOL not in {t["name"] for t in body["results"]}
    listed(w, w.alice.get("/v1/tools", cursor="globex"), "globex")


def tool_detail(w: World) -> None:
    hidden(w, w.alice.get(f"/v1/tools/{B_TOOL}"), B_TOOL, "tool_not_found")


def tool_invoke(w: World) -> None:
    sent = B_TOOL + B_RUN
    hidden(w, w.alice.invoke(B_TOOL, {"q": 1}, run_id=B_RUN), sent, "tool_not_found")
    # The other ways in: replayed under a key, queued, and DRF's path (not the front's).
    again = w.alice.invoke(B_TOOL, {}, headers={"Idempotency-Key": "k1"})
    hidden(w, again, sent, "tool_not_found")
    queued = w.alice.invoke(B_TOOL, {}, headers={"Prefer": "respond-async"})
    hidden(w, queued, sent, "tool_not_found")
    drf = w.alice.post(
        f"/v1/tools/{B_TOOL}/invoke",
        raw='{"input": {}}',
        headers={"Accept": "*/*;q=0.1, application/json"},
    )
    hidden(w, drf, sent, "tool_not_found")


def invocations_list(w: World) -> None:
    body = listed(w, w.alice.get("/v1/tools/invocations", limit=500))
    assert body["results"]  # A's own calls are there
    for params in ({"run_id": B_RUN}, {"tool": B_TOOL}, {"agent": "bob-agent"}):
        sent = " ".join(params.values())
        assert listed(w, w.alice.get("/v1/tools/invocations", **params), sent)["results"] == []
    # B's id as a cursor pages A's rows, never B's.
    listed(w, w.alice.get("/v1/tools/invocations", cursor=w.parked), w.parked)


def invocation_detail(w: World) -> None:
    for invocation_id in (w.finished, w.parked):
        hidden(w, w.alice.get(f"/v1/tools/invocations/{invocation_id}"), invocation_id)
        waited = w.alice.get(f"/v1/tools/invocations/{invocation_id}", wait="0.2")
        hidden(w, waited, invocation_id)


def invocation_cancel(w: World) -> None:
    for invocation_id in (w.parked, w.finished):
        response = w.alice.post(f"/v1/tools/invocations/{invocation_id}/cancel")
        hidden(w, response, invocation_id)


def decision_detail(w: World) -> None:
    for decision_id in w.decisions:
        hidden(w, w.alice.get(f"/v1/decisions/{decision_id}"), decision_id)


def artifact_detail(w: World) -> None:
    hidden(w, w.alice.get(f"/v1/artifacts/{w.artifact}"), w.artifact)


def contract_detail(w: World) -> None:
    listed(w, w.alice.get("/v1/contracts/tool-manifest"))  # public: nothing of a tenant


def contract_validate(w: World) -> None:
    manifest = echo_manifest(B_TOOL, {"type": "object"})
    listed(w, w.alice.post("/v1/contracts/tool-manifest/validate", manifest), B_TOOL)


def manifests_apply(w: World) -> None:
    # B's tool name is free in A: applying it makes A's own tool, and leaves B's be.
    manifest = echo_manifest(B_TOOL, {"type": "object"}, version="9.9.9")
    for dry_run in ("true", "false"):
        response = w.alice.post(f"/v1/manifests/apply?dry_run={dry_run}", manifest)
        listed(w, response, B_TOOL)
    with scope(w.a):
        assert Tool.objects.get(name=B_TOOL).version == "9.9.9"


def audit_events(w: World) -> None:
    body = listed(w, w.alice.get("/v1/audit/events", limit=500))
    with scope(w.a):
        assert [int(e["seq"]) for e in body["results"]] == list(
            AuditEvent.objects.order_by("seq").values_list("seq", flat=True)
        )
    listed(w, w.alice.get("/v1/audit/events", action="tool.invoke"))


def audit_verify(w: World) -> None:
    body = listed(w, w.alice.get("/v1/audit/verify"))
    with scope(w.a):
        assert body["valid"] is True and body["length"] == AuditEvent.objects.count()


def events_feed(w: World) -> None:
    assert listed(w, w.alice.get("/v1/events", limit=500))["results"]
    assert listed(w, w.alice.get("/v1/events", run_id=B_RUN), B_RUN)["results"] == []


def usage_read(w: World) -> None:
    for group_by in ("tool", "agent", "run"):
        listed(w, w.alice.get("/v1/finops/usage", group_by=group_by))


def usage_report(w: World) -> None:
    event = {"unit": "llm_tokens", "run_id": B_RUN, "tool": B_TOOL}
    response = w.alice.post("/v1/finops/usage", {"events": [event]})
    assert response.status_code == 201, response.content
    no_trace(w, response, B_RUN + B_TOOL)


def runs_start(w: World) -> None:
    # Run ids are the tenant's own: B's id makes A a run of its own, B's stays as it was.
    response = w.alice.post("/v1/runs", {"run_id": B_RUN})
    assert response.status_code == 201, response.content
    no_trace(w, response, B_RUN)


def run_detail(w: World) -> None:
    hidden(w, w.alice.get(f"/v1/runs/{B_RUN}"), B_RUN)


def run_resume(w: World) -> None:
    hidden(w, w.alice.post(f"/v1/runs/{B_RUN}/resume"), B_RUN)


def approvals_list(w: World) -> None:
    for api in (w.alice, w.rita):
        listed(w, api.get("/v1/approvals", limit=500))
        listed(w, api.get("/v1/approvals", cursor=w.approval), w.approval)
        listed(w, api.get("/v1/approvals", tool="payments.transfer"))


def approval_decision(w: World) -> None:
    path = f"/v1/approvals/{w.approval}/decision"
    for verdict in ("approve", "deny"):
        response = w.rita.post(path, {"verdict": verdict, "reason": "looks fine"})
        hidden(w, response, w.approval)
    # An agent's key may decide nothing, B's approvals included: the same refusal as
    # for its own tenant's.
    response = w.alice.post(path, {"verdict": "approve", "reason": "x"})
    assert response.status_code == 403 and error_of(response)["code"] == "reviewer_required"
    no_trace(w, response, w.approval)


def mcp_door(w: World) -> None:
    def rpc(method: str, params: dict) -> Any:
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        headers = {"Accept": "application/json, text/event-stream"}
        return w.alice.post("/v1/mcp", body, headers=headers)

    assert w.alice.get("/v1/mcp").status_code == 405
    tools = listed(w, rpc("tools/list", {}))["result"]["tools"]
    assert tools and B_TOOL not in {t["_meta"]["eai/tool"]["name"] for t in tools if "_meta" in t}
    # A name the tenant does not have: JSON-RPC -32602, as for any unknown tool.
    unknown = rpc("tools/call", {"name": B_TOOL, "arguments": {}})
    no_trace(w, unknown, B_TOOL)
    assert unknown.json()["error"]["code"] == -32602
    for invocation in (w.finished, w.parked):
        for tool in ("eai_invocation_get", "eai_invocation_cancel"):
            response = rpc("tools/call", {"name": tool, "arguments": {"invocation_id": invocation}})
            no_trace(w, response, invocation)
            result = response.json()["result"]
            assert result["isError"] is True
            assert result["structuredContent"]["error"]["code"] == "not_found"


CASES: dict[tuple[str, str], Callable[[World], None]] = {
    ("v1/tools", "GET"): tools_list,
    ("v1/tools/<str:name>", "GET"): tool_detail,
    ("v1/tools/<str:name>/invoke", "POST"): tool_invoke,
    ("v1/tools/invocations", "GET"): invocations_list,
    ("v1/tools/invocations/<str:invocation_id>", "GET"): invocation_detail,
    ("v1/tools/invocations/<str:invocation_id>/cancel", "POST"): invocation_cancel,
    ("v1/decisions/<str:decision_id>", "GET"): decision_detail,
    ("v1/artifacts/<str:artifact_id>", "GET"): artifact_detail,
    ("v1/contracts/<str:name>", "GET"): contract_detail,
    ("v1/contracts/<str:name>/validate", "POST"): contract_validate,
    ("v1/manifests/apply", "POST"): manifests_apply,
    ("v1/audit/events", "GET"): audit_events,
    ("v1/audit/verify", "GET"): audit_verify,
    ("v1/events", "GET"): events_feed,
    ("v1/finops/usage", "GET"): usage_read,
    ("v1/finops/usage", "POST"): usage_report,
    ("v1/runs", "POST"): runs_start,
    ("v1/runs/<str:run_id>", "GET"): run_detail,
    ("v1/runs/<str:run_id>/resume", "POST"): run_resume,
    ("v1/approvals", "GET"): approvals_list,
    ("v1/approvals/<str:approval_id>/decision", "POST"): approval_decision,
    # MCP: tenant B's tools are never listed or callable with A's key, and B's
    # invocations never readable (tests/test_mcp_server.py holds the protocol's cases).
    # (a function view: the URLconf lists it under GET, which answers 405)
    ("v1/mcp", "GET"): mcp_door,
    # The API's description: the same document for every caller, no tenant's data.
    ("v1/openapi.json", "GET"): lambda w: listed(w, w.alice.get("/v1/openapi.json")),
    ("v1/docs", "GET"): lambda w: listed(w, w.alice.get("/v1/docs")),
}


@pytest.mark.parametrize(("route", "method"), v1_routes())
def test_it_shows_tenant_a_nothing_of_tenant_b_on_any_route(world, route, method):
    case = CASES.get((route, method))
    assert case is not None, f"no cross-tenant case for {method} /{route}: add one to CASES"
    before = snapshot(world.b)
    case(world)
    assert snapshot(world.b) == before


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row-level security is PostgreSQL's")
@pytest.mark.parametrize(("route", "method"), v1_routes())
def test_it_holds_as_the_app_role_under_row_level_security(world, as_app_role, route, method):  # noqa: F811
    """The same walk served through the app role's connection: every route enters the
    tenant's scope for PostgreSQL too (a route that did not would fail its own calls)."""
    before = snapshot(world.b)
    CASES[(route, method)](world)
    assert snapshot(world.b) == before


def test_it_has_no_case_for_a_route_that_is_gone():
    assert set(CASES) <= set(v1_routes())


def test_it_still_lets_b_reach_its_own_objects(world, bob):
    """The cases above hold because B's ids are hidden from A, not because they are
    wrong: the same requests as B find every object."""
    assert bob.get(f"/v1/tools/invocations/{world.finished}").status_code == 200
    assert bob.get(f"/v1/decisions/{world.decisions[0]}").status_code == 200
    assert bob.get(f"/v1/artifacts/{world.artifact}").status_code == 200
    assert bob.get(f"/v1/runs/{B_RUN}").status_code == 200
    assert bob.get(f"/v1/tools/{B_TOOL}").status_code == 200
    with scope(world.b):
        assert Invocation.objects.get(pk=world.parked).status == "waiting_approval"
