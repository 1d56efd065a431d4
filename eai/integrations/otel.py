"""OpenTelemetry: the tracer, and OTLP export when OTEL_EXPORTER_OTLP_ENDPOINT is set.

Without an endpoint the API's no-op tracer is used, so spans cost next to nothing.
Inbound `traceparent` headers are continued and outbound calls carry the current one
(W3C trace context, the SDK's default propagator).
"""

from __future__ import annotations

import os
from functools import cache
from typing import Any

from opentelemetry import propagate, trace

TRACER_NAME = "eai.gateway"


@cache
def configure() -> None:
    """Install an SDK tracer provider exporting over OTLP, once, if configured."""
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
        OTLPSpanExporter,  # imported only when exporting: it pulls in protobuf
    )
    from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
    from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415

    provider = TracerProvider(
        resource=Resource.create(
            {"service.name": os.environ.get("OTEL_SERVICE_NAME", "eai-gateway")}
        )
    )
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)


def tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER_NAME)


def extract(meta: dict[str, Any] | None) -> Any:
    """The trace context of an inbound request (Django META), or None."""
    if not meta or "HTTP_TRACEPARENT" not in meta:
        return None
    carrier = {"traceparent": meta["HTTP_TRACEPARENT"]}
    if "HTTP_TRACESTATE" in meta:
        carrier["tracestate"] = meta["HTTP_TRACESTATE"]
    return propagate.extract(carrier)


def inject(headers: dict[str, str]) -> dict[str, str]:
    """`headers` plus the current span's traceparent, for an outbound call."""
    propagate.inject(headers)
    return headers
