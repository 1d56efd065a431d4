"""Approvals: bound to the exact call, decided by distinct reviewers holding the tool's
right, never by the requester, once under races, and expiring by sweep.

Personas: Alice's agent makes calls in acme; Rita reviews payments in acme; Sam is
acme staff without the payments right; Bob's agent lives in globex."""

import threading
import time
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone
from guardian.shortcuts import assign_perm

from approvals.decisions import decide, expire_all
from eai.errors import ApiError
from gateway.keys import issue_api_key
from gateway.manifests import apply_manifests
from gateway.models import ApprovalRequest, AuditEvent, Invocation, Tool
from tenants.models import Membership
from tenants.scope import tenant_scope

from .conftest import Api, error_of, scope

IBAN = "FR7630006000011234567890189"


def staff(username, tenant, *tools):
    user = get_user_model().objects.create_user(
        username, password="pw-" + username * 2, is_staff=True
    )
    Membership.objects.create(user=user, tenant=tenant)
    for name in tools:
        with tenant_scope(tenant, readonly=True):
            tool = Tool.objects.get(tenant=tenant, name=name)
        assign_perm("gateway.review_tool", user, tool)
    return user


def reviewer_api(user, tenant):
    _, raw = issue_api_key(tenant=tenant, scopes=["approvals:read", "approvals:decide"], user=user)
    return Api(raw)


@pytest.fixture
def rita(tenant_a):
    return staff("rita", tenant_a, "payments.transfer")


@pytest.fixture
def sam(tenant_a):
    return staff("sam", tenant_a)


def park(api, amount="10.00"):
    response = api.invoke("payments.transfer", {"iban": IBAN, "amount": amount}, run_id="run_p")
    assert response.status_code == 202, response.content
    return response.json()


def test_rita_approves_and_the_call_runs(alice, rita, django_capture_on_commit_callbacks):
    parked = park(alice)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        decide(
            tenant=alice.key.tenant,
            approval_id=parked["approval_id"],
            reviewer=rita,
            verdict="approve",
            reason="known supplier",
        )
    assert len(callbacks) == 1  # queued for execution once the decision commits
    with scope(alice.key.tenant):
        invocation = Invocation.objects.get(pk=parked["invocation_id"])
    assert invocation.status == "queued"
    from gateway.pipeline import execute_queued

    assert execute_queued(invocation.id, alice.key.tenant) == "succeeded"
    assert execute_queued(invocation.id, alice.key.tenant) is None  # a redelivery does nothing
    invocation.refresh_from_db()
    assert invocation.output["status"] == "executed"
    assert invocation.sealed_input is None  # the raw input is destroyed once the call ends
    with scope(alice.key.tenant):
        approval = ApprovalRequest.objects.get(pk=parked["approval_id"])
    assert approval.status == "approved"
    with scope(alice.key.tenant):
        actions = list(AuditEvent.objects.values_list("action", flat=True))
    assert actions.count("approval.decided") == 1 and actions[-1] == "tool.invoke"


def test_a_deny_ends_it(alice, rita):
    parked = park(alice)
    decide(
        tenant=alice.key.tenant,
        approval_id=parked["approval_id"],
        reviewer=rita,
        verdict="deny",
        reason="unknown IBAN",
    )
    with scope(alice.key.tenant):
        invocation = Invocation.objects.get(pk=parked["invocation_id"])
    assert invocation.status == "denied" and invocation.error["code"] == "approval_denied"
    assert invocation.sealed_input is None
    got = alice.get(f"/v1/tools/invocations/{parked['invocation_id']}").json()
    assert got["status"] == "denied"


def test_min_approvers_needs_distinct_reviewers(alice, tenant_a, rita):
    with tenant_scope(tenant_a, readonly=True):
        tool = Tool.objects.get(tenant=tenant_a, name="payments.transfer")
    manifest = tool.manifest
    manifest["spec"]["approval"]["min_approvers"] = 2
    manifest["metadata"]["version"] = "1.1.0"
    apply_manifests(tenant=tenant_a, documents=[manifest])
    vera = staff("vera", tenant_a, "payments.transfer")
    parked = park(alice)
    decide(
        tenant=tenant_a,
        approval_id=parked["approval_id"],
        reviewer=rita,
        verdict="approve",
        reason="ok",
    )
    with tenant_scope(tenant_a, readonly=True):
        assert Invocation.objects.get(pk=parked["invocation_id"]).status == "waiting_approval"
    with pytest.raises(ApiError) as again:
        decide(
            tenant=tenant_a,
            approval_id=parked["approval_id"],
            reviewer=rita,
            verdict="approve",
            reason="ok",
        )
    assert again.value.code == "already_decided"
    decide(
        tenant=tenant_a,
        approval_id=parked["approval_id"],
        reviewer=vera,
        verdict="approve",
        reason="ok too",
    )
    with scope(alice.key.tenant):
        assert Invocation.objects.get(pk=parked["invocation_id"]).status == "queued"


def test_nobody_decides_on_a_call_made_with_their_own_key(tenant_a, rita):
    _, raw = issue_api_key(tenant=tenant_a, scopes=["tools:invoke", "payments:write"], user=rita)
    parked = park(Api(raw))
    with pytest.raises(ApiError) as refused:
        decide(
            tenant=tenant_a,
            approval_id=parked["approval_id"],
            reviewer=rita,
            verdict="approve",
            reason="me",
        )
    assert refused.value.code == "separation_of_duties"
    _, raw = issue_api_key(
        tenant=tenant_a, scopes=["tools:invoke", "payments:write"], created_by=rita
    )
    parked = park(Api(raw))
    with pytest.raises(ApiError) as refused:
        decide(
            tenant=tenant_a,
            approval_id=parked["approval_id"],
            reviewer=rita,
            verdict="approve",
            reason="me",
        )
    assert refused.value.code == "separation_of_duties"


def test_sam_without_the_tool_right_can_neither_see_nor_decide(alice, sam, tenant_a):
    parked = park(alice)
    api = reviewer_api(sam, tenant_a)
    assert api.get("/v1/approvals").json()["results"] == []
    response = api.post(
        f"/v1/approvals/{parked['approval_id']}/decision", {"verdict": "approve", "reason": "x"}
    )
    assert response.status_code == 404
    with scope(alice.key.tenant):
        assert Invocation.objects.get(pk=parked["invocation_id"]).status == "waiting_approval"


def test_a_reason_is_mandatory(alice, rita, tenant_a):
    parked = park(alice)
    api = reviewer_api(rita, tenant_a)
    for body in ({"verdict": "approve"}, {"verdict": "approve", "reason": "   "}):
        response = api.post(f"/v1/approvals/{parked['approval_id']}/decision", body)
        assert response.status_code == 400
        assert error_of(response)["code"] == "reason_required"
    response = api.post(
        f"/v1/approvals/{parked['approval_id']}/decision", {"verdict": "maybe", "reason": "x"}
    )
    assert error_of(response)["code"] == "invalid_verdict"


def test_rita_decides_through_the_api(alice, rita, tenant_a):
    parked = park(alice)
    api = reviewer_api(rita, tenant_a)
    listed = api.get("/v1/approvals", status="pending").json()["results"]
    assert [a["approval_id"] for a in listed] == [parked["approval_id"]]
    assert listed[0]["input"]["amount"] == "10.00"
    for params, code in (
        ({"cursor": "zzz"}, "invalid_cursor"),
        ({"status": "bogus"}, "invalid_request"),
    ):
        bad = api.get("/v1/approvals", **params)
        assert bad.status_code == 400 and error_of(bad)["code"] == code
    response = api.post(
        f"/v1/approvals/{parked['approval_id']}/decision",
        {"verdict": "deny", "reason": "not today"},
    )
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "denied"
    again = api.post(
        f"/v1/approvals/{parked['approval_id']}/decision", {"verdict": "approve", "reason": "x"}
    )
    assert again.status_code == 409


def test_an_agent_key_can_never_authorize_itself(alice, tenant_a, make_api):
    parked = park(alice)
    agent = make_api(tenant_a, scopes=["approvals:read", "approvals:decide"])
    response = agent.post(
        f"/v1/approvals/{parked['approval_id']}/decision", {"verdict": "approve", "reason": "x"}
    )
    assert response.status_code == 403
    assert error_of(response)["code"] == "reviewer_required"
    # The agent sees only its own approval requests.
    assert agent.get("/v1/approvals").json()["results"] == []
    mine = make_api(tenant_a, scopes=["approvals:read"])
    assert mine.get("/v1/approvals").json()["results"] == []


def test_bob_cannot_reach_acme_approvals(alice, bob, rita, tenant_b):
    parked = park(alice)
    bob_reviewer = staff("bobr", tenant_b, "payments.transfer")
    api = reviewer_api(bob_reviewer, tenant_b)
    assert api.get("/v1/approvals").json()["results"] == []
    response = api.post(
        f"/v1/approvals/{parked['approval_id']}/decision", {"verdict": "approve", "reason": "x"}
    )
    assert response.status_code == 404


def test_a_late_verdict_expires_the_approval_and_is_refused(alice, rita):
    parked = park(alice)
    with scope(alice.key.tenant):
        ApprovalRequest.objects.filter(pk=parked["approval_id"]).update(
            expires_at=timezone.now() - timedelta(seconds=1)
        )
    with pytest.raises(ApiError) as late:
        decide(
            tenant=alice.key.tenant,
            approval_id=parked["approval_id"],
            reviewer=rita,
            verdict="approve",
            reason="too late",
        )
    assert late.value.code == "approval_closed"
    with scope(alice.key.tenant):
        assert ApprovalRequest.objects.get(pk=parked["approval_id"]).status == "expired"
        assert Invocation.objects.get(pk=parked["invocation_id"]).status == "expired"
    assert expire_all() == 0


def test_the_sweeper_expires_overdue_approvals_once(alice, rita):
    parked = park(alice)
    with scope(alice.key.tenant):
        ApprovalRequest.objects.filter(pk=parked["approval_id"]).update(
            expires_at=timezone.now() - timedelta(seconds=1)
        )
    assert expire_all() == 1
    assert expire_all() == 0
    with scope(alice.key.tenant):
        invocation = Invocation.objects.get(pk=parked["invocation_id"])
    assert invocation.status == "expired" and invocation.error["code"] == "approval_expired"
    with pytest.raises(ApiError) as late:
        decide(
            tenant=alice.key.tenant,
            approval_id=parked["approval_id"],
            reviewer=rita,
            verdict="approve",
            reason="x",
        )
    assert late.value.code == "approval_closed"
    with scope(alice.key.tenant):
        assert (
            list(AuditEvent.objects.values_list("action", flat=True)).count("approval.expired") == 1
        )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("racer", ["second_reviewer", "expiry"])
def test_races_change_the_state_once(alice, tenant_a, racer):
    rita = staff("rita", tenant_a, "payments.transfer")
    vera = staff("vera", tenant_a, "payments.transfer")
    parked = park(alice)
    if racer == "expiry":
        with scope(alice.key.tenant):
            ApprovalRequest.objects.filter(pk=parked["approval_id"]).update(
                expires_at=timezone.now() + timedelta(milliseconds=50)
            )
    outcomes = []
    barrier = threading.Barrier(2)

    def approve(user):
        barrier.wait()
        try:
            decide(
                tenant=tenant_a,
                approval_id=parked["approval_id"],
                reviewer=user,
                verdict="approve",
                reason="go",
            )
            outcomes.append("approved")
        except ApiError as exc:
            outcomes.append(exc.code)
        finally:
            connection.close()

    def sweep():
        barrier.wait()

        time.sleep(0.05)
        outcomes.append(f"expired:{expire_all()}")
        connection.close()

    threads = [
        threading.Thread(target=approve, args=(rita,)),
        threading.Thread(target=approve, args=(vera,))
        if racer == "second_reviewer"
        else threading.Thread(target=sweep),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # An approved call runs on the in-process executor: let it finish before teardown
    # flushes the tables under it.
    tenant = alice.key.tenant
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with tenant_scope(tenant, readonly=True):
            status = Invocation.objects.get(pk=parked["invocation_id"]).status
        if status not in ("queued", "running"):
            break
        time.sleep(0.05)
    assert status in ("succeeded", "expired")
    with tenant_scope(tenant, readonly=True):
        settled = AuditEvent.objects.filter(action__in=["approval.expired"]).count()
        decided_moves = AuditEvent.objects.filter(action="tool.invoke").count()
        approval_status = ApprovalRequest.objects.get(pk=parked["approval_id"]).status
    if status == "expired":
        assert settled == 1 and approval_status == "expired"
    else:
        assert settled == 0 and approval_status == "approved"
    assert decided_moves <= 1


def test_a_reviewers_reason_is_masked_where_it_is_kept(alice, rita, tenant_a):
    """The reason is shown through the API and chained in the audit: an IBAN or a phone
    the reviewer quotes from the call is masked there, as the call's input is."""
    parked = park(alice)
    api = reviewer_api(rita, tenant_a)
    reason = "OK, IBAN FR7630006000011234567890189 tel 06 12 34 56 78 verified"
    response = api.post(
        f"/v1/approvals/{parked['approval_id']}/decision", {"verdict": "deny", "reason": reason}
    )
    assert response.status_code == 200, response.content
    listed = api.get("/v1/approvals", status="denied").json()["results"]
    kept = listed[0]["decisions"][0]["reason"]
    assert kept == "OK, IBAN FR76*******************0189 tel 06 12 ** 56 78 verified"
    with tenant_scope(tenant_a):
        decided = AuditEvent.objects.filter(action="approval.decided").get()
    assert "FR7630006000011234567890189" not in decided.canonical
