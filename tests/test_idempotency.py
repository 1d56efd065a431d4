"""Idempotency-Key: replay byte for byte, conflict, and one execution under concurrency."""

import json
import threading
import urllib.request

import pytest

from gateway.manifests import apply_manifests
from gateway.models import Invocation
from tenants.scope import tenant_scope

from .conftest import error_of, scope, tool_manifest


def test_it_replays_the_stored_answer_byte_for_byte(alice):
    first = alice.invoke("jira.search", {"q": "x"}, headers={"Idempotency-Key": "k-1"})
    second = alice.invoke("jira.search", {"q": "x"}, headers={"Idempotency-Key": "k-1"})
    assert first.status_code == second.status_code == 200
    assert first.content == second.content
    assert second["Idempotent-Replayed"] == "true"
    with scope(alice.key.tenant):
        assert Invocation.objects.count() == 1


def test_it_accepts_the_key_in_the_body(alice):
    first = alice.invoke("jira.search", {"q": "x"}, idempotency_key="k-body")
    second = alice.invoke("jira.search", {"q": "x"}, idempotency_key="k-body")
    assert first.content == second.content
    with scope(alice.key.tenant):
        assert Invocation.objects.count() == 1


def test_a_header_and_a_body_key_that_differ_are_refused(alice):
    response = alice.invoke(
        "jira.search", {"q": "x"}, headers={"Idempotency-Key": "k-1"}, idempotency_key="k-2"
    )
    assert response.status_code == 400 and error_of(response)["code"] == "invalid_request"
    assert "differ" in error_of(response)["message"]
    with scope(alice.key.tenant):
        assert Invocation.objects.count() == 0
    same = alice.invoke(
        "jira.search", {"q": "x"}, headers={"Idempotency-Key": "k-1"}, idempotency_key="k-1"
    )
    with scope(alice.key.tenant):
        assert same.status_code == 200 and Invocation.objects.count() == 1


def test_it_replays_errors_too(alice):
    first = alice.invoke("secret.tool", {}, headers={"Idempotency-Key": "k-denied"})
    second = alice.invoke("secret.tool", {}, headers={"Idempotency-Key": "k-denied"})
    assert first.status_code == second.status_code == 403
    assert first.content == second.content


def test_an_unexpected_failure_does_not_leave_the_key_in_progress(alice, monkeypatch):
    """A bug in an idempotent call, before anything of it is written: the key is
    released, and a retry with it runs (never 409 in progress for 24 h)."""
    from gateway import pipeline

    calls = []
    real = pipeline._execute

    def broken_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug")
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "_execute", broken_once)
    first = alice.invoke("jira.search", {"q": "x"}, headers={"Idempotency-Key": "k-bug"})
    assert first.status_code == 500
    assert error_of(first)["code"] == "internal_error"
    assert "invocation_id" not in first.json()["error"]
    second = alice.invoke("jira.search", {"q": "x"}, headers={"Idempotency-Key": "k-bug"})
    assert second.status_code == 200 and "Idempotent-Replayed" not in second
    assert len(calls) == 2


def test_a_failure_after_a_running_claim_keeps_its_500_and_never_runs_twice(alice, monkeypatch):
    """A non-idempotent call writes its `running` claim before the upstream call: a bug
    after that point may follow a side effect, so the key answers that 500 (naming
    the invocation) from then on."""
    from gateway import pipeline

    apply_manifests(
        tenant=alice.key.tenant,
        documents=[tool_manifest("once.only", {"type": "builtin", "callable": "echo"})],
    )
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("a bug")

    monkeypatch.setattr(pipeline, "_execute", broken)
    first = alice.invoke("once.only", {"q": "x"}, headers={"Idempotency-Key": "k-once"})
    assert first.status_code == 500
    invocation_id = error_of(first)["invocation_id"]
    with scope(alice.key.tenant):
        assert Invocation.objects.get(pk=invocation_id).status == "running"
    second = alice.invoke("once.only", {"q": "x"}, headers={"Idempotency-Key": "k-once"})
    assert (second.status_code, second.content) == (500, first.content)
    assert second["Idempotent-Replayed"] == "true"
    assert len(calls) == 1


@pytest.mark.parametrize(
    ("tool", "tool_input"), [("jira.search", {"q": "other"}), ("secret.tool", {"q": "x"})]
)
def test_it_answers_conflict_for_another_body_or_tool(alice, tool, tool_input):
    alice.invoke("jira.search", {"q": "x"}, headers={"Idempotency-Key": "k-2"})
    response = alice.invoke(tool, tool_input, headers={"Idempotency-Key": "k-2"})
    assert response.status_code == 409
    assert error_of(response)["code"] == "idempotency_conflict"
    with scope(alice.key.tenant):
        assert Invocation.objects.count() == 1


def test_it_scopes_keys_to_the_api_key(alice, bob, make_api):
    a = alice.invoke("jira.search", {"q": "x"}, headers={"Idempotency-Key": "shared"})
    b = bob.invoke("jira.search", {"q": "x"}, headers={"Idempotency-Key": "shared"})
    other_key = make_api(alice.key.tenant).invoke(
        "jira.search", {"q": "x"}, headers={"Idempotency-Key": "shared"}
    )
    ids = {r.json()["invocation_id"] for r in (a, b, other_key)}
    assert len(ids) == 3


def test_it_refuses_a_malformed_key(alice):
    response = alice.invoke("jira.search", {"q": "x"}, headers={"Idempotency-Key": "x" * 300})
    assert response.status_code == 400
    assert error_of(response)["code"] == "invalid_request"


@pytest.mark.django_db(transaction=True)
def test_twenty_concurrent_identical_requests_execute_once(alice, upstream, live_server):
    apply_manifests(
        tenant=alice.key.tenant,
        documents=[
            tool_manifest("slow.write", {"type": "http", "url": upstream.url("/slow?s=0.5")})
        ],
    )
    results = []

    def call():
        request = urllib.request.Request(
            f"{live_server.url}/v1/tools/slow.write/invoke",
            data=json.dumps({"input": {"n": 1}}).encode(),
            headers={
                "Authorization": f"Bearer {alice.raw_key}",
                "Content-Type": "application/json",
                "Idempotency-Key": "race-1",
            },
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                results.append((response.status, json.loads(response.read())))
        except urllib.error.HTTPError as exc:
            results.append((exc.code, json.loads(exc.read())))

    threads = [threading.Thread(target=call) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len([c for c in upstream.calls if c["path"] == "/slow"]) == 1
    with tenant_scope(alice.key.tenant, readonly=True):
        assert Invocation.objects.count() == 1
    statuses = sorted(status for status, _ in results)
    assert statuses.count(200) >= 1
    for status, body in results:
        if status == 409:
            assert body["error"]["code"] == "idempotency_in_progress"
        else:
            assert status == 200 and body["status"] == "succeeded"


def test_a_key_is_kept_24_hours(alice):
    from datetime import timedelta

    from django.utils import timezone

    from gateway.models import IdempotencyRecord
    from gateway.pipeline import purge_idempotency_records

    first = alice.invoke("jira.search", {"q": "x"}, headers={"Idempotency-Key": "k-old"}).json()
    with scope(alice.key.tenant):
        IdempotencyRecord.objects.update(created_at=timezone.now() - timedelta(hours=25))
    again = alice.invoke("jira.search", {"q": "other"}, headers={"Idempotency-Key": "k-old"})
    assert again.status_code == 200  # the old key binds nothing any more
    assert again.json()["invocation_id"] != first["invocation_id"]
    with scope(alice.key.tenant):
        IdempotencyRecord.objects.update(created_at=timezone.now() - timedelta(hours=25))
    assert purge_idempotency_records(alice.key.tenant) == 1
    with scope(alice.key.tenant):
        assert not IdempotencyRecord.objects.exists()


def test_an_audit_failure_after_the_running_claim_keeps_the_key(alice, upstream, monkeypatch):
    """A non-idempotent call whose result cannot be written answers 503
    audit_unavailable; its running claim was written and the upstream called, so the
    key keeps that answer: a retry with it must not call the upstream again."""
    from django.db import DatabaseError

    from gateway import audit

    apply_manifests(
        tenant=alice.key.tenant,
        documents=[tool_manifest("post.once", {"type": "http", "url": upstream.url("/echo")})],
    )
    real = audit.settle_with_rows
    failures = []

    def settle_fails_once(*args, **kwargs):
        if not failures:
            failures.append(1)
            raise DatabaseError("the disk is full")
        return real(*args, **kwargs)

    monkeypatch.setattr(audit, "settle_with_rows", settle_fails_once)
    headers = {"Idempotency-Key": "k-settle"}
    first = alice.invoke("post.once", {"n": 1}, headers=headers)
    assert first.status_code == 503 and error_of(first)["code"] == "audit_unavailable"
    posts = [c for c in upstream.calls if c["path"] == "/echo"]
    second = alice.invoke("post.once", {"n": 1}, headers=headers)
    assert (second.status_code, second.content) == (503, first.content)
    assert [c for c in upstream.calls if c["path"] == "/echo"] == posts  # not called again


def test_a_key_with_a_trailing_newline_is_refused(alice):
    response = alice.invoke("jira.search", {"q": "x"}, idempotency_key="k\n")
    assert response.status_code == 400 and error_of(response)["code"] == "invalid_request"


def _dead_process(tenant, key, *, settle=None, age_s=0):
    """The claim of a request whose process died before answering: its stored answer is
    erased, as if never written; `settle` does what the recovery sweep would have done."""
    from datetime import timedelta

    from django.utils import timezone

    from gateway.models import IdempotencyRecord

    with tenant_scope(tenant):
        rows = IdempotencyRecord.objects.filter(tenant=tenant, key=key)
        record = rows.get()
        rows.update(
            status_code=None,
            response_body=None,
            created_at=timezone.now() - timedelta(seconds=age_s),
        )
        if settle is not None:
            Invocation.objects.filter(pk=record.invocation_id).update(**settle)
    return record


def test_a_call_its_process_died_in_answers_the_settled_outcome(alice, upstream):
    """A non-idempotent call names its invocation in the claim before it runs: after the
    process died and the sweep failed the call (`worker_lost`), a retry under the key
    answers that outcome instead of "in progress" for 24 h, and runs nothing."""
    apply_manifests(
        tenant=alice.key.tenant,
        documents=[
            tool_manifest(
                "bank.pay", {"type": "http", "url": upstream.url("/echo")}, idempotent=False
            )
        ],
    )
    headers = {"Idempotency-Key": "k-dead"}
    assert alice.invoke("bank.pay", {"n": 1}, headers=headers).status_code == 200
    calls = len(upstream.calls)
    error = {"code": "worker_lost", "message": "The process running this call stopped."}
    record = _dead_process(alice.key.tenant, "k-dead", settle={"status": "running", "output": None})
    assert record.invocation_id.startswith("tinv_")
    # Still running (the sweep has not settled it yet): in progress.
    busy = alice.invoke("bank.pay", {"n": 1}, headers=headers)
    assert busy.status_code == 409 and error_of(busy)["code"] == "idempotency_in_progress"
    with tenant_scope(alice.key.tenant):
        Invocation.objects.filter(pk=record.invocation_id).update(status="failed", error=error)
    replay = alice.invoke("bank.pay", {"n": 1}, headers=headers)
    assert replay.status_code == 502, replay.content
    settled = error_of(replay)
    assert settled["code"] == "worker_lost" and settled["invocation_id"] == record.invocation_id
    again = alice.invoke("bank.pay", {"n": 1}, headers=headers)
    assert again.content == replay.content and again["Idempotent-Replayed"] == "true"
    assert len(upstream.calls) == calls  # nothing ran again


def test_a_claim_left_by_a_process_that_died_before_any_write_is_dropped(alice):
    """The process named its invocation in the claim, then died before writing it: no
    row, so nothing ran. Past the longest call and the grace, a retry runs the call."""
    from gateway.models import IdempotencyRecord

    headers = {"Idempotency-Key": "k-gone"}
    assert alice.invoke("jira.search", {"q": "x"}, headers=headers).status_code == 200
    for age in (60, 3600):
        _dead_process(alice.key.tenant, "k-gone", age_s=age)
        with tenant_scope(alice.key.tenant):
            IdempotencyRecord.objects.filter(key="k-gone").update(invocation_id="tinv_never")
        if age == 60:  # it may still be in flight
            assert alice.invoke("jira.search", {"q": "x"}, headers=headers).status_code == 409
    retried = alice.invoke("jira.search", {"q": "x"}, headers=headers)
    assert retried.status_code == 200, retried.content
    assert "Idempotent-Replayed" not in retried
    assert alice.invoke("jira.search", {"q": "x"}, headers=headers).content == retried.content


def test_a_queued_call_whose_answer_was_lost_is_answered_not_made_again(alice):
    """An async call was queued (and will run), then its process died before storing
    the 202: a retry after the horizon answers the call as it stands; it makes no
    second call."""
    headers = {"Idempotency-Key": "k-queued", "Prefer": "respond-async"}
    first = alice.invoke("jira.search", {"q": "INC-3"}, headers=headers)
    assert first.status_code == 202
    record = _dead_process(alice.key.tenant, "k-queued", age_s=3600)
    assert record.invocation_id == first.json()["invocation_id"]
    retried = alice.invoke("jira.search", {"q": "INC-3"}, headers=headers)
    assert retried.status_code in (200, 202)
    assert retried.json()["invocation_id"] == record.invocation_id
    with tenant_scope(alice.key.tenant, readonly=True):
        assert Invocation.objects.filter(tool="jira.search").count() == 1
