"""W3C trace context in NATS headers: ``traceparent`` and ``tracestate``.

A NATS message's headers are a ``str -> str`` mapping, which is all the W3C propagator needs as a
carrier. ``inject`` never overwrites a ``traceparent`` a message already carries (the caller chose
that context on purpose); ``extract`` starts from an empty context, so a message without headers —
a seed sent with ``nats pub`` — yields no parent, and the span made for it begins a new trace.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry.context import Context
from opentelemetry.trace import SpanContext, get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

__all__ = ["TRACEPARENT", "TRACESTATE", "extract", "inject", "remote_span_context"]

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"

_W3C = TraceContextTextMapPropagator()


def inject(
    headers: Mapping[str, str] | None, context: Context | None = None
) -> Mapping[str, str] | None:
    """``headers`` plus the trace context of ``context`` (default: the current one).

    Returned unchanged when they already carry a ``traceparent`` or there is no valid span to
    propagate; otherwise a new dict (the caller's mapping is never modified).
    """
    if headers is not None and TRACEPARENT in headers:
        return headers
    if not get_current_span(context).get_span_context().is_valid:
        return headers
    carrier = dict(headers) if headers else {}
    _W3C.inject(carrier, context)
    return carrier


def extract(headers: Mapping[str, str] | None) -> Context:
    """The remote parent context in ``headers``; an empty context when there is none."""
    if not headers or TRACEPARENT not in headers:
        return Context()
    return _W3C.extract(headers, context=Context())


def remote_span_context(headers: Mapping[str, str] | None) -> SpanContext | None:
    """The span context ``headers`` carry, for a span link; None without a valid one."""
    span_context = get_current_span(extract(headers)).get_span_context()
    return span_context if span_context.is_valid else None


def current_trace_id() -> str | None:
    """The W3C trace id (32 hex digits) of the current span, or None outside any trace."""
    context = get_current_span().get_span_context()
    return f"{context.trace_id:032x}" if context.is_valid else None
