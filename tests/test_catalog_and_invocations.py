"""Catalog, invocation reads, cancel, long-poll, decisions; with Bob seeing nothing of
Alice's (seed test 4)."""

import threading
import time

import pytest

from gateway.models import ApprovalRequest, Invocation, Tool
from tenants.scope import tenant_scope

from .conftest import error_of, scope


def test_it_lists_the_catalog_flat_with_availability(alice):
    body = alice.get("/v1/tools").json()
    assert body["next_cursor"] is None
    names = [t["name"] for t in body["results"]]
    assert names == ["jira.search", "payments.transfer", "secret.tool"]
    jira = body["results"][0]
    for field in (
        "version",
        "description",
        "input_schema",
        "endpoint",
        "scopes_required",
        "requires_approval",
        "risk_class",
        "cost",
        "idempotent",
        "availability",
    ):
        assert field in jira
    assert jira["availability"]["status"] == "available"
    assert alice.get("/v1/tools/jira.search").json()["name"] == "jira.search"


def test_the_catalog_hides_header_values_and_url_credentials(alice):
    from gateway.manifests import apply_manifests

    from .conftest import tool_manifest

    manifest = tool_manifest(
        "crm.hdr",
        {"type": "http", "url": "http://127.0.0.1:9/x?q=1", "headers": {"X-Api-Key": "k-123"}},
    )
    apply_manifests(tenant=alice.key.tenant, documents=[manifest])
    shown = alice.get("/v1/tools/crm.hdr").json()["endpoint"]
    assert shown["headers"] == {"X-Api-Key": "[hidden]"}
    assert shown["url"] == "http://127.0.0.1:9/x?q=[hidden]"
    # A tool stored before apply refused credentials in its URL.
    with tenant_scope(alice.key.tenant):
        tool = Tool.objects.get(tenant=alice.key.tenant, name="crm.hdr")
        tool.manifest["spec"]["endpoint"]["url"] = "http://admin:hunter2@127.0.0.1:9/x"
        tool.save()
    body = alice.get("/v1/tools").content.decode()
    assert "hunter2" not in body and "k-123" not in body
    assert (
        alice.get("/v1/tools/crm.hdr").json()["endpoint"]["url"] == "http://[hidden]@127.0.0.1:9/x"
    )


def test_it_pages_the_catalog(alice):
    first = alice.get("/v1/tools", limit=2).json()
    assert len(first["results"]) == 2 and first["next_cursor"]
    second = alice.get("/v1/tools", limit=2, cursor=first["next_cursor"]).json()
    assert [t["name"] for t in second["results"]] == ["secret.tool"]
    assert second["next_cursor"] is None
    assert alice.get("/v1/tools", limit="ten").status_code == 400
    assert len(alice.get("/v1/tools", limit=100000).json()["results"]) == 3


def test_charlie_sees_nothing_of_alices_tenant(alice, bob):
    """Seed test 4: tenant B reading tenant A's invocation, tool, decision -> 404."""
    from gateway.manifests import apply_manifests

    from .conftest import tool_manifest

    apply_manifests(
        tenant=alice.key.tenant,
        documents=[tool_manifest("acme.only", {"type": "builtin", "callable": "echo"})],
    )
    body = alice.invoke("jira.search", {"q": "x"}).json()
    parked = alice.invoke(
        "payments.transfer", {"iban": "FR7630006000011234567890189", "amount": "1"}
    ).json()
    for path in (
        f"/v1/tools/invocations/{body['invocation_id']}",
        f"/v1/decisions/{body['decision_id']}",
        "/v1/tools/acme.only",
    ):
        response = bob.get(path)
        assert response.status_code == 404, path
        assert error_of(response)["code"] in ("not_found", "tool_not_found")
    response = bob.post(f"/v1/tools/invocations/{parked['invocation_id']}/cancel")
    assert response.status_code == 404
    with tenant_scope(alice.key.tenant, readonly=True):
        assert Invocation.objects.get(pk=parked["invocation_id"]).status == "waiting_approval"
    assert bob.get("/v1/tools/invocations").json()["results"] == []
    assert bob.invoke("acme.only", {}).status_code == 404


def test_it_reads_one_invocation_in_the_same_shape(alice):
    body = alice.invoke("jira.search", {"q": "INC-7"}, run_id="run_a", step_index=0).json()
    got = alice.get(f"/v1/tools/invocations/{body['invocation_id']}").json()
    assert got == body
    listed = alice.get("/v1/tools/invocations").json()["results"][0]
    assert listed == body


def test_it_filters_and_pages_invocations(alice, make_api):
    other = make_api(alice.key.tenant, agent="other-agent")
    for i in range(3):
        alice.invoke("jira.search", {"q": f"{i}"}, run_id="run_one")
    other.invoke("jira.search", {"q": "z"}, run_id="run_two")
    alice.invoke("secret.tool", {})  # denied
    assert len(alice.get("/v1/tools/invocations", run_id="run_one").json()["results"]) == 3
    assert len(alice.get("/v1/tools/invocations", agent="other-agent").json()["results"]) == 1
    assert len(alice.get("/v1/tools/invocations", status="denied").json()["results"]) == 1
    assert len(alice.get("/v1/tools/invocations", tool="secret.tool").json()["results"]) == 1
    seen, cursor = [], None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = alice.get("/v1/tools/invocations", **params).json()
        seen += [r["invocation_id"] for r in page["results"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen)) == 5
    assert seen == sorted(seen, reverse=True)


@pytest.mark.parametrize(
    "params",
    [{"status": "bogus"}, {"limit": "x"}, {"cursor": "garbage"}, {"dry": "run", "limit": "1.5"}],
)
def test_it_answers_400_for_bad_list_parameters(alice, params):
    response = alice.get("/v1/tools/invocations", **params)
    assert response.status_code == 400
    assert error_of(response)["code"] in ("invalid_request", "invalid_cursor")


@pytest.mark.parametrize("cursor", ["", " x", "a b", "x" * 201, "../x", "\u00e9t\u00e9"])
def test_the_catalog_refuses_a_cursor_that_is_no_tool_name(alice, cursor):
    response = alice.get("/v1/tools", cursor=cursor)
    assert response.status_code == 400 and error_of(response)["code"] == "invalid_cursor"


def test_the_catalog_pages_with_its_cursor(alice):
    first = alice.get("/v1/tools", limit="1").json()
    second = alice.get("/v1/tools", limit="1", cursor=first["next_cursor"]).json()
    assert second["results"][0]["name"] > first["results"][0]["name"]


def test_it_needs_the_read_scope(make_api, tenant_a):
    api = make_api(tenant_a, scopes=["tools:invoke"])
    assert error_of(api.get("/v1/tools/invocations"))["code"] == "insufficient_scope"
    assert error_of(api.get("/v1/decisions/dec_x"))["code"] == "insufficient_scope"


def test_it_answers_404_for_unknown_ids(alice):
    for path in ("/v1/tools/invocations/tinv_nope", "/v1/decisions/dec_nope"):
        response = alice.get(path)
        assert response.status_code == 404
        assert error_of(response)["code"] == "not_found"


def test_it_shows_a_decision(alice):
    error = error_of(alice.invoke("secret.tool", {}))
    decision = alice.get(f"/v1/decisions/{error['decision_id']}").json()
    assert decision["decision_id"] == error["decision_id"]
    assert decision["result"] == "deny" and decision["allow"] is False
    assert decision["reasons"] == ["missing scope 'secret:read'"]
    assert decision["policy_version"].startswith("sha256:")
    assert decision["input_digest"].startswith("hmac-sha256:")


def test_an_input_digest_cannot_be_checked_against_guesses(alice):
    """The masked input and its digest are shown side by side: a plain hash of the raw
    input would let a reader try the masked digits until it matched."""
    import hashlib

    from eai.jsoncodec import canonical_json

    phone = {"q": "06 12 34 56 78"}
    response = alice.invoke("jira.search", phone)
    assert response.status_code == 200
    decision = alice.get(f"/v1/decisions/{response.json()['decision_id']}").json()
    shown = decision["input_digest"].split(":", 1)[1]
    assert len(shown) == 64
    assert shown != hashlib.sha256(canonical_json(phone)).hexdigest()
    # Still one digest per input: the same call gives the same digest.
    again = alice.invoke("jira.search", phone).json()["decision_id"]
    assert alice.get(f"/v1/decisions/{again}").json()["input_digest"] == decision["input_digest"]


def test_it_cancels_a_waiting_call_once(alice):
    parked = alice.invoke(
        "payments.transfer", {"iban": "FR7630006000011234567890189", "amount": "1"}
    ).json()
    path = f"/v1/tools/invocations/{parked['invocation_id']}/cancel"
    response = alice.post(path)
    assert response.status_code == 200
    assert response.json()["status"] == "cancelled"
    assert response.json()["error"]["code"] == "cancelled"
    with scope(alice.key.tenant):
        assert ApprovalRequest.objects.get(pk=parked["approval_id"]).status == "cancelled"
    # the sealed raw input (an IBAN in clear for this tool) is destroyed with the call
    with scope(alice.key.tenant):
        assert Invocation.objects.get(pk=parked["invocation_id"]).sealed_input is None
    again = alice.post(path)
    assert again.status_code == 409
    assert error_of(again)["code"] == "invalid_state"
    # audited and published once, the chain still valid
    entries = alice.get("/v1/audit/events", limit=500).json()["results"]
    cancels = [e for e in entries if e["action"] == "tool.cancel"]
    assert len(cancels) == 1 and cancels[0]["object_ref"] == parked["invocation_id"]
    assert cancels[0]["payload"]["previous_status"] == "waiting_approval"
    assert cancels[0]["actor"] == alice.key.public_id
    final = [
        e
        for e in entries
        if e["action"] == "tool.invoke" and e["payload"]["invocation_id"] == parked["invocation_id"]
    ]
    assert [e["payload"]["status"] for e in final] == ["cancelled"]
    feed = alice.get("/v1/events", limit=500).json()["results"]
    mine = [e for e in feed if e["invocation_id"] == parked["invocation_id"]]
    assert mine[-1]["type"] == "agent.error" and mine[-1]["payload"]["status"] == "cancelled"
    assert alice.get("/v1/audit/verify").json()["valid"] is True


def test_it_refuses_to_cancel_a_finished_call(alice):
    body = alice.invoke("jira.search", {"q": "x"}).json()
    response = alice.post(f"/v1/tools/invocations/{body['invocation_id']}/cancel")
    assert response.status_code == 409
    with scope(alice.key.tenant):
        assert Invocation.objects.get(pk=body["invocation_id"]).status == "succeeded"


@pytest.mark.django_db(transaction=True)
def test_it_long_polls_until_a_final_status(alice):
    parked = alice.invoke(
        "payments.transfer", {"iban": "FR7630006000011234567890189", "amount": "1"}
    ).json()

    def finish_later():
        time.sleep(0.4)
        with tenant_scope(alice.key.tenant):
            Invocation.objects.filter(pk=parked["invocation_id"]).update(status="cancelled")

    thread = threading.Thread(target=finish_later)
    thread.start()
    started = time.monotonic()
    got = alice.get(f"/v1/tools/invocations/{parked['invocation_id']}", wait=5).json()
    thread.join()
    assert got["status"] == "cancelled"
    assert 0.3 < time.monotonic() - started < 4
    assert (
        alice.get(f"/v1/tools/invocations/{parked['invocation_id']}", wait="soon").status_code
        == 400
    )


def test_long_polls_past_the_slots_answer_at_once(alice, settings):
    """Waiting clients never take every request thread: past EAI_LONG_POLL_SLOTS the
    answer comes at once, with the status as it stands."""
    from gateway import views

    parked = alice.invoke(
        "payments.transfer", {"iban": "FR7630006000011234567890189", "amount": "1"}
    ).json()
    settings.EAI_LONG_POLL_SLOTS = 1
    views._long_poll_slots.cache_clear()
    held = views._long_poll_slots()
    assert held.acquire(0)  # another tenant's client is waiting
    try:
        started = time.monotonic()
        got = alice.get(f"/v1/tools/invocations/{parked['invocation_id']}", wait=30)
        assert got.status_code == 200 and got.json()["status"] == "waiting_approval"
        assert time.monotonic() - started < 10  # not the 30 s asked for
    finally:
        held.release(0)
        views._long_poll_slots.cache_clear()


def test_a_process_serving_one_request_at_a_time_holds_no_long_poll(alice, monkeypatch):
    """Under gunicorn's `sync` worker (one thread) a waiting client would hold the whole
    process: there a long poll answers at once. With threads, all but one may wait."""
    from eai import workers
    from gateway import views

    parked = alice.invoke(
        "payments.transfer", {"iban": "FR7630006000011234567890189", "amount": "1"}
    ).json()
    for threads, total in ((1, 0), (2, 1), (16, 4)):
        monkeypatch.setattr(workers, "REQUEST_THREADS", threads)
        views._long_poll_slots.cache_clear()
        assert views._long_poll_slots().total == total
    monkeypatch.setattr(workers, "REQUEST_THREADS", 1)
    views._long_poll_slots.cache_clear()
    try:
        assert not views._long_poll_slots().acquire(0)
        got = alice.get(f"/v1/tools/invocations/{parked['invocation_id']}", wait=30)
        assert got.status_code == 200 and got.json()["status"] == "waiting_approval"
    finally:
        views._long_poll_slots.cache_clear()


def test_one_tenant_holds_at_most_half_the_long_poll_slots():
    from gateway.views import LongPollSlots

    slots = LongPollSlots(4)
    assert slots.acquire(1) and slots.acquire(1)
    assert not slots.acquire(1)  # tenant 1 has its half
    assert slots.acquire(2) and slots.acquire(2)
    assert not slots.acquire(3)  # all four are held
    slots.release(1)
    assert slots.acquire(3) and not slots.acquire(1)
    for tenant in (1, 2, 2, 3):
        slots.release(tenant)
    assert slots.held == {}


@pytest.mark.django_db(transaction=True)
def test_it_runs_prefer_async_calls_in_the_background(alice):
    response = alice.invoke("jira.search", {"q": "INC-9"}, headers={"Prefer": "respond-async"})
    assert response.status_code == 202
    body = response.json()
    assert body["status"] == "queued"
    got = alice.get(f"/v1/tools/invocations/{body['invocation_id']}", wait=10).json()
    assert got["status"] == "succeeded"
    assert got["output"]["issues"][0]["key"] == "INC-9"
