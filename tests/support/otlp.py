"""A local OTLP/HTTP trace receiver: what a collector (or Jaeger) would get, decoded.

``OtlpReceiver`` is an aiohttp server (127.0.0.1, OS-chosen port unless given) that accepts
``POST /v1/traces`` with an ``ExportTraceServiceRequest`` in protobuf (gzip or deflate encoded, or
not), the wire the OpenTelemetry SDK's OTLP/HTTP exporter sends, and keeps every span as a flat
``ReceivedSpan``. Point a process at it with ``OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint``
(``receiver.env()`` gives that and a fast batch schedule), then ``await receiver.wait_for(...)``
on a condition over the spans: it wakes on each export, no polling.
"""

from __future__ import annotations

import asyncio
import gzip
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

TRACES_PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"

KINDS = {
    Span.SPAN_KIND_UNSPECIFIED: "UNSPECIFIED",
    Span.SPAN_KIND_INTERNAL: "INTERNAL",
    Span.SPAN_KIND_SERVER: "SERVER",
    Span.SPAN_KIND_CLIENT: "CLIENT",
    Span.SPAN_KIND_PRODUCER: "PRODUCER",
    Span.SPAN_KIND_CONSUMER: "CONSUMER",
}
STATUSES = {
    Status.STATUS_CODE_UNSET: "UNSET",
    Status.STATUS_CODE_OK: "OK",
    Status.STATUS_CODE_ERROR: "ERROR",
}


@dataclass(frozen=True, slots=True)
class ReceivedLink:
    trace_id: str
    span_id: str


@dataclass(frozen=True, slots=True)
class ReceivedSpan:
    service: str  # the resource's service.name
    resource: dict[str, Any]
    scope: str
    trace_id: str  # hex
    span_id: str  # hex
    parent_span_id: str  # hex, "" for a root span
    name: str
    kind: str  # INTERNAL, SERVER, CLIENT, PRODUCER, CONSUMER
    attributes: dict[str, Any]
    links: tuple[ReceivedLink, ...]
    status: str  # UNSET, OK, ERROR
    start_ns: int
    end_ns: int

    @property
    def is_root(self) -> bool:
        return not self.parent_span_id


@dataclass(slots=True)
class OtlpReceiver:
    """Async context manager: serves until exited. ``spans`` holds everything received."""

    host: str = "127.0.0.1"
    port: int = 0
    spans: list[ReceivedSpan] = field(default_factory=list)
    requests: int = 0
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    _runner: web.AppRunner | None = None

    @property
    def endpoint(self) -> str:
        """The base URL, for ``OTEL_EXPORTER_OTLP_ENDPOINT``."""
        return f"http://{self.host}:{self.port}"

    def env(self, schedule_delay_ms: int = 100) -> dict[str, str]:
        """Environment for a process that should export here, flushing every ``schedule_delay``."""
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": str(schedule_delay_ms),
        }

    async def __aenter__(self) -> Self:
        app = web.Application()
        app.router.add_post(TRACES_PATH, self._export)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def wait_for(
        self, predicate: Callable[[Sequence[ReceivedSpan]], bool], within_s: float = 30.0
    ) -> None:
        """Until ``predicate(spans)`` holds, re-checked on every export request."""
        async with asyncio.timeout(within_s), self._changed:
            await self._changed.wait_for(lambda: predicate(self.spans))

    def by_name(self, name: str) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.name == name]

    def get(self, span_id: str) -> ReceivedSpan:
        [span] = [s for s in self.spans if s.span_id == span_id]
        return span

    def children(self, parent: ReceivedSpan) -> list[ReceivedSpan]:
        return [
            s
            for s in self.spans
            if s.parent_span_id == parent.span_id and s.trace_id == parent.trace_id
        ]

    async def _export(self, request: web.Request) -> web.Response:
        body = await request.read()
        encoding = request.headers.get("Content-Encoding", "").lower()
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        if request.content_type != PROTOBUF:
            return web.Response(status=415, text=f"want {PROTOBUF}")
        export = ExportTraceServiceRequest()
        export.ParseFromString(body)
        received = list(_flatten(export))
        async with self._changed:
            self.requests += 1
            self.spans.extend(received)
            self._changed.notify_all()
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(), content_type=PROTOBUF
        )


def _flatten(export: ExportTraceServiceRequest) -> list[ReceivedSpan]:
    out = []
    for resource_spans in export.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                out.append(
                    ReceivedSpan(
                        service=str(resource.get("service.name", "")),
                        resource=resource,
                        scope=scope_spans.scope.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        name=span.name,
                        kind=KINDS[span.kind],
                        attributes=_attributes(span.attributes),
                        links=tuple(
                            ReceivedLink(link.trace_id.hex(), link.span_id.hex())
                            for link in span.links
                        ),
                        status=STATUSES[span.status.code],
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                    )
                )
    return out


def _attributes(pairs: Sequence[KeyValue]) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs}


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, kind)
