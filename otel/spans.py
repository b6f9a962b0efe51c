"""Spans by the OpenTelemetry semantic conventions for messaging (NATS) and HTTP clients.

Messaging: a ``PRODUCER`` span ``publish <subject>`` per message sent (operation type ``send``,
whose context the message carries), and a ``CONSUMER`` span ``process <subject>`` per message
handled. HTTP: a ``CLIENT`` span named after the method, with the URL stripped of credentials.
Spans are started, not made current: callers that handle a batch keep one span per message.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.util.types import Attributes, AttributeValue

__all__ = [
    "consumer_span",
    "end_http_client",
    "end_producer",
    "fail",
    "http_client_span",
    "producer_span",
    "redact_url",
]

# --- messaging (semconv registry: messaging.*)
MESSAGING_SYSTEM = "messaging.system"
MESSAGING_OPERATION_TYPE = "messaging.operation.type"
MESSAGING_OPERATION_NAME = "messaging.operation.name"
MESSAGING_DESTINATION = "messaging.destination.name"
MESSAGING_SUBSCRIPTION = "messaging.destination.subscription.name"
MESSAGING_MESSAGE_ID = "messaging.message.id"
MESSAGING_BODY_SIZE = "messaging.message.body.size"
NATS = "nats"

# --- HTTP client (stable semconv: http.*, url.*, server.*)
HTTP_REQUEST_METHOD = "http.request.method"
HTTP_STATUS_CODE = "http.response.status_code"
HTTP_BODY_SIZE = "http.response.body.size"
URL_FULL = "url.full"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
ERROR_TYPE = "error.type"

REDACTED = "REDACTED"
# Query parameters whose values are credentials (the semconv's url.full list).
SENSITIVE_QUERY = frozenset({"AWSAccessKeyId", "Signature", "sig", "X-Goog-Signature"})
DEFAULT_PORTS = {"http": 80, "https": 443}


def producer_span(
    tracer: Tracer,
    destination: str,
    *,
    parent: Context | None,
    message_id: str | None = None,
    body_size: int | None = None,
    links: Sequence[Link] = (),
    attributes: Attributes = None,
) -> Span:
    """``publish <destination>``: the creation context of one message (end it on the ack)."""
    attrs = _messaging("send", "publish", destination, message_id, body_size)
    attrs.update(attributes or {})
    return tracer.start_span(
        f"publish {destination}",
        context=parent,
        kind=SpanKind.PRODUCER,
        attributes=attrs,
        links=links,
    )


def end_producer(span: Span, error: BaseException | None) -> None:
    if error is not None:
        fail(span, type(error).__name__, str(error))
    span.end()


def consumer_span(
    tracer: Tracer,
    destination: str,
    *,
    parent: Context,
    subscription: str,
    message_id: str | None = None,
    body_size: int | None = None,
    links: Sequence[Link] = (),
    attributes: Attributes = None,
) -> Span:
    """``process <destination>``: the handling of one message pulled from ``subscription``."""
    attrs = _messaging("process", "process", destination, message_id, body_size)
    attrs[MESSAGING_SUBSCRIPTION] = subscription
    attrs.update(attributes or {})
    return tracer.start_span(
        f"process {destination}",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes=attrs,
        links=links,
    )


def http_client_span(tracer: Tracer, method: str, url: str, context: Context | None = None) -> Span:
    parts = urlsplit(url)
    attrs: dict[str, AttributeValue] = {
        HTTP_REQUEST_METHOD: method,
        URL_FULL: redact_url(url),
        SERVER_ADDRESS: parts.hostname or "",
    }
    port = parts.port or DEFAULT_PORTS.get(parts.scheme)
    if port is not None:
        attrs[SERVER_PORT] = port
    return tracer.start_span(method, context=context, kind=SpanKind.CLIENT, attributes=attrs)


def end_http_client(span: Span, status: int, body_size: int | None = None) -> None:
    """Record the response; a 4xx or 5xx marks a client span as failed (semconv)."""
    span.set_attribute(HTTP_STATUS_CODE, status)
    if body_size is not None:
        span.set_attribute(HTTP_BODY_SIZE, body_size)
    if status >= 400:
        fail(span, str(status), "")


def fail(span: Span, error_type: str, description: str) -> None:
    span.set_attribute(ERROR_TYPE, error_type)
    span.set_status(Status(StatusCode.ERROR, description or None))


def redact_url(url: str) -> str:
    """``url`` with any user:password and credential query values replaced by ``REDACTED``."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}:{REDACTED}@{netloc.rpartition('@')[2]}"
    query = parts.query
    if query and any(name in SENSITIVE_QUERY for name, _ in parse_qsl(query)):
        query = urlencode(
            [
                (name, REDACTED if name in SENSITIVE_QUERY else value)
                for name, value in parse_qsl(query, keep_blank_values=True)
            ],
            safe="/:",
        )
    if netloc == parts.netloc and query == parts.query:
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _messaging(
    operation_type: str,
    operation_name: str,
    destination: str,
    message_id: str | None,
    body_size: int | None,
) -> dict[str, AttributeValue]:
    attrs: dict[str, AttributeValue] = {
        MESSAGING_SYSTEM: NATS,
        MESSAGING_OPERATION_TYPE: operation_type,
        MESSAGING_OPERATION_NAME: operation_name,
        MESSAGING_DESTINATION: destination,
    }
    if message_id is not None:
        attrs[MESSAGING_MESSAGE_ID] = message_id
    if body_size is not None:
        attrs[MESSAGING_BODY_SIZE] = body_size
    return attrs
