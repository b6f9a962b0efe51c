"""The spans of one dispatched batch, and where a crawl's trace is cut.

Each frontier message gets a CONSUMER span ``process crawl.seeds`` or ``process crawl.discovered``:
the child of the context the message carries (the worker's ``publish crawl.discovered`` of the
page whose links these are), or the root of a new trace when it carries none (``nats pub``).

Each task gets a PRODUCER span ``publish crawl.tasks.<n>``; the task carries its context to the
worker, whose crawl of the URL is its child. Where that span hangs is the trace design:

- task depth <= ``trace_continue_depth``: a child of its message's span, so the URL's crawl
  continues the trace of the page that linked it (of the seed, for depth 0);
- deeper: the root of a new trace, with a span **link** to its message's span, which lives in the
  linking page's trace. A trace then holds one page — its task's publish, the worker's robots
  check, GET, parse and publishes, and the dispatch of its links — and the links chain a crawl
  tree page to page instead of making one trace of a whole crawl.

Dead letters get PRODUCER spans that are children of their message's span. When tracing is off
nothing here does anything.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from nats.aio.msg import Msg
from nats.js.api import PubAck
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, set_span_in_context
from opentelemetry.util.types import AttributeValue

from jetcrawl.contract.messages import Task
from jetcrawl.contract.topology import DISPATCH_CONSUMER
from jetcrawl.otel import Tracing, inject
from jetcrawl.otel.spans import consumer_span, end_producer, fail, producer_span
from jetcrawl.plumbing.bus import MSG_ID, Outgoing, PublishFailed

__all__ = ["BatchTrace"]

URL = "jetcrawl.url"
DEPTH = "jetcrawl.depth"
JOB = "jetcrawl.job"
STREAM_SEQ = "jetcrawl.stream_seq"
DELIVERED = "jetcrawl.delivered"
TASKS = "jetcrawl.tasks"
REJECTIONS = "jetcrawl.rejections"


class BatchTrace:
    """One CONSUMER span per frontier message of a batch, one PRODUCER span per publish."""

    def __init__(self, tracing: Tracing, msgs: Sequence[Msg], continue_depth: int) -> None:
        self._tracing = tracing
        self._continue_depth = continue_depth
        self._spans: list[Span] = []
        self._publishes: list[Span] = []
        if not tracing.enabled:
            return
        for msg in msgs:
            headers = msg.headers or {}
            self._spans.append(
                consumer_span(
                    tracing.tracer,
                    msg.subject,
                    parent=tracing.extract(headers),
                    subscription=DISPATCH_CONSUMER,
                    message_id=headers.get(MSG_ID),
                    body_size=len(msg.data),
                    attributes={
                        STREAM_SEQ: msg.metadata.sequence.stream,
                        DELIVERED: msg.metadata.num_delivered or 1,
                    },
                )
            )

    def publishes(
        self, outgoing: list[Outgoing], owners: list[int], tasks: list[tuple[int, Task]]
    ) -> list[Outgoing]:
        """``outgoing`` with trace context; its first ``len(tasks)`` entries are the tasks."""
        if not self._spans:
            return outgoing
        traced: list[Outgoing] = []
        for k, (m, owner) in enumerate(zip(outgoing, owners, strict=True)):
            message_span = self._spans[owner]
            parent: Context | None = set_span_in_context(message_span)
            links: list[Link] = []
            attributes: dict[str, AttributeValue] | None = None
            if k < len(tasks):
                task = tasks[k][1]
                attributes = {URL: task.url, DEPTH: task.depth, JOB: task.lineage.job}
                if task.depth > self._continue_depth:
                    parent = Context()  # a new trace for this page, linked to its parent's
                    links.append(Link(message_span.get_span_context()))
            span = producer_span(
                self._tracing.tracer,
                m.subject,
                parent=parent,
                links=links,
                message_id=m.headers.get(MSG_ID) if m.headers else None,
                body_size=len(m.payload),
                attributes=attributes,
            )
            self._publishes.append(span)
            traced.append(
                dataclasses.replace(m, headers=inject(m.headers, set_span_in_context(span)))
            )
        return traced

    def published(self, acks: Sequence[PubAck | PublishFailed]) -> None:
        if not self._spans:
            return
        for span, ack in zip(self._publishes, acks, strict=True):
            end_producer(span, ack.cause if isinstance(ack, PublishFailed) else None)

    def finish(
        self,
        retried: set[int],
        tasks: Sequence[tuple[int, Task]] = (),
        rejections: Sequence[int] = (),
        why: str = "",
    ) -> None:
        """End every message's span; ``retried`` are the indexes of messages nak'ed (``why``)."""
        if not self._spans:
            return
        admitted = [0] * len(self._spans)
        for owner, _ in tasks:
            admitted[owner] += 1
        for i, span in enumerate(self._spans):
            span.set_attribute(TASKS, admitted[i])
            if i < len(rejections):
                span.set_attribute(REJECTIONS, rejections[i])
            if i in retried:
                fail(span, "retried", why)
            span.end()
