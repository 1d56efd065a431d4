"""The admin portal: staff work in one tenant at a time, reviewers see and decide only
their tools' approvals, records are read-only, and logins are rate-limited.

Personas: Alice's agent makes calls in acme, Bob's agent in globex. Rita reviews
payments in acme; Sam is acme staff without that right; Olga is staff of both acme and
globex; Tara is acme's tenant admin."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from guardian.shortcuts import assign_perm

from gateway.audit import verify_chain
from gateway.keys import issue_api_key
from gateway.models import ApprovalRequest, AuditEvent, Invocation, Tool
from gateway.pipeline import execute_queued
from tenants import lockout
from tenants.models import Membership
from tenants.scope import tenant_scope

from .conftest import ALL_SCOPES, Api, scope, tamper

IBAN = "FR7630006000011234567890189"
XSS = "<script>alert(1)</script>"
PASSWORD = "correct horse battery staple"
VIEWED = [
    "approvalrequest",
    "invocation",
    "decision",
    "tool",
    "manifestversion",
    "auditevent",
    "event",
    "apikey",
]


def staff(username, tenant, *tools, role=Membership.ROLE_REVIEWER):
    """A staff member of `tenant` with the reviewers' view rights (as the demo's
    Reviewers group) and the review right on `tools`."""
    user = get_user_model().objects.create_user(username, password=PASSWORD, is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=[f"view_{m}" for m in VIEWED]))
    Membership.objects.create(user=user, tenant=tenant, role=role)
    for name in tools:
        with tenant_scope(tenant, readonly=True):
            tool = Tool.objects.get(tenant=tenant, name=name)
        assign_perm("gateway.review_tool", user, tool)
    return user


def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def park(api, **fields):
    tool_input = {"iban": IBAN, "amount": "10.00", "reference": XSS, **fields}
    response = api.invoke("payments.transfer", tool_input, run_id="run_p")
    assert response.status_code == 202, response.content
    return response.json()


def page_of(approval_id: str) -> str:
    return f"/admin/gateway/approvalrequest/{approval_id}/change/"


QUEUE = "/admin/gateway/approvalrequest/"


@pytest.fixture
def rita(tenant_a):
    return staff("rita", tenant_a, "payments.transfer")


@pytest.fixture
def sam(tenant_a):
    return staff("sam", tenant_a)


@pytest.fixture
def olga(tenant_a, tenant_b):
    user = staff("olga", tenant_a)
    Membership.objects.create(user=user, tenant=tenant_b)
    return user


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    # PBKDF2's deliberate slowness costs seconds over a few dozen logins here.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _no_lockout_left():
    # The failure counters live in the cache, which outlives a test's database.
    lockout.reset("rita", "127.0.0.1")
    yield
    for name in ("rita", "sam", "nobody"):
        lockout.reset(name, "127.0.0.1")


# ------------------------------------------------------------- active tenant


def test_it_shows_olga_only_the_active_tenants_rows(alice, bob, olga, tenant_b):
    acme_call = alice.invoke("jira.search", {"q": "INC-42"}).json()["invocation_id"]
    globex_call = bob.invoke("jira.search", {"q": "INC-43"}).json()["invocation_id"]
    client = browser(olga)

    page = client.get("/admin/gateway/invocation/")
    assert page.status_code == 200
    html = page.content.decode()
    assert acme_call in html and globex_call not in html
    assert 'id="tenant-switcher"' in html and "globex" in html  # her two tenants
    assert client.get(f"/admin/gateway/invocation/{globex_call}/change/").status_code == 404

    switched = client.post("/admin/switch-tenant/", {"tenant": str(tenant_b.pk)})
    assert switched.status_code == 302
    html = client.get("/admin/gateway/invocation/").content.decode()
    assert globex_call in html and acme_call not in html
    assert client.get(f"/admin/gateway/invocation/{acme_call}/change/").status_code == 404
    assert client.get(f"/admin/gateway/invocation/{globex_call}/change/").status_code == 200


def test_it_answers_404_when_sam_switches_to_a_tenant_he_does_not_belong_to(
    alice, bob, sam, tenant_b
):
    globex_call = bob.invoke("jira.search", {"q": "INC-43"}).json()["invocation_id"]
    client = browser(sam)
    assert client.post("/admin/switch-tenant/", {"tenant": str(tenant_b.pk)}).status_code == 404
    assert client.post("/admin/switch-tenant/", {"tenant": "not-a-uuid"}).status_code == 404
    assert client.get("/admin/switch-tenant/").status_code == 405
    assert globex_call not in client.get("/admin/gateway/invocation/").content.decode()


def test_it_needs_the_csrf_token_to_switch(olga, tenant_b):
    client = Client(enforce_csrf_checks=True)
    client.force_login(olga)
    assert client.post("/admin/switch-tenant/", {"tenant": str(tenant_b.pk)}).status_code == 403


def test_it_scopes_api_keys_to_the_active_tenant(alice, bob, sam):
    html = browser(sam).get("/admin/tenants/apikey/").content.decode()
    assert alice.key.public_id in html and bob.key.public_id not in html
    assert browser(sam).get(f"/admin/tenants/apikey/{bob.key.pk}/change/").status_code == 404


# ------------------------------------------------------------------ approvals


def test_it_shows_sam_an_empty_queue_and_no_approval_page(alice, sam):
    parked = park(alice)
    client = browser(sam)
    queue = client.get(QUEUE)
    assert queue.status_code == 200
    assert parked["approval_id"] not in queue.content.decode()
    assert client.get(page_of(parked["approval_id"])).status_code == 404
    denied = client.post(
        page_of(parked["approval_id"]), {"verdict": "approve", "reason": "looks fine"}
    )
    assert denied.status_code == 404
    with scope(alice.key.tenant):
        assert ApprovalRequest.objects.get(pk=parked["approval_id"]).status == "pending"


def test_it_opens_ritas_queue_on_pending_calls_with_counts(alice, rita, bob):
    waiting = park(alice)
    done = park(alice, amount="11.00")
    client = browser(rita)
    decided = client.post(
        page_of(done["approval_id"]), {"verdict": "deny", "reason": "duplicate"}, follow=True
    )
    assert "is now denied" in decided.content.decode()
    globex = park(bob)

    html = client.get(QUEUE).content.decode()
    assert waiting["approval_id"] in html
    assert done["approval_id"] not in html  # decided: not in the default (pending) view
    assert globex["approval_id"] not in html
    assert "pending (1)" in html and "denied (1)" in html  # facet counts
    assert "run_p" in html and "alice-agent" in html

    everything = client.get(QUEUE, {"status": "all"}).content.decode()
    assert waiting["approval_id"] in everything and done["approval_id"] in everything
    recent = client.get(QUEUE, {"status": "all", "age": "gt24h"}).content.decode()
    assert waiting["approval_id"] not in recent


def test_it_shows_the_call_escaped_with_its_decision_and_run(alice, rita):
    alice.invoke("jira.search", {"q": "INC-42"}, run_id="run_p")
    parked = park(alice)
    response = browser(rita).get(page_of(parked["approval_id"]))
    assert response.status_code == 200
    html = response.content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert XSS not in html
    assert parked["approval_id"] in html and "payments.transfer" in html
    with scope(alice.key.tenant):
        approval = ApprovalRequest.objects.get(pk=parked["approval_id"])
    assert approval.policy_version in html and approval.input_digest in html
    assert "agent.tool.requested" in html  # the run's earlier step, jira.search
    assert "agent.authorization.required" in html
    assert 'id="decide-form"' in html and "csrfmiddlewaretoken" in html


def test_it_approves_with_a_reason_and_the_call_runs(alice, rita, tenant_a):
    parked = park(alice)
    client = browser(rita)
    response = client.post(
        page_of(parked["approval_id"]), {"verdict": "approve", "reason": "known supplier"}
    )
    assert response.status_code == 302 and response["Location"] == page_of(parked["approval_id"])
    with scope(alice.key.tenant):
        invocation = Invocation.objects.get(pk=parked["invocation_id"])
    assert invocation.status == "queued"  # runs once the decision commits
    assert execute_queued(invocation.id, tenant_a) == "succeeded"

    html = client.get(page_of(parked["approval_id"])).content.decode()
    assert "approved" in html and "known supplier" in html and "rita" in html
    assert 'id="decide-form"' not in html  # no second decision on a closed approval
    assert "executed" in html  # the call's result


def test_it_refuses_a_decision_without_csrf_token_or_from_another_origin(alice, rita):
    parked = park(alice)
    client = Client(enforce_csrf_checks=True)
    client.force_login(rita)
    client.get(page_of(parked["approval_id"]))  # sets the CSRF cookie
    token = client.cookies["csrftoken"].value
    vote = {"verdict": "approve", "reason": "fine"}
    assert client.post(page_of(parked["approval_id"]), vote).status_code == 403
    forged = client.post(
        page_of(parked["approval_id"]),
        {**vote, "csrfmiddlewaretoken": token},
        headers={"origin": "http://evil.example"},
    )
    assert forged.status_code == 403
    with scope(alice.key.tenant):
        assert ApprovalRequest.objects.get(pk=parked["approval_id"]).status == "pending"
    genuine = client.post(
        page_of(parked["approval_id"]),
        {**vote, "csrfmiddlewaretoken": token},
        headers={"origin": "http://testserver"},
    )
    assert genuine.status_code == 302
    with scope(alice.key.tenant):
        assert ApprovalRequest.objects.get(pk=parked["approval_id"]).status == "approved"


def test_it_refuses_a_deny_without_a_reason_in_the_reviewers_language(alice, rita):
    parked = park(alice)
    client = browser(rita)
    response = client.post(
        page_of(parked["approval_id"]), {"verdict": "deny", "reason": "  "}, follow=True
    )
    assert "A reason is required to decide." in response.content.decode()
    response = client.post(
        page_of(parked["approval_id"]),
        {"verdict": "deny", "reason": ""},
        headers={"accept-language": "fr"},
        follow=True,
    )
    assert "Un motif est obligatoire pour décider." in response.content.decode()
    with scope(alice.key.tenant):
        assert ApprovalRequest.objects.get(pk=parked["approval_id"]).status == "pending"


def test_it_never_lets_rita_decide_on_her_own_call(tenant_a, rita):
    _, raw = issue_api_key(tenant=tenant_a, scopes=ALL_SCOPES, agent="rita-bot", user=rita)
    parked = park(Api(raw))
    client = browser(rita)
    assert "a key you own or created" in client.get(page_of(parked["approval_id"])).content.decode()
    response = client.post(
        page_of(parked["approval_id"]), {"verdict": "approve", "reason": "mine"}, follow=True
    )
    assert "You cannot decide on a call made with a key you own or created." in (
        response.content.decode()
    )
    with scope(tenant_a):
        assert ApprovalRequest.objects.get(pk=parked["approval_id"]).status == "pending"


# ------------------------------------------------------------------ read-only


def test_it_shows_the_chain_verification_on_the_audit_list(alice, rita, tenant_a):
    park(alice)
    client = browser(rita)
    html = client.get("/admin/gateway/auditevent/").content.decode()
    with scope(tenant_a):
        chain = verify_chain(tenant_a)
    assert chain["valid"] and chain["length"] > 0
    assert "Audit chain: valid" in html
    assert f"length {chain['length']}" in html and chain["head_hash"] in html

    # Someone rewrites a row behind the application's back: the banner says so.
    with scope(tenant_a):
        first = AuditEvent.objects.get(tenant=tenant_a, seq=1)
    tamper(tenant_a, "UPDATE gateway_auditevent SET actor = 'user:666' WHERE id = %s", [first.pk])
    html = client.get("/admin/gateway/auditevent/").content.decode()
    assert "Audit chain: INVALID" in html and "first invalid seq <strong>1</strong>" in html


def test_it_never_changes_or_deletes_audit_rows_even_for_a_superuser(alice, tenant_a):
    park(alice)
    root = get_user_model().objects.create_superuser("root", password=PASSWORD)
    Membership.objects.create(user=root, tenant=tenant_a, role=Membership.ROLE_ADMIN)
    client = browser(root)
    with scope(tenant_a):
        row = AuditEvent.objects.filter(tenant=tenant_a).first()
    url = f"/admin/gateway/auditevent/{row.pk}/"

    page = client.get(url + "change/")
    assert page.status_code == 200
    assert 'name="_save"' not in page.content.decode()
    assert client.post(url + "change/", {"actor": "user:666"}).status_code == 403
    assert client.get(url + "delete/").status_code == 403
    assert client.post(url + "delete/", {"post": "yes"}).status_code == 403
    assert client.get("/admin/gateway/auditevent/add/").status_code == 403
    listing = client.get("/admin/gateway/auditevent/").content.decode()
    assert "delete_selected" not in listing
    row.refresh_from_db()
    assert row.actor != "user:666"
    with scope(tenant_a):
        assert verify_chain(tenant_a)["valid"]


def test_it_keeps_invocations_and_decisions_read_only(alice, rita):
    call = alice.invoke("jira.search", {"q": "INC-42"}).json()
    client = browser(rita)
    page = client.get(f"/admin/gateway/invocation/{call['invocation_id']}/change/")
    assert page.status_code == 200 and 'name="_save"' not in page.content.decode()
    assert client.get(f"/admin/gateway/decision/{call['decision_id']}/delete/").status_code == 403


# ---------------------------------------------------------------------- tools


def test_it_lets_tara_the_tenant_admin_disable_a_tool_and_grant_review_rights(
    tenant_a, tenant_b, sam, rita
):
    tara = staff("tara", tenant_a, role=Membership.ROLE_ADMIN)
    outsider = staff("otto", tenant_b)
    with tenant_scope(tenant_a, readonly=True):
        tool = Tool.objects.get(tenant=tenant_a, name="payments.transfer")
    client = browser(tara)

    page = client.get(f"/admin/gateway/tool/{tool.pk}/change/").content.decode()
    assert "Reviewer rights" in page and 'name="disabled"' in page
    saved = client.post(f"/admin/gateway/tool/{tool.pk}/change/", {"disabled": "on"})
    assert saved.status_code == 302
    with tenant_scope(tenant_a, readonly=True):
        tool.refresh_from_db()
        assert AuditEvent.objects.filter(tenant=tenant_a, action="tool.disabled").exists()
    assert tool.disabled

    rights = f"/admin/gateway/tool/{tool.pk}/permissions/"
    assert client.get(rights).status_code == 200
    granted = client.post(f"{rights}user-manage/{sam.pk}/", {"permissions": ["review_tool"]})
    assert granted.status_code == 302
    assert sam.has_perm("gateway.review_tool", tool)
    with tenant_scope(tenant_a, readonly=True):
        granted_audit = AuditEvent.objects.filter(tenant=tenant_a, action="tool.reviewer.granted")
        assert granted_audit.exists()
    refused = client.post(f"{rights}user-manage/{outsider.pk}/", {"permissions": ["review_tool"]})
    assert refused.status_code == 404

    # Rita reviews but does not administer: the tool is read-only for her.
    reviewer = browser(rita)
    page = reviewer.get(f"/admin/gateway/tool/{tool.pk}/change/").content.decode()
    assert "Reviewer rights" not in page and 'name="disabled"' not in page
    assert reviewer.post(f"/admin/gateway/tool/{tool.pk}/change/", {}).status_code == 403
    assert reviewer.get(rights).status_code == 302  # guardian sends her to the index


def test_it_answers_404_for_another_tenants_tool(tenant_a, tenant_b):
    tara = staff("tara", tenant_a, role=Membership.ROLE_ADMIN)
    with tenant_scope(tenant_b, readonly=True):
        theirs = Tool.objects.get(tenant=tenant_b, name="payments.transfer")
    client = browser(tara)
    assert client.get(f"/admin/gateway/tool/{theirs.pk}/change/").status_code == 404
    assert client.get(f"/admin/gateway/tool/{theirs.pk}/permissions/").status_code == 404


# -------------------------------------------------------------------- logins


def login(client: Client, username: str, password: str):
    return client.post("/admin/login/?next=/admin/", {"username": username, "password": password})


def test_it_locks_rita_out_after_five_bad_passwords(rita):
    client = Client()
    for _ in range(lockout.LIMIT):
        response = login(client, "rita", "wrong")
        assert response.status_code == 200
        assert "Please enter the correct username and password" in response.content.decode()
    response = login(client, "rita", PASSWORD)  # even the right password, now
    assert response.status_code == 200
    assert "Too many failed login attempts" in response.content.decode()
    assert "_auth_user_id" not in client.session

    lockout.reset("rita", "127.0.0.1")  # 15 minutes later
    assert login(client, "rita", PASSWORD).status_code == 302


def test_it_forgets_failures_after_a_successful_login(rita):
    for _ in range(lockout.LIMIT - 1):
        login(Client(), "rita", "wrong")
    assert login(Client(), "rita", PASSWORD).status_code == 302
    for _ in range(lockout.LIMIT - 1):
        login(Client(), "rita", "wrong")
    assert login(Client(), "rita", PASSWORD).status_code == 302


# ------------------------------------------------------- separation of duties, keys


def test_a_tenant_admin_cannot_decide_on_her_own_call_by_way_of_keys(
    alice, tenant_a, tenant_b, rita
):
    """The bypasses a review found: a key minted for another reviewer, a key re-assigned
    or deleted after the call. Each now fails, and key changes are chained."""
    from approvals.decisions import decide
    from eai.errors import ApiError
    from tenants.models import ApiKey

    tara = staff("tara", tenant_a, "payments.transfer", role=Membership.ROLE_ADMIN)
    tara.user_permissions.add(
        *Permission.objects.filter(codename__in=["add_apikey", "change_apikey", "delete_apikey"])
    )
    staff("otto", tenant_b)
    client = browser(tara)

    # The add form offers the active tenant's staff only.
    form = client.get("/admin/tenants/apikey/add/").content.decode()
    assert ">rita<" in form and ">otto<" not in form and "AnonymousUser" not in form

    # Tara parks a transfer with a key of her own.
    own, raw = issue_api_key(
        tenant=tenant_a, scopes=["tools:invoke", "payments:write"], user=tara, created_by=tara
    )
    parked = park(Api(raw))
    with scope(alice.key.tenant):
        approval = ApprovalRequest.objects.get(pk=parked["approval_id"])
    assert approval.requested_by_users == [tara.pk]

    # (a) A key she issues to Rita cannot decide: she saw its secret.
    _, minted = issue_api_key(
        tenant=tenant_a, scopes=["approvals:decide"], user=rita, created_by=tara
    )
    refused = Api(minted).post(
        f"/v1/approvals/{parked['approval_id']}/decision",
        {"verdict": "approve", "reason": "looks fine"},
    )
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "reviewer_required"

    # (b) Her key cannot be given to someone else: the user field is read-only.
    change = f"/admin/tenants/apikey/{own.pk}/change/"
    saved = client.post(
        change, {"name": "renamed", "agent": "", "scopes": '["tools:invoke"]', "user": rita.pk}
    )
    assert saved.status_code == 302, saved.content.decode()[:2000]
    own.refresh_from_db()
    assert own.user_id == tara.pk and own.name == "renamed" and own.scopes == ["tools:invoke"]
    with scope(tenant_a):
        changed = AuditEvent.objects.get(tenant=tenant_a, action="apikey.changed")
    assert changed.actor == f"user:{tara.pk}"
    with scope(tenant_a):
        assert verify_chain(tenant_a)["valid"] is True

    # (c) Nor deleted (revoked instead); and were it changed behind the admin's back,
    # the users recorded with the call still bar her.
    assert client.get(f"/admin/tenants/apikey/{own.pk}/delete/").status_code == 403
    ApiKey.objects.filter(pk=own.pk).update(user=None, created_by=None)
    with pytest.raises(ApiError) as barred:
        decide(
            tenant=tenant_a,
            approval_id=parked["approval_id"],
            reviewer=tara,
            verdict="approve",
            reason="mine",
        )
    assert barred.value.code == "separation_of_duties"


def test_a_view_right_on_keys_neither_revokes_them_nor_lists_the_tenants(
    sam, tenant_a, tenant_b, alice
):
    """Revoking is a change: one request of a member with only the view right revoked
    every key of the tenant. And the list's filter by tenant named every tenant."""
    from tenants.models import ApiKey

    client = browser(sam)
    page = client.get("/admin/tenants/apikey/").content.decode()
    assert "globex" not in page and "By tenant" not in page
    response = client.post(
        "/admin/tenants/apikey/",
        {"action": "revoke", "_selected_action": [alice.key.pk], "index": 0, "select_across": 1},
    )
    assert response.status_code in (200, 302)
    assert ApiKey.objects.get(pk=alice.key.pk).revoked_at is None
    assert alice.get("/v1/tools").status_code == 200
    # Who may change keys may revoke them.
    sam.user_permissions.add(Permission.objects.get(codename="change_apikey"))
    sam = get_user_model().objects.get(pk=sam.pk)  # permissions are cached on the user
    browser(sam).post(
        "/admin/tenants/apikey/",
        {"action": "revoke", "_selected_action": [alice.key.pk], "index": 0},
    )
    assert ApiKey.objects.get(pk=alice.key.pk).revoked_at is not None


class CountingBackend:
    """An authentication backend that only counts the attempts that reach it (those
    the lockout let through to a password check)."""

    reached = 0
    lock = __import__("threading").Lock()

    def authenticate(self, request, username=None, password=None, **kwargs):
        with CountingBackend.lock:
            CountingBackend.reached += 1
        return None


@pytest.mark.django_db(transaction=True)
def test_a_burst_of_logins_sent_at_once_is_held_to_the_limit(rita, settings):
    """Counted after the password check, attempts sent together all passed the lock
    while their passwords were hashed (17 of 40 checked, not 5)."""
    import threading

    from django.contrib.auth import authenticate

    settings.AUTHENTICATION_BACKENDS = [
        "tenants.lockout.LockoutBackend",
        "tests.test_admin_portal.CountingBackend",
        "django.contrib.auth.backends.ModelBackend",
    ]
    CountingBackend.reached = 0
    start = threading.Barrier(40)

    def attempt():
        start.wait()
        authenticate(None, username="rita", password="wrong")

    threads = [threading.Thread(target=attempt) for _ in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert CountingBackend.reached == lockout.LIMIT
    assert authenticate(None, username="rita", password=PASSWORD) is None  # locked
    lockout.reset("rita")


@pytest.mark.django_db(transaction=True)
def test_logins_that_succeed_together_lock_nobody_out(rita):
    """Attempts in flight count toward the burst bound, not toward the lock: six good
    logins at once from one address leave it open."""
    import threading

    start = threading.Barrier(6)
    statuses = []

    def attempt():
        start.wait()
        statuses.append(login(Client(), "rita", PASSWORD).status_code)

    threads = [threading.Thread(target=attempt) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert statuses.count(302) >= lockout.LIMIT
    assert not lockout.is_locked("rita", "127.0.0.1")
    assert login(Client(), "rita", PASSWORD).status_code == 302
