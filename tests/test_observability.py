"""Metrics, traces and health."""

import json

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway import metrics
from gateway.manifests import apply_manifests

from .conftest import Api, error_of, tool_manifest

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans():
    """The SDK's in-memory exporter behind the global tracer provider (set once)."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def scrape(db_token=None):
    token = db_token or metrics.token()
    return Api(None).get("/metrics", headers={"Authorization": f"Bearer {token}"})


def test_metrics_need_the_token(db):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "eai_x_y"}):
        response = Api(None).get("/metrics", headers=headers)
        assert response.status_code == 401
        assert error_of(response)["code"] == "unauthenticated"


def test_metrics_count_invocations_and_show_waiting_approvals(alice):
    alice.invoke("jira.search", {"q": "x"})
    alice.invoke("secret.tool", {})
    alice.invoke("payments.transfer", {"iban": "FR7630006000011234567890189", "amount": "1"})
    response = scrape()
    assert response.status_code == 200
    text = response.content.decode()
    assert 'eai_tool_invocations_total{status="succeeded",tool="jira.search"}' in text
    assert 'eai_tool_invocations_total{status="denied",tool="secret.tool"}' in text
    assert 'eai_tool_latency_seconds_bucket{le="0.005",tool="jira.search"}' in text
    assert 'eai_approvals_waiting{tenant="acme"} 1.0' in text
    assert 'eai_tool_circuit_state{tenant="acme",tool="jira.search"} 0.0' in text


def test_a_span_per_invocation_continues_and_propagates_the_trace(alice, upstream, spans):
    apply_manifests(
        tenant=alice.key.tenant,
        documents=[
            tool_manifest(
                "traced", {"type": "http", "url": upstream.url("/headers")}, idempotent=True
            )
        ],
    )
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    inbound = f"00-{trace_id}-00f067aa0ba902b7-01"
    body = alice.invoke("traced", {}, run_id="run_t", headers={"traceparent": inbound}).json()
    assert body["status"] == "succeeded"
    finished = [s for s in spans.get_finished_spans() if s.name == "execute_tool traced"]
    assert len(finished) == 1
    span = finished[0]
    assert format(span.context.trace_id, "032x") == trace_id
    assert span.parent is not None and format(span.parent.span_id, "016x") == "00f067aa0ba902b7"
    attributes = dict(span.attributes)
    assert attributes["gen_ai.operation.name"] == "execute_tool"
    assert attributes["gen_ai.tool.name"] == "traced"
    assert attributes["gen_ai.agent.id"] == "alice-agent"
    assert attributes["eai.tenant_id"] == alice.key.tenant.public_id
    assert attributes["eai.run_id"] == "run_t"
    assert attributes["eai.invocation_id"] == body["invocation_id"]
    outbound = upstream.calls[-1]["headers"]["traceparent"]
    assert outbound.split("-")[1] == trace_id
    assert outbound.split("-")[2] == format(span.context.span_id, "016x")


def test_health_and_readiness(db):
    assert Api(None).get("/healthz").json() == {"status": "ok"}
    ready = Api(None).get("/readyz").json()
    assert ready["status"] == "ok" and ready["checks"]["database"] == "ok"
    assert json.dumps(ready)  # plain JSON, no secrets


def test_readiness_reports_configured_systems(db):
    from django.test import override_settings

    with override_settings(EAI_OPA_URL="http://127.0.0.1:9", EAI_BAO_ADDR="http://127.0.0.1:9"):
        response = Api(None).get("/readyz")
    assert response.status_code == 503
    checks = response.json()["checks"]
    assert checks["database"] == "ok"
    assert checks["opa"] == checks["openbao"] == "unavailable"
    assert checks["redis"] in ("ok", "in_process") and checks["broker"] in ("ok", "in_process")


def test_readiness_names_the_fallbacks_that_serve_in_process(db):
    from django.test import override_settings

    with override_settings(
        EAI_REDIS_URL="",
        EAI_BROKER_URL="",
        EAI_OPA_URL="",
        EAI_BAO_ADDR="",
        EAI_SANDBOX_RUNTIME="off",
    ):
        response = Api(None).get("/readyz")
    assert response.status_code == 200
    assert response.json() == {
        "status": "ok",
        "checks": {
            "database": "ok",
            "redis": "in_process",
            "broker": "in_process",
            "opa": "in_process",
            "openbao": "in_process",
            "sandbox": "off: EAI_SANDBOX_RUNTIME=off",
        },
    }


def test_calls_settled_after_approval_are_counted(alice, django_capture_on_commit_callbacks):
    from gateway.metrics import INVOCATIONS

    def count(status):
        return INVOCATIONS.labels("payments.transfer", status)._value.get()

    before = count("cancelled")
    body = {"iban": "FR7630006000011234567890189", "amount": "1"}
    parked = alice.invoke("payments.transfer", body).json()
    with django_capture_on_commit_callbacks(execute=True):
        cancel = alice.post(f"/v1/tools/invocations/{parked['invocation_id']}/cancel")
    assert cancel.status_code == 200, cancel.content
    assert count("cancelled") == before + 1
