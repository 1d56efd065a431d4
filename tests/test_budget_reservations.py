"""A tenant's monthly budget is reserved before a call runs and settled after it, so
concurrent calls never spend past it (SPEC §14). Run on SQLite by default and on
PostgreSQL with EAI_DATABASE_URL set: both have their own reservation and release."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from gateway import finops, pipeline
from gateway.keys import issue_api_key
from gateway.manifests import apply_manifests
from gateway.models import BudgetHold, Invocation, MonthlySpend, UsageEvent, new_id
from tenants.scope import tenant_scope

from .conftest import ALL_SCOPES, Api, error_of, seed_tenant, tool_manifest

pytestmark = pytest.mark.django_db(transaction=True)


def _paid_tools(upstream) -> list[dict]:
    """1.00 EUR tools: one that takes 0.3 s (calls sent together are all in flight at
    once), one that fails upstream, one whose credential is missing (not charged)."""
    cost = {"amount": "1.00", "currency": "EUR"}
    slow = {"type": "http", "url": upstream.url("/slow"), "method": "GET", "timeout_ms": 20000}
    return [
        tool_manifest("paid.slow", slow, cost=cost, idempotent=True),
        tool_manifest("paid.write", slow, cost=cost, idempotent=False),
        tool_manifest(
            "paid.broken", {"type": "http", "url": upstream.url("/status/500")}, cost=cost
        ),
        tool_manifest(
            "paid.nocred",
            {"type": "http", "url": upstream.url("/echo")},
            cost=cost,
            credential_ref="missing-credential",
        ),
    ]


@pytest.fixture
def tenants(upstream):
    """acme with 2.00 EUR left of a 3.00 EUR budget (1.00 reported), and globex with
    the same tools and no budget, which must be untouched by acme's."""
    acme, globex = seed_tenant("acme"), seed_tenant("globex")
    for tenant in (acme, globex):
        apply_manifests(tenant=tenant, documents=_paid_tools(upstream))
    acme.monthly_budget = Decimal("3.00")
    acme.save()
    finops.forget_budgets()
    finops.ingest(
        acme,
        [
            UsageEvent(
                id=new_id("use"),
                source="api",
                unit="llm_tokens",
                quantity=Decimal(1),
                amount=Decimal("1.00"),
                currency="EUR",
                occurred_at=timezone.now(),
            )
        ],
    )
    _, key_a = issue_api_key(tenant=acme, scopes=ALL_SCOPES, agent="a")
    _, key_b = issue_api_key(tenant=globex, scopes=ALL_SCOPES, agent="b")
    return acme, globex, key_a, key_b


def _post(base: str, key: str, tool: str, body: dict, headers: dict | None = None):
    request = urllib.request.Request(
        f"{base}/v1/tools/{tool}/invoke",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        | (headers or {}),
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _together(base: str, key: str, tool: str, count: int, headers: dict | None = None):
    """`count` calls sent at the same moment from as many threads."""
    barrier = threading.Barrier(count)
    results: list = [None] * count

    def one(index: int) -> None:
        barrier.wait()
        results[index] = _post(base, key, tool, {"input": {"s": "0.3"}}, headers)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return results


def _reserved(tenant) -> Decimal:
    with tenant_scope(tenant, readonly=True):
        rows = list(
            MonthlySpend.objects.for_tenant(tenant).values_list("month", "amount", "reserved")
        )
        held = list(
            BudgetHold.objects.for_tenant(tenant).values_list(
                "invocation_id", "month", "amount", "created_at"
            )
        )
    total = sum((r[2] for r in rows), Decimal(0))
    assert (total == 0) == (not held), (rows, held)
    return total


def _wait_settled(tenant, ids: list[str]) -> list[str]:
    deadline = time.monotonic() + 60
    while True:
        with tenant_scope(tenant, readonly=True):
            statuses = list(
                Invocation.objects.for_tenant(tenant)
                .filter(pk__in=ids)
                .values_list("status", flat=True)
            )
        if all(s not in Invocation.PENDING for s in statuses) or time.monotonic() > deadline:
            return statuses
        time.sleep(0.1)


def test_it_lets_exactly_the_calls_the_budget_covers_run_at_once(live_server, tenants):
    acme, globex, key_a, key_b = tenants
    results = _together(live_server.url, key_a, "paid.slow", 20)
    codes = sorted(status for status, _body in results)
    assert codes == [200] * 2 + [403] * 18, codes
    for status, body in results:
        if status == 403:
            assert body["error"]["code"] == "budget_exceeded"
            assert body["error"]["message"] == "The tenant's monthly budget of 3 EUR is spent."
    assert finops.spent_this_month(acme) == Decimal("3.00")
    assert _reserved(acme) == 0
    # globex has no budget: all of its calls run, and acme's refusals are not its own.
    others = _together(live_server.url, key_b, "paid.slow", 5)
    assert [status for status, _body in others] == [200] * 5
    assert finops.spent_this_month(globex) == Decimal("5.00")


def test_it_holds_non_idempotent_calls_to_the_budget_too(live_server, tenants):
    acme, _globex, key_a, _key_b = tenants
    results = _together(live_server.url, key_a, "paid.write", 20)
    assert sorted(status for status, _body in results) == [200] * 2 + [403] * 18
    assert finops.spent_this_month(acme) == Decimal("3.00")
    assert _reserved(acme) == 0


def test_it_reserves_async_calls_when_they_are_admitted(live_server, tenants):
    acme, _globex, key_a, _key_b = tenants
    results = _together(
        live_server.url, key_a, "paid.slow", 20, headers={"Prefer": "respond-async"}
    )
    codes = sorted(status for status, _body in results)
    assert codes == [202] * 2 + [403] * 18, codes
    admitted = [body["invocation_id"] for status, body in results if status == 202]
    assert _wait_settled(acme, admitted) == ["succeeded", "succeeded"]
    assert finops.spent_this_month(acme) == Decimal("3.00")
    assert _reserved(acme) == 0


def test_a_failed_call_gives_its_reservation_back(tenants):
    acme, _globex, key_a, _key_b = tenants

    api = Api(key_a)
    # Not charged (its credential cannot be leased): the whole 2.00 stays.
    response = api.invoke("paid.nocred", {})
    assert response.status_code == 503, response.content
    assert _reserved(acme) == 0
    assert finops.spent_this_month(acme) == Decimal("1.00")
    # Charged (the upstream was called and failed): its cost, never more.
    assert api.invoke("paid.broken", {}).status_code == 502
    assert _reserved(acme) == 0
    assert finops.spent_this_month(acme) == Decimal("2.00")
    assert api.invoke("paid.slow", {"s": "0"}).status_code == 200
    assert error_of(api.invoke("paid.slow", {"s": "0"}))["code"] == "budget_exceeded"


def test_a_call_that_raises_gives_its_reservation_back(tenants, monkeypatch):
    acme, _globex, key_a, _key_b = tenants

    def boom(*args, **kwargs):
        raise RuntimeError("the process hit a bug mid-call")

    monkeypatch.setattr(pipeline, "_execute", boom)
    api = Api(key_a)
    api.client.raise_request_exception = False
    assert api.invoke("paid.slow", {}).status_code == 500
    assert _reserved(acme) == 0


def test_the_recovery_sweep_releases_a_dead_calls_reservation(tenants, monkeypatch):
    """A process that dies mid-call releases nothing: a `running` call is failed
    `worker_lost` by the sweep (its hold goes with it), and a hold whose call never
    wrote a row (an idempotent call is written after it runs) goes past the horizon."""
    acme, _globex, key_a, _key_b = tenants

    def dies(*args, **kwargs):
        raise SystemExit("killed")

    monkeypatch.setattr(pipeline, "_execute", dies)
    monkeypatch.setattr(pipeline, "_release_quietly", lambda *a: None)  # dead: no cleanup
    api = Api(key_a)
    with pytest.raises(SystemExit):
        api.invoke("paid.write", {})  # non-idempotent: its `running` row is written first
    with pytest.raises(SystemExit):
        api.invoke("paid.slow", {})  # idempotent: no row, only the hold
    monkeypatch.undo()
    assert _reserved(acme) == Decimal("2.00")
    assert error_of(api.invoke("paid.slow", {"s": "0"}))["code"] == "budget_exceeded"
    with tenant_scope(acme):
        long_ago = timezone.now() - timedelta(hours=1)
        Invocation.objects.for_tenant(acme).filter(status="running").update(started_at=long_ago)
    # The running call is settled; the row-less hold is younger than the horizon.
    pipeline.recover_stuck(acme, grace_s=0)
    assert _reserved(acme) == Decimal("1.00")
    with tenant_scope(acme):
        BudgetHold.objects.for_tenant(acme).update(created_at=long_ago)
    pipeline.recover_stuck(acme, grace_s=0)
    assert _reserved(acme) == 0
    assert api.invoke("paid.slow", {"s": "0"}).status_code == 200


def test_a_call_parked_for_approval_reserves_when_it_runs(tenants):
    """Approval may take days: the call is only read against the budget when parked,
    and reserves when it runs; if the budget is spent by then, it is denied."""
    acme, _globex, key_a, _key_b = tenants
    apply_manifests(
        tenant=acme,
        documents=[
            tool_manifest(
                "paid.approved",
                {"type": "builtin", "callable": "echo"},
                cost={"amount": "1.00", "currency": "EUR"},
                requires_approval=True,
            )
        ],
    )

    api = Api(key_a)
    parked = api.invoke("paid.approved", {})
    assert parked.status_code == 202, parked.content
    assert _reserved(acme) == 0
    invocation_id = parked.json()["invocation_id"]
    assert api.invoke("paid.slow", {"s": "0"}).status_code == 200
    assert api.invoke("paid.slow", {"s": "0"}).status_code == 200
    with tenant_scope(acme):
        Invocation.objects.for_tenant(acme).filter(pk=invocation_id).update(status="queued")
    assert pipeline.execute_queued(invocation_id, acme) == "denied"
    assert finops.spent_this_month(acme) == Decimal("3.00")
    assert _reserved(acme) == 0


BROKER = "redis://127.0.0.1:6379/9"  # this file's own Redis database


def _forget_broker_connections(app) -> None:
    """Drop the Celery app's pooled broker connections (made for the broker URL it had
    when first used): the next send connects to the URL configured now."""
    if app._pool is not None:
        app._pool.force_close_all()
        app._pool = None
    app.amqp._producer_pool = None


def test_async_calls_run_by_celery_reserve_too(live_server, tenants, monkeypatch):
    """The same burst with a broker: admitted calls run in a Celery worker process,
    on the reservations the web process took."""
    import redis
    from django.test import override_settings

    from eai.celery import app as celery_app

    from . import test_celery_worker

    try:
        redis.Redis.from_url(BROKER, socket_connect_timeout=1).flushdb()
    except redis.RedisError:
        pytest.skip("no Redis on 127.0.0.1:6379")
    monkeypatch.setattr(test_celery_worker, "BROKER", BROKER)
    monkeypatch.setattr(celery_app.conf, "broker_url", BROKER)
    _forget_broker_connections(celery_app)  # the app keeps them for the broker it met
    acme, _globex, key_a, _key_b = tenants
    with override_settings(EAI_BROKER_URL=BROKER):
        worker = test_celery_worker.Worker()
        try:
            results = _together(
                live_server.url, key_a, "paid.slow", 20, headers={"Prefer": "respond-async"}
            )
            codes = sorted(status for status, _body in results)
            assert codes == [202] * 2 + [403] * 18, codes
            admitted = [body["invocation_id"] for status, body in results if status == 202]
            assert _wait_settled(acme, admitted) == ["succeeded", "succeeded"]
        finally:
            worker.stop()
            redis.Redis.from_url(BROKER).flushdb()
            monkeypatch.undo()
            _forget_broker_connections(celery_app)  # the next user of the app meets its own broker
    assert finops.spent_this_month(acme) == Decimal("3.00")
    assert _reserved(acme) == 0


def test_fractional_costs_add_up_exactly(live_server, tenants, upstream):
    """0.1 + 0.1 + 0.1 is 0.3 here, not 0.30000000000000004 (SQLite keeps decimals as
    floating point): with 0.3 left, exactly three calls of 0.1 run."""
    acme, _globex, key_a, _key_b = tenants
    slow = {"type": "http", "url": upstream.url("/slow"), "method": "GET", "timeout_ms": 20000}
    apply_manifests(
        tenant=acme,
        documents=[tool_manifest("dime", slow, cost={"amount": "0.1", "currency": "EUR"})],
    )
    acme.monthly_budget = Decimal("1.3")
    acme.save()
    results = _together(live_server.url, key_a, "dime", 8)
    assert sorted(status for status, _body in results) == [200] * 3 + [403] * 5
    assert finops.spent_this_month(acme) == Decimal("1.3")
    assert _reserved(acme) == 0
    assert error_of(Api(key_a).invoke("dime", {"s": "0"}))["code"] == "budget_exceeded"


def test_a_cancelled_queued_call_gives_its_reservation_back(tenants, monkeypatch):
    acme, globex, key_a, key_b = tenants
    monkeypatch.setattr(pipeline, "_run_here", lambda *args: None)  # stays queued
    api = Api(key_a)
    queued = api.invoke("paid.slow", {}, headers={"Prefer": "respond-async"})
    assert queued.status_code == 202
    assert _reserved(acme) == Decimal("1.00")
    invocation_id = queued.json()["invocation_id"]
    # Bob cannot cancel acme's call, nor free its reservation.
    assert Api(key_b).post(f"/v1/tools/invocations/{invocation_id}/cancel").status_code == 404
    assert _reserved(acme) == Decimal("1.00")
    assert api.post(f"/v1/tools/invocations/{invocation_id}/cancel").status_code == 200
    assert _reserved(acme) == 0
    assert finops.spent_this_month(acme) == Decimal("1.00")
