"""Failure modes of the seed: rate limits, circuit breakers, retries (idempotent only)."""

import json
import time

import pytest
from django.test import override_settings

from eai.integrations import redis as shared
from gateway import breakers, ratelimits
from gateway.manifests import apply_manifests
from gateway.models import Invocation
from tenants.scope import tenant_scope

from .conftest import error_of, scope, tool_manifest


def add_tool(api, name, endpoint, **spec):
    apply_manifests(tenant=api.key.tenant, documents=[tool_manifest(name, endpoint, **spec)])


ECHO = {"type": "builtin", "callable": "echo"}
REDIS_URL = "redis://127.0.0.1:6379/15"


@pytest.fixture(autouse=True, params=["memory", "redis"])
def shared_state(request):
    """Every test here runs twice: state in this process, and state in a real Redis
    (what several gunicorn workers share)."""
    url = REDIS_URL if request.param == "redis" else ""
    with override_settings(EAI_REDIS_URL=url):
        shared.client.cache_clear()
        ratelimits.reset_memory()
        breakers.reset_memory()
        if url:
            conn = shared.client()
            try:
                conn.flushdb()
            except Exception:  # noqa: BLE001
                pytest.skip("no Redis on 127.0.0.1:6379")
        yield request.param
    shared.client.cache_clear()
    ratelimits.reset_memory()


@pytest.mark.parametrize("scope", ["tenant", "key", "run"])
def test_it_rate_limits_per_scope(alice, make_api, scope):
    add_tool(alice, "limited", ECHO, rate_limit={"requests": 2, "per": "1m", "scope": scope})
    first = alice.invoke("limited", {}, run_id="run_a")
    assert first.status_code == 200
    assert first["RateLimit-Limit"] == "2" and first["RateLimit-Remaining"] == "1"
    assert alice.invoke("limited", {}, run_id="run_a").status_code == 200
    response = alice.invoke("limited", {}, run_id="run_a", headers={"Accept-Language": "fr"})
    assert response.status_code == 429
    error = error_of(response)
    assert error["code"] == "rate_limited"
    assert 1 <= int(response["Retry-After"]) <= 60
    assert response["RateLimit-Remaining"] == "0"
    assert error["message"] == error["message_i18n"]["fr"]
    other_key = make_api(alice.key.tenant)
    other_run = alice.invoke("limited", {}, run_id="run_b").status_code
    expected_other = {"tenant": (429, 429), "key": (200, 429), "run": (429, 200)}[scope]
    assert (
        other_key.invoke("limited", {}, run_id="run_a").status_code,
        other_run,
    ) == expected_other


def test_one_tenants_burst_does_not_throttle_another(alice, bob):
    for api in (alice, bob):
        add_tool(api, "limited", ECHO, rate_limit={"requests": 1, "per": "1m"})
    assert alice.invoke("limited", {}).status_code == 200
    assert alice.invoke("limited", {}).status_code == 429
    assert bob.invoke("limited", {}).status_code == 200


def test_a_rate_limited_call_stores_its_decision_and_no_invocation(alice, bob):
    """The policy decided before the limit refused: like every decision, it is stored
    and chained, and the 429 names it; nothing ran, so there is no invocation."""
    from gateway.models import AuditEvent, Decision

    add_tool(alice, "limited", ECHO, rate_limit={"requests": 1, "per": "1h"})
    alice.invoke("limited", {})
    with scope(alice.key.tenant):
        before = Invocation.objects.count()
    response = alice.invoke("limited", {"q": "again"})
    assert response.status_code == 429
    with scope(alice.key.tenant):
        assert Invocation.objects.count() == before
    decision_id = error_of(response)["decision_id"]
    with scope(alice.key.tenant):
        decision = Decision.objects.get(pk=decision_id)
    assert decision.allow is True and decision.tenant_id == alice.key.tenant_id
    shown = alice.get(f"/v1/decisions/{decision_id}")
    assert shown.status_code == 200 and shown.json()["decision_id"] == decision_id
    assert bob.get(f"/v1/decisions/{decision_id}").status_code == 404
    with tenant_scope(alice.key.tenant, readonly=True):
        refusal, decided = AuditEvent.objects.filter(tenant=alice.key.tenant).order_by("-seq")[:2]
    assert (decided.action, decided.object_ref) == ("policy.decision", decision_id)
    assert (refusal.action, refusal.object_ref) == ("tool.rate_limited", decision_id)
    payload = json.loads(refusal.canonical)["payload"]
    assert payload["decision_id"] == decision_id and payload["tool"] == "limited"
    assert payload["rate_limit"] == {"requests": 1, "per": "1h", "scope": "tenant"}
    assert payload["retry_after"] == int(response["Retry-After"])
    verified = alice.get("/v1/audit/verify").json()
    assert verified["valid"] is True and verified["length"] == refusal.seq


def test_the_breaker_opens_fails_fast_then_probes(alice, upstream):
    add_tool(
        alice,
        "flaky",
        {"type": "http", "url": upstream.url("/status/503")},
        circuit_breaker={"failure_threshold": 2, "reset_after": "1s"},
    )
    for _ in range(2):
        assert error_of(alice.invoke("flaky", {}))["code"] == "tool_error"
    calls = len(upstream.calls)
    response = alice.invoke("flaky", {})
    assert response.status_code == 503
    error = error_of(response)
    assert error["code"] == "tool_unavailable"
    with scope(alice.key.tenant):
        assert Invocation.objects.get(pk=error["invocation_id"]).status == "unavailable"
    assert len(upstream.calls) == calls  # no upstream call while open
    catalog = alice.get("/v1/tools/flaky").json()
    assert catalog["availability"]["circuit"] == "open"
    assert catalog["availability"]["status"] == "unavailable"
    time.sleep(1.1)
    assert alice.get("/v1/tools/flaky").json()["availability"]["circuit"] == "half_open"
    # The half-open probe reaches the upstream, fails, and re-opens the breaker.
    assert error_of(alice.invoke("flaky", {}))["code"] == "tool_error"
    assert len(upstream.calls) == calls + 1
    assert error_of(alice.invoke("flaky", {}))["code"] == "tool_unavailable"


def test_a_successful_probe_closes_the_breaker(alice, upstream):
    add_tool(
        alice,
        "healing",
        {"type": "http", "url": upstream.url("/echo")},
        circuit_breaker={"failure_threshold": 1, "reset_after": "1s"},
    )
    tenant_id = str(alice.key.tenant_id)
    ticket = breakers.acquire(tenant_id, "healing", {"failure_threshold": 1})
    breakers.release(
        tenant_id, "healing", {"failure_threshold": 1, "reset_after": "1s"}, ticket, ok=False
    )
    assert breakers.state(tenant_id, "healing") == "open"
    time.sleep(1.1)
    assert alice.invoke("healing", {"x": 1}).status_code == 200
    assert breakers.state(tenant_id, "healing") == "closed"


def test_idempotent_tools_retry_per_spec(alice, upstream):
    add_tool(
        alice,
        "retrying",
        {"type": "http", "url": upstream.url("/status/502"), "timeout_ms": 5000},
        idempotent=True,
        retry={"max_attempts": 3, "backoff_ms": 10},
    )
    assert error_of(alice.invoke("retrying", {}))["code"] == "tool_error"
    assert len([c for c in upstream.calls if c["path"] == "/status/502"]) == 3


def test_non_idempotent_tools_are_never_retried(alice, upstream):
    add_tool(
        alice,
        "once",
        {"type": "http", "url": upstream.url("/status/502")},
        idempotent=False,
        retry={"max_attempts": 3, "backoff_ms": 10},
    )
    assert error_of(alice.invoke("once", {}))["code"] == "tool_error"
    assert len([c for c in upstream.calls if c["path"] == "/status/502"]) == 1


def test_a_timeout_is_never_retried(alice, upstream):
    add_tool(
        alice,
        "slowretry",
        {"type": "http", "url": upstream.url("/slow?s=1"), "timeout_ms": 300},
        idempotent=True,
        retry={"max_attempts": 3, "backoff_ms": 10},
    )
    started = time.monotonic()
    assert error_of(alice.invoke("slowretry", {}))["code"] == "tool_timeout"
    assert time.monotonic() - started < 1.0
    assert len([c for c in upstream.calls if c["path"] == "/slow"]) == 1


def test_a_limit_whose_store_is_down_refuses_as_unavailable(alice, shared_state):
    """Redis unreachable: the limit is not waived, and the answer is a clear 503 with its
    decision stored and chained, in both languages; not a 500."""
    from gateway.models import AuditEvent

    if shared_state != "redis":
        pytest.skip("about the shared store")
    add_tool(alice, "limited", ECHO, rate_limit={"requests": 5, "per": "1m"})
    keyed = {"Accept-Language": "fr", "Idempotency-Key": "k-store-down"}
    with override_settings(EAI_REDIS_URL="redis://127.0.0.1:1/0"):
        ratelimits.reset_memory()
        try:
            response = alice.invoke("limited", {}, headers=keyed)
        finally:
            ratelimits.reset_memory()
    assert response.status_code == 503, response.content
    error = error_of(response)
    assert error["code"] == "tool_unavailable" and "decision_id" in error
    assert "shared store is unreachable" in error["message_i18n"]["en"]
    assert "stockage partagé est injoignable" in error["message"]
    with tenant_scope(alice.key.tenant, readonly=True):
        refusal = AuditEvent.objects.filter(tenant=alice.key.tenant).order_by("-seq").first()
    assert refusal.action == "tool.rate_limit_unavailable"
    # The store is back: the call runs, under the same key too (the 503 was not kept).
    assert alice.invoke("limited", {}, headers=keyed).status_code == 200


def test_the_first_burst_after_start_is_counted_exactly(shared_state):
    """Thirty-two threads hitting a fresh process's limiter at once: exactly the limit
    gets through (the limiter was made once per thread that raced to make it)."""
    import threading

    if shared_state != "memory":
        pytest.skip("about the in-memory store (every limiter shares the one Redis)")
    ratelimits.reset_memory()
    rule = {"requests": 5, "per": "1m", "scope": "tenant"}
    start = threading.Barrier(32)
    verdicts = []

    def hit():
        start.wait()
        verdicts.append(
            ratelimits.check(rule, tenant_id="t-burst", tool="x", key_id="k", run_id="")
        )

    threads = [threading.Thread(target=hit) for _ in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(v.allowed for v in verdicts) == 5
