"""One tracing setup for every service: resource, OTLP/HTTP exporter, batch span processor.

Tracing is **on** when an OTLP endpoint is configured — ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set — unless ``OTEL_SDK_DISABLED=true`` or
``OTEL_TRACES_EXPORTER=none``. Everything else about the export is the SDK's reading of the
standard variables (``OTEL_EXPORTER_OTLP_*`` headers, timeout, compression; ``OTEL_BSP_*``;
``OTEL_TRACES_SAMPLER``; ``OTEL_RESOURCE_ATTRIBUTES`` adds to the resource).

**Off** is a true no-op: no SDK provider, no exporter thread, no span recorded, and no trace
header read or written (``Tracing.extract`` gives an empty context, so no span is ever valid and
nothing is injected). A trace that crosses a service with tracing off ends there.

The provider is this service's own, not the global one, so that several services (or tests) in
one process do not share it. ``Tracing.shutdown`` flushes and stops it; a service calls it last.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opentelemetry.context import Context
from opentelemetry.trace import NoOpTracer, Tracer

from jetcrawl.otel.propagation import extract

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

__all__ = [
    "DISPATCHER_SERVICE",
    "NO_TRACING",
    "RENDERER_SERVICE",
    "WORKER_SERVICE",
    "Tracing",
    "setup_tracing",
    "tracing_enabled",
]

log = logging.getLogger(__name__)

DISPATCHER_SERVICE = "jetcrawl-dispatcher"
WORKER_SERVICE = "jetcrawl-worker"
RENDERER_SERVICE = "jetcrawl-renderer"
INSTRUMENTATION_SCOPE = "jetcrawl"

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


@dataclass(frozen=True, slots=True)
class Tracing:
    """A service's tracer, and the provider behind it (None when tracing is off)."""

    tracer: Tracer
    provider: TracerProvider | None = None

    @property
    def enabled(self) -> bool:
        return self.provider is not None

    def extract(self, headers: Mapping[str, str] | None) -> Context:
        """The parent context a message carries (an empty one when tracing is off)."""
        return extract(headers) if self.provider is not None else Context()

    def shutdown(self) -> None:
        """Export what is buffered, then stop the exporter. Blocking: run it off the loop.

        Each export gives up after ``OTEL_EXPORTER_OTLP_TIMEOUT`` (10 s), and the SDK waits 30 s
        at most in all, so a collector that is down delays a service's exit, never blocks it.
        """
        if self.provider is not None:
            self.provider.shutdown()


NO_TRACING = Tracing(NoOpTracer())


def tracing_enabled(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return any(env.get(name, "").strip() for name in ENDPOINT_VARS)


def setup_tracing(service_name: str, instance_id: str, version: str) -> Tracing:
    """The tracing of one service process, configured by the ``OTEL_*`` environment."""
    if not tracing_enabled():
        return NO_TRACING
    # Imported only when on: the exporter pulls in requests and protobuf, and the SDK adds to
    # every service's start-up.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create(
        {
            "service.name": service_name,
            "service.version": version,
            "service.instance.id": instance_id,
        }
    )
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    log.info(
        "tracing on: %s (%s) exporting OTLP/HTTP to %s",
        service_name,
        instance_id,
        next(os.environ[n] for n in ENDPOINT_VARS if os.environ.get(n, "").strip()),
    )
    return Tracing(provider.get_tracer(INSTRUMENTATION_SCOPE, version), provider)
