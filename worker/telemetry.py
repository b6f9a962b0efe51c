"""Spans and metrics of a task's crawl, kept out of the crawl's own code.

The spans of one task, by the messaging and HTTP client semantic conventions::

    process crawl.tasks.<n>        CONSUMER: child of the task's publish (the context it carries)
      robots                       the robots.txt verdict (fetching the file when not cached)
      politeness wait              waiting for the host's turn
      GET                          CLIENT: the page's request; url.full, server.address/port,
                                   http.response.status_code (4xx and 5xx mark it failed)
      parse                        link and title extraction
      publish crawl.results.<n>    PRODUCER spans made by the Outbox while the task's span is
      publish crawl.discovered     current; the links carry the page's context to the dispatcher

Metrics observed here: pages by outcome and status class and their bytes when a task finishes,
the GET's duration (failures included) and the politeness wait. With tracing off, no span is made;
without metrics (a worker that serves no /metrics), nothing is observed or timed.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TypeVar

from nats.aio.msg import Msg
from opentelemetry.trace import Span, get_current_span, use_span

from jetcrawl.contract.messages import Result
from jetcrawl.contract.topology import lane_consumer, lane_of
from jetcrawl.contract.urls import host_of
from jetcrawl.otel import Tracing, current_trace_id
from jetcrawl.otel.spans import consumer_span, end_http_client, fail, http_client_span
from jetcrawl.plumbing.bus import MSG_ID
from jetcrawl.plumbing.metrics import WorkerMetrics
from jetcrawl.worker.errors import FetchError
from jetcrawl.worker.pages import Got
from jetcrawl.worker.robots import RobotsVerdict

__all__ = ["TaskTelemetry"]

T = TypeVar("T")

DELIVERED = "jetcrawl.delivered"
URL = "jetcrawl.url"
DEPTH = "jetcrawl.depth"
JOB = "jetcrawl.job"
OUTCOME = "jetcrawl.outcome"
ROBOTS_ALLOWED = "jetcrawl.robots.allowed"
ROBOTS_REASON = "jetcrawl.robots.reason"
REDIRECTS = "jetcrawl.redirects"
LINKS = "jetcrawl.links"
RENDERED = "jetcrawl.rendered"
_NOTHING = nullcontext()  # with tracing off: one shared no-op, not a context manager per page


class TaskTelemetry:
    def __init__(self, tracing: Tracing, metrics: WorkerMetrics | None) -> None:
        self._tracing = tracing
        self._on = tracing.enabled
        self._metrics = metrics
        self._timed = metrics is not None or tracing.enabled

    @property
    def traced(self) -> bool:
        """Tracing is on: each task has spans, and its messages carry their context."""
        return self._on

    def processing(self, msg: Msg, shard: int) -> AbstractContextManager[object]:
        """The task's CONSUMER span, current while the task is crawled."""
        return self._processing(msg, shard) if self._on else _NOTHING

    @contextmanager
    def _processing(self, msg: Msg, shard: int) -> Iterator[None]:
        headers = msg.headers or {}
        span = consumer_span(
            self._tracing.tracer,
            msg.subject,
            parent=self._tracing.extract(headers),
            subscription=_consumer_of(msg.subject),
            message_id=headers.get(MSG_ID),
            body_size=len(msg.data),
            attributes={DELIVERED: msg.metadata.num_delivered or 1},
        )
        with use_span(span, end_on_exit=True):
            yield

    async def robots(self, check: Awaitable[RobotsVerdict]) -> RobotsVerdict:
        if not self._on:
            return await check
        with self._tracing.tracer.start_as_current_span("robots") as span:
            verdict = await check
            span.set_attribute(ROBOTS_ALLOWED, verdict.allowed)
            span.set_attribute(ROBOTS_REASON, verdict.reason)
        return verdict

    async def politeness_wait(self, wait: Awaitable[T]) -> T:
        if not self._timed:
            return await wait
        started = time.perf_counter()
        try:
            if not self._on:
                return await wait
            with self._tracing.tracer.start_as_current_span("politeness wait"):
                return await wait
        finally:
            if self._metrics is not None:
                self._metrics.politeness_wait_seconds.observe(time.perf_counter() - started)

    async def get(self, url: str, fetch: Awaitable[Got]) -> Got:
        """Await ``fetch`` (the GET of ``url``, and its render) under a CLIENT span, timing it."""
        if not self._timed:
            return await fetch
        span: Span | None = None
        if self._on:
            span = http_client_span(self._tracing.tracer, "GET", url)
        started = time.perf_counter()
        try:
            got = await fetch
        except FetchError as e:
            if span is not None:
                fail(span, e.kind, e.message)
            raise
        except BaseException as e:
            if span is not None:
                fail(span, type(e).__name__, str(e))
            raise
        else:
            if span is not None:
                fetched = got.fetched
                if fetched.redirects:
                    span.set_attribute(REDIRECTS, len(fetched.redirects))
                if got.rendered:
                    span.set_attribute(RENDERED, True)
                end_http_client(span, fetched.status, fetched.length)
            return got
        finally:
            if self._metrics is not None:
                self._metrics.fetch_seconds.observe(time.perf_counter() - started)
            if span is not None:
                span.end()

    def parse(self) -> AbstractContextManager[object]:
        return self._tracing.tracer.start_as_current_span("parse") if self._on else _NOTHING

    def trace_id(self) -> str | None:
        """The current trace's id, for the task's result; None with tracing off (no span is
        current then, so asking OpenTelemetry would be wasted work)."""
        return current_trace_id() if self._on else None

    def finished(self, result: Result) -> None:
        """A task's result is stored and the task acked: count the page."""
        if self._metrics is not None:
            self._metrics.page(result.outcome, result.status, result.length)
            if result.error is not None and result.outcome == "blocked":
                self._metrics.soft_block(host_of(result.url), result.error.message)
            elif result.error is not None:
                self._metrics.failure(result.error.kind)
        if self._on:
            span = get_current_span()
            span.set_attribute(URL, result.url)
            span.set_attribute(DEPTH, result.depth)
            span.set_attribute(JOB, result.job)
            span.set_attribute(OUTCOME, result.outcome)
            span.set_attribute(LINKS, result.outlinks)


def _consumer_of(subject: str) -> str:
    """The lane consumer that delivers ``subject``'s tasks."""
    try:
        return lane_consumer(*lane_of(subject))
    except ValueError:
        return subject
