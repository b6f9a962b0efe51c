"""otel/: when tracing is on, W3C context through NATS headers, the spans the Outbox makes, and a
real OTLP/HTTP export to a local receiver."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import StreamConfig
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Tracer, set_span_in_context

from jetcrawl.otel import (
    NO_TRACING,
    extract,
    inject,
    remote_span_context,
    setup_tracing,
    tracing_enabled,
)
from jetcrawl.otel.spans import redact_url
from jetcrawl.plumbing.bus import MSG_ID, Outbox, Outgoing
from tests.support.otlp import OtlpReceiver

TRACEPARENT = "traceparent"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    yield InMemorySpanExporter()


@pytest.fixture
def tracer(exporter: InMemorySpanExporter) -> Iterator[Tracer]:
    provider = TracerProvider(resource=Resource.create({}), shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider.get_tracer("test")
    provider.shutdown()


@pytest.mark.parametrize(
    ("env", "enabled"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_SDK_DISABLED": "false"}, False),  # nowhere to send to
    ],
)
def test_tracing_is_on_only_with_an_endpoint_and_not_disabled(
    env: dict[str, str], enabled: bool
) -> None:
    assert tracing_enabled(env) is enabled


def test_off_is_a_true_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    tracing = setup_tracing("jetcrawl-worker", "w1", "0.1.0")
    assert tracing is NO_TRACING and tracing.provider is None and not tracing.enabled
    incoming = {TRACEPARENT: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    assert tracing.extract(incoming) == {}, "off: trace headers are not even read"
    span = tracing.tracer.start_span("x", context=tracing.extract(incoming))
    assert not span.get_span_context().is_valid
    assert inject(None, set_span_in_context(span)) is None, "off: nothing is written"


def test_inject_then_extract_carries_the_span_context(tracer: Tracer) -> None:
    span = tracer.start_span("publish")
    headers = inject({MSG_ID: "abc"}, set_span_in_context(span))
    assert headers is not None and headers[MSG_ID] == "abc"
    ctx = span.get_span_context()
    version, trace_id, span_id, flags = headers[TRACEPARENT].split("-")
    assert (version, trace_id, span_id) == ("00", f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}")
    assert int(flags, 16) & 1, "sampled"
    remote = remote_span_context(headers)
    assert remote is not None and remote.is_remote
    assert (remote.trace_id, remote.span_id) == (ctx.trace_id, ctx.span_id)
    span.end()


def test_inject_keeps_a_traceparent_the_message_has_and_adds_none_without_a_span(
    tracer: Tracer,
) -> None:
    mine = {TRACEPARENT: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    span = tracer.start_span("x")
    assert inject(mine, set_span_in_context(span)) == mine
    span.end()
    assert inject({MSG_ID: "a"}) == {MSG_ID: "a"}, "no current span: unchanged"
    assert inject(None) is None


def test_extract_of_a_message_without_headers_has_no_parent() -> None:
    assert remote_span_context(None) is None
    assert remote_span_context({MSG_ID: "x"}) is None
    assert remote_span_context({TRACEPARENT: "garbage"}) is None
    assert extract(None) == {}


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://a.example/p?q=1", "https://a.example/p?q=1"),
        ("https://user:pw@a.example:8443/p", "https://REDACTED:REDACTED@a.example:8443/p"),
        (
            "https://s3.example/o?AWSAccessKeyId=AK&Signature=xyz&x=1",
            "https://s3.example/o?AWSAccessKeyId=REDACTED&Signature=REDACTED&x=1",
        ),
    ],
)
def test_url_full_carries_no_credentials(url: str, expected: str) -> None:
    assert redact_url(url) == expected


async def test_outbox_makes_a_producer_span_per_message_and_carries_its_context(
    nc: NATS, js: JetStreamContext, tracer: Tracer, exporter: InMemorySpanExporter
) -> None:
    await js.add_stream(StreamConfig(name="T", subjects=["t.>"]))
    await js.add_stream(StreamConfig(name="KV_b", subjects=["$KV.b.>"]))
    outbox = Outbox(nc, tracer=tracer)
    await outbox.send([Outgoing("t.untraced", b"0")])  # no current span: nothing added
    with tracer.start_as_current_span("process t.in", kind=SpanKind.CONSUMER) as parent:
        preset = {TRACEPARENT: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
        await outbox.send(
            [
                Outgoing("t.one", b"1", {MSG_ID: "m1"}),
                Outgoing("t.two", b"22"),
                Outgoing("t.preset", b"3", preset),
                Outgoing("$KV.b.key", b"4"),
            ]
        )
    stored = {m.subject: m for m in [await js.get_msg("T", seq) for seq in range(1, 5)]}
    assert stored["t.untraced"].headers is None
    assert stored["t.preset"].headers == preset, "a context the caller chose is kept"
    kv = await js.get_msg("KV_b", 1)
    assert TRACEPARENT not in (kv.headers or {}), "KV writes carry no trace context"

    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"process t.in", "publish t.one", "publish t.two"}
    for subject, size in (("t.one", 1), ("t.two", 2)):
        span = spans[f"publish {subject}"]
        assert span.kind == SpanKind.PRODUCER
        assert span.parent is not None and span.parent.span_id == parent.get_span_context().span_id
        assert span.attributes is not None
        assert span.attributes["messaging.system"] == "nats"
        assert span.attributes["messaging.destination.name"] == subject
        assert span.attributes["messaging.operation.type"] == "send"
        assert span.attributes["messaging.message.body.size"] == size
        carried = remote_span_context(stored[subject].headers)
        assert carried is not None and carried.span_id == span.context.span_id
    assert spans["publish t.one"].attributes["messaging.message.id"] == "m1"  # type: ignore[index]


async def test_an_outbox_told_not_to_propagate_adds_no_context_under_a_current_span(
    nc: NATS, js: JetStreamContext, tracer: Tracer
) -> None:
    await js.add_stream(StreamConfig(name="T", subjects=["t.>"]))
    with tracer.start_as_current_span("process t.in", kind=SpanKind.CONSUMER) as parent:
        await Outbox(nc).send([Outgoing("t.default", b"1")])  # no tracer: context still carried
        await Outbox(nc, propagate=False).send([Outgoing("t.off", b"2")])
    default, off = [await js.get_msg("T", seq) for seq in (1, 2)]
    carried = remote_span_context(default.headers)
    assert carried is not None and carried.span_id == parent.get_span_context().span_id
    assert off.headers is None


async def test_setup_exports_over_otlp_http_with_the_service_resource(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with OtlpReceiver() as receiver:
        for name, value in receiver.env().items():
            monkeypatch.setenv(name, value)
        tracing = setup_tracing("jetcrawl-worker", "w7", "9.9.9")
        assert tracing.enabled
        tracing.tracer.start_span("hello", kind=SpanKind.INTERNAL).end()
        await asyncio.to_thread(tracing.shutdown)  # flushes: no waiting for the schedule
        [span] = receiver.spans
    assert span.name == "hello"
    assert span.service == "jetcrawl-worker"
    assert span.resource["service.version"] == "9.9.9"
    assert span.resource["service.instance.id"] == "w7"
    assert span.scope == "jetcrawl"
