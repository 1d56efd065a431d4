"""Prometheus metrics of the gateway, safe under several gunicorn workers.

Counters and histograms are prometheus_client's; with PROMETHEUS_MULTIPROC_DIR set
(production under gunicorn) each worker writes its samples there and `/metrics`
merges them. Approvals waiting and breaker states are read at scrape time.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily

from gateway import breakers
from gateway.models import ApprovalRequest, Tool
from tenants.models import Tenant
from tenants.scope import tenant_scope

INVOCATIONS = Counter(
    "eai_tool_invocations_total", "Tool invocations by final status.", ["tool", "status"]
)
# The calls that came through MCP's tools/call, also counted above: the doors told apart.
MCP_CALLS = Counter(
    "eai_mcp_tool_calls_total", "Tool calls made through MCP, by status.", ["tool", "status"]
)
LATENCY = Histogram(
    "eai_tool_latency_seconds",
    "Time from request to final status, per tool.",
    ["tool"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
BREAKER_VALUES = {breakers.CLOSED: 0, breakers.HALF_OPEN: 1, breakers.OPEN: 2}


def observe(tool: str, status: str, seconds: float) -> None:
    INVOCATIONS.labels(tool, status).inc()
    LATENCY.labels(tool).observe(seconds)


def observe_mcp_call(tool: str, status: str) -> None:
    MCP_CALLS.labels(tool, status).inc()


def observe_settled(invocation: Any) -> None:
    """Count a call that reached its final status outside the pipeline (a reviewer's
    denial, an expiry, a cancel), once the transaction that moved it commits."""
    tool, status = invocation.tool, invocation.status
    end = invocation.finished_at or timezone.now()
    seconds = max((end - invocation.created_at).total_seconds(), 0.0)
    transaction.on_commit(lambda: observe(tool, status, seconds))


def token() -> str:
    """EAI_METRICS_TOKEN, else one derived from the secret key (printed by `demo`)."""
    if settings.EAI_METRICS_TOKEN:
        return settings.EAI_METRICS_TOKEN
    return hmac.new(settings.SECRET_KEY.encode(), b"eai-metrics", hashlib.sha256).hexdigest()[:32]


class _StateCollector:
    """Approvals waiting and breaker states, per tenant, read from the source of truth."""

    def collect(self) -> Iterator[Any]:
        waiting = GaugeMetricFamily(
            "eai_approvals_waiting", "Approval requests waiting for reviewers.", labels=["tenant"]
        )
        circuit = GaugeMetricFamily(
            "eai_tool_circuit_state",
            "Circuit breaker state per tool (0 closed, 1 half-open, 2 open).",
            labels=["tenant", "tool"],
        )
        for tenant in Tenant.objects.filter(is_active=True).only("id", "slug"):
            with tenant_scope(tenant, readonly=True):
                pending = (
                    ApprovalRequest.objects.for_tenant(tenant)
                    .filter(status=ApprovalRequest.PENDING)
                    .count()
                )
                tools = list(Tool.objects.for_tenant(tenant).values_list("name", flat=True))
            waiting.add_metric([tenant.slug], pending)
            for name in tools:
                state = breakers.state(str(tenant.pk), name)
                circuit.add_metric([tenant.slug, name], BREAKER_VALUES[state])
        yield waiting
        yield circuit


def render() -> tuple[bytes, str]:
    """The exposition text and its content type."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    else:
        registry = CollectorRegistry()
        for collector in (INVOCATIONS, MCP_CALLS, LATENCY):
            registry.register(collector)
    registry.register(_StateCollector())
    return generate_latest(registry), CONTENT_TYPE_LATEST
