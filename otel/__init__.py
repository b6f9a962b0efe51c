"""OpenTelemetry for jetcrawl: one tracing setup per service, W3C context through NATS headers.

setup.py        setup_tracing(): resource, OTLP/HTTP exporter from the OTEL_* variables, batching;
                off (a true no-op) unless an OTLP endpoint is configured
propagation.py  inject() / extract(): traceparent and tracestate in NATS message headers
spans.py        span helpers by the messaging (NATS) and HTTP client semantic conventions
"""

from jetcrawl.otel.propagation import current_trace_id, extract, inject, remote_span_context
from jetcrawl.otel.setup import (
    DISPATCHER_SERVICE,
    NO_TRACING,
    RENDERER_SERVICE,
    WORKER_SERVICE,
    Tracing,
    setup_tracing,
    tracing_enabled,
)

__all__ = [
    "DISPATCHER_SERVICE",
    "NO_TRACING",
    "RENDERER_SERVICE",
    "WORKER_SERVICE",
    "Tracing",
    "current_trace_id",
    "extract",
    "inject",
    "remote_span_context",
    "setup_tracing",
    "tracing_enabled",
]
