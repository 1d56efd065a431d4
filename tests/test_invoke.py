"""POST /v1/tools/{name}/invoke: the pipeline's answers for builtin tools."""

import pytest

from gateway.manifests import apply_manifests
from gateway.models import ApprovalRequest, Decision, Invocation, Run
from tenants.scope import tenant_scope

from .conftest import error_of, scope

INVOCATION_FIELDS = {
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
}


def test_it_invokes_a_builtin_tool(alice):
    response = alice.invoke("jira.search", {"q": "INC-42"}, run_id="run_01J9", step_index=4)
    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body) >= INVOCATION_FIELDS
    assert body["status"] == "succeeded"
    assert body["invocation_id"].startswith("tinv_")
    assert body["decision_id"].startswith("dec_")
    assert body["tool"] == "jira.search" and body["tool_version"] == "1.0.0"
    assert body["output"]["issues"][0]["key"] == "INC-42"
    assert body["cost"] == {"amount": "0.001", "currency": "EUR"}
    assert body["run_id"] == "run_01J9" and body["step_index"] == 4
    assert body["approval_id"] is None
    with scope(alice.key.tenant):
        stored = Invocation.objects.get(pk=body["invocation_id"])
    assert stored.status == "succeeded" and stored.step_index == 4
    assert stored.decision.allow is True
    with scope(alice.key.tenant):
        assert Run.objects.filter(tenant=alice.key.tenant, run_id="run_01J9").count() == 1


def test_it_creates_an_unknown_run_once(alice):
    for step in range(3):
        assert (
            alice.invoke("jira.search", {"q": "a"}, run_id="run_x", step_index=step).status_code
            == 200
        )
    with scope(alice.key.tenant):
        assert Run.objects.filter(run_id="run_x").count() == 1


def test_it_denies_without_the_invoke_scope(make_api, tenant_a):
    """Seed test 1: invocation without scope -> 403 policy_denied with a decision_id."""
    api = make_api(tenant_a, scopes=["jira:read", "tools:read"])
    response = api.invoke("jira.search", {"q": "INC-42"})
    assert response.status_code == 403
    error = error_of(response)
    assert error["code"] == "policy_denied"
    assert error["decision_id"].startswith("dec_")
    assert error["invocation_id"].startswith("tinv_")
    assert error["message_i18n"]["en"] == "Denied by policy: missing scope 'tools:invoke'."
    assert (
        error["message_i18n"]["fr"]
        == "Accès refusé par la politique : portée manquante « tools:invoke »."
    )
    with scope(tenant_a):
        decision = Decision.objects.get(pk=error["decision_id"])
    assert decision.allow is False
    assert decision.input_digest.startswith("hmac-sha256:")
    assert decision.policy_version.startswith("sha256:")
    with scope(tenant_a):
        invocation = Invocation.objects.get(pk=error["invocation_id"])
    assert invocation.status == "denied" and invocation.output is None
    assert invocation.error["code"] == "policy_denied"


def test_it_denies_without_a_scope_the_tool_requires(make_api, tenant_a):
    api = make_api(tenant_a, scopes=["tools:invoke"])
    error = error_of(api.invoke("jira.search", {"q": "x"}))
    assert error["code"] == "policy_denied"
    assert "jira:read" in error["message"]


def test_it_parks_a_call_that_requires_approval(alice):
    """Seed test 3: requires_approval -> waiting_approval, 202, with an approval id."""
    response = alice.invoke(
        "payments.transfer",
        {"iban": "FR7630006000011234567890189", "amount": "10.00"},
        run_id="run_pay",
        step_index=1,
    )
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["status"] == "waiting_approval"
    assert body["approval_id"].startswith("apr_")
    assert body["output"] is None and body["finished_at"] is None
    with scope(alice.key.tenant):
        approval = ApprovalRequest.objects.get(pk=body["approval_id"])
    assert approval.invocation_id == body["invocation_id"]
    assert approval.decision_id == body["decision_id"]
    assert approval.input_digest == approval.decision.input_digest
    assert approval.status == "pending" and approval.expires_at > approval.created_at


def test_it_parks_critical_risk_tools_by_policy_obligation(alice):
    from gateway.manifests import apply_manifests

    from .conftest import tool_manifest

    apply_manifests(
        tenant=alice.key.tenant,
        documents=[
            tool_manifest(
                "ops.reboot", {"type": "builtin", "callable": "echo"}, risk_class="critical"
            )
        ],
    )
    body = alice.invoke("ops.reboot", {}).json()
    assert body["status"] == "waiting_approval"
    with scope(alice.key.tenant):
        decision = Decision.objects.get(pk=body["decision_id"])
    assert {"type": "require_approval", "reason": "critical risk class"} in decision.obligations


def test_it_answers_tool_not_found_and_stores_nothing(alice):
    response = alice.invoke("no.such.tool", {"q": "x"})
    assert response.status_code == 404
    assert error_of(response)["code"] == "tool_not_found"
    with scope(alice.key.tenant):
        assert not Invocation.objects.exists() and not Decision.objects.exists()


@pytest.mark.parametrize(
    ("tool_input", "pointer"),
    [
        ({}, ""),
        ({"q": 42}, "/q"),
        ({"q": ""}, "/q"),
        ({"q": "x", "extra": 1}, ""),
        ({"q": "x" * 501}, "/q"),
    ],
)
def test_it_answers_invalid_input_with_pointers(alice, tool_input, pointer):
    response = alice.invoke("jira.search", tool_input)
    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == "invalid_input"
    errors = error["details"]["errors"]
    assert errors and all({"path", "message"} == set(e) for e in errors)
    assert pointer in [e["path"] for e in errors]
    with scope(alice.key.tenant):
        assert not Invocation.objects.exists() and not Decision.objects.exists()


def test_it_lists_every_violation(alice):
    response = alice.invoke("payments.transfer", {"iban": 1, "amount": "abc", "currency": "USD"})
    paths = sorted(e["path"] for e in error_of(response)["details"]["errors"])
    assert paths == ["/amount", "/currency", "/iban"]


@pytest.mark.parametrize("tool_input", ["text", 1, [1, 2], None, True])
def test_it_answers_invalid_input_when_input_is_not_an_object(alice, tool_input):
    response = alice.post("/v1/tools/jira.search/invoke", {"input": tool_input})
    assert response.status_code == 400
    assert error_of(response)["code"] == "invalid_input"


@pytest.mark.parametrize(
    "body",
    [
        [],
        "string",
        7,
        {"input": {"q": "x"}, "unexpected": 1},
        {"input": {"q": "x"}, "run_id": 5},
        {"input": {"q": "x"}, "run_id": ""},
        {"input": {"q": "x"}, "run_id": "bad id with spaces"},
        {"input": {"q": "x"}, "step_index": "4"},
        {"input": {"q": "x"}, "step_index": -1},
        {"input": {"q": "x"}, "step_index": 1.5},
        {"input": {"q": "x"}, "step_index": True},
    ],
)
def test_it_answers_invalid_request_for_a_malformed_envelope(alice, body):
    response = alice.post("/v1/tools/jira.search/invoke", body)
    assert response.status_code == 400, response.content
    assert error_of(response)["code"] == "invalid_request"
    with scope(alice.key.tenant):
        assert not Invocation.objects.exists()


def test_it_answers_400_when_input_is_missing(alice):
    response = alice.post("/v1/tools/jira.search/invoke", {"run_id": "run_1"})
    assert response.status_code == 400
    assert error_of(response)["code"] == "invalid_input"


def test_it_fails_a_builtin_error_as_tool_error(alice):
    response = alice.invoke(
        "payments.transfer", {"iban": "FR7630006000011234567890189", "amount": "1"}
    )
    assert response.status_code == 202  # parked: the builtin error comes after approval


def test_it_answers_503_for_a_disabled_tool(alice):
    from gateway.models import Tool

    with tenant_scope(alice.key.tenant):
        Tool.objects.filter(tenant=alice.key.tenant, name="jira.search").update(disabled=True)
    response = alice.invoke("jira.search", {"q": "x"})
    assert response.status_code == 503
    assert error_of(response)["code"] == "tool_unavailable"


def test_it_does_not_let_the_body_choose_the_tenant(alice, bob):
    response = alice.post("/v1/tools/jira.search/invoke", {"input": {"q": "x"}, "tenant": "globex"})
    assert response.status_code == 400
    body = alice.invoke("jira.search", {"q": "x"}).json()
    with scope(alice.key.tenant):
        assert Invocation.objects.get(pk=body["invocation_id"]).tenant == alice.key.tenant


def test_a_manifest_applied_in_this_process_takes_effect_at_once(alice):
    from gateway.models import Tool

    assert alice.invoke("jira.search", {"q": "x"}).json()["tool_version"] == "1.0.0"
    with scope(alice.key.tenant):
        tool = Tool.objects.get(tenant=alice.key.tenant, name="jira.search")
    manifest = {**tool.manifest, "metadata": {**tool.manifest["metadata"], "version": "1.1.0"}}
    apply_manifests(tenant=alice.key.tenant, documents=[manifest])
    assert alice.invoke("jira.search", {"q": "x"}).json()["tool_version"] == "1.1.0"
    with scope(alice.key.tenant):
        tool.refresh_from_db()
        tool.disabled = True
        tool.save()
    assert error_of(alice.invoke("jira.search", {"q": "x"}))["code"] == "tool_unavailable"


def test_a_change_made_by_another_process_is_seen_within_the_tool_cache_time(alice):
    import time

    from gateway import pipeline
    from gateway.models import Tool

    assert alice.invoke("jira.search", {"q": "x"}).status_code == 200
    # A queryset update sends no signal: to this process it is another process's write.
    with scope(alice.key.tenant):
        Tool.objects.filter(tenant=alice.key.tenant, name="jira.search").update(disabled=True)
    assert alice.invoke("jira.search", {"q": "x"}).status_code == 200  # still cached
    time.sleep(pipeline.TOOL_CACHE_S + 0.05)
    assert error_of(alice.invoke("jira.search", {"q": "x"}))["code"] == "tool_unavailable"


def test_input_patterns_end_at_the_end_of_the_string(alice):
    from .conftest import echo_manifest

    manifest = echo_manifest(
        "util.word",
        {
            "type": "object",
            "properties": {"w": {"type": "string", "pattern": "^[a-z]+$"}},
        },
    )
    apply_manifests(tenant=alice.key.tenant, documents=[manifest])
    assert alice.invoke("util.word", {"w": "abc"}).status_code == 200
    response = alice.invoke("util.word", {"w": "abc\n"})
    assert response.status_code == 400 and error_of(response)["code"] == "invalid_input"


def test_a_run_id_with_a_trailing_newline_is_refused(alice):
    response = alice.invoke("jira.search", {"q": "x"}, run_id="run_x\n")
    assert response.status_code == 400 and error_of(response)["code"] == "invalid_request"
