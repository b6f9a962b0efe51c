"""Prometheus metrics of the services, each service with a registry of its own.

What a service already counts (``DispatchStats``, ``CrawlStats``, its owned shards, its tasks in
flight) is read when scraped — one count, not a second copy kept beside it. What nobody else
counts is observed where it happens: pages by status class, bytes, latencies.

Both services: ``jetcrawl_build_info{service, version, instance}`` (always 1), and
``jetcrawl_dead_letters_total`` (dead letters written; the dispatcher's also counts the poison
tasks and frontier messages it dead-lettered after JetStream gave up on them).

Dispatcher (``DispatcherMetrics``)::

    jetcrawl_frontier_messages_total     frontier messages finished (acked or terminated)
    jetcrawl_frontier_retries_total      frontier messages handed back for a retry
    jetcrawl_frontier_backlog            the dispatch consumer's num_pending at the last delivery
    jetcrawl_urls_admitted_total         new URLs published as tasks
    jetcrawl_urls_republished_total      tasks published again on a redelivery
    jetcrawl_urls_rejected_total{reason} duplicate, out_of_scope, too_deep, over_limit

Worker (``WorkerMetrics``)::

    jetcrawl_pages_total{outcome, status_class}  one per task finished with a result: outcome
                                         fetched or skipped (status_class 1xx..5xx),
                                         robots_disallowed or failed (status_class "none")
    jetcrawl_fetched_bytes_total         response body bytes (Content-Length when not read,
                                         0 when skipped)
    jetcrawl_bodies_skipped_total        responses of a media type their job does not read:
                                         released unread, recorded as skipped
    jetcrawl_links_skipped_total         links not sent to the frontier: their extension is one
                                         their job skips (contract/filetypes.py)
    jetcrawl_fetch_failures_total{kind}  tasks that ended without a page, by cause
    jetcrawl_soft_blocks_total{host, signal}  pages recorded as blocked (bot wall, CAPTCHA, login
                                         wall), by host (the first SOFT_BLOCK_HOSTS, then "other")
    jetcrawl_fetch_duration_seconds      histogram: the HTTP GET of a task, failures included
    jetcrawl_robots_denials_total        tasks robots.txt did not allow
    jetcrawl_task_retries_total          tasks handed back with nak(delay)
    jetcrawl_tasks_handed_back_total     waiting tasks handed back to make room (no attempts)
    jetcrawl_handbacks_due               of those, the ones whose turn is still to come
    jetcrawl_handback_furthest_due_timestamp_seconds  when the last of them is due (0: none)
    jetcrawl_politeness_wait_seconds     histogram: how long a task waited for its host's turn
    jetcrawl_owned_shards                shards this worker pulls now
    jetcrawl_tasks_in_flight             tasks pulled and not yet acked (waiting, fetching, storing)
    jetcrawl_fetches_in_flight           HTTP fetches running now (at most concurrency)
    jetcrawl_links_published_total       links sent back to the frontier
    jetcrawl_links_sent_before_total     links left out of a page's message: the worker sent them
                                         to the frontier already (worker/sent.py), or an earlier
                                         page of the same message carries them
    jetcrawl_links_messages_total        crawl.discovered messages stored (one page's links or
                                         several pages', worker/discovered.py)
    jetcrawl_publish_retries_total       records published again in place after a failed publish
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

SOFT_BLOCK_HOSTS = 1000  # hosts with a soft-block series of their own

__all__ = ["DispatcherMetrics", "ServiceMetrics", "WorkerMetrics", "status_class"]

FETCH_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
WAIT_BUCKETS_S = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
NO_STATUS = "none"


class DispatchCounts(Protocol):
    @property
    def messages(self) -> int: ...
    @property
    def retried(self) -> int: ...
    @property
    def admitted(self) -> int: ...
    @property
    def republished(self) -> int: ...
    @property
    def duplicates(self) -> int: ...
    @property
    def out_of_scope(self) -> int: ...
    @property
    def too_deep(self) -> int: ...
    @property
    def over_limit(self) -> int: ...
    @property
    def not_followed(self) -> int: ...
    @property
    def rejected(self) -> int: ...


class CrawlCounts(Protocol):
    @property
    def deferred(self) -> int: ...
    @property
    def disallowed(self) -> int: ...
    @property
    def retried(self) -> int: ...
    @property
    def links_published(self) -> int: ...
    @property
    def links_sent_before(self) -> int: ...
    @property
    def skipped(self) -> int: ...
    @property
    def links_skipped(self) -> int: ...
    @property
    def links_messages(self) -> int: ...
    @property
    def publish_retries(self) -> int: ...
    @property
    def dead_letters(self) -> int: ...
    @property
    def items(self) -> int: ...
    @property
    def extract_failures(self) -> int: ...


class DispatcherView(Protocol):
    @property
    def stats(self) -> DispatchCounts: ...
    @property
    def frontier_backlog(self) -> int: ...
    @property
    def dead_letters(self) -> int: ...


class WorkerView(Protocol):
    @property
    def stats(self) -> CrawlCounts: ...
    @property
    def shards(self) -> frozenset[int]: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def held(self) -> int: ...
    @property
    def handbacks_due(self) -> tuple[int, float | None]: ...


def status_class(status: int | None) -> str:
    return f"{status // 100}xx" if status is not None and 100 <= status < 600 else NO_STATUS


class ServiceMetrics:
    """A registry of its own, with the build info every service exports."""

    def __init__(self, service: str, version: str, instance: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        Gauge(
            "jetcrawl_build_info",
            "Always 1; the labels say which service, version and instance this is.",
            ["service", "version", "instance"],
            registry=self.registry,
        ).labels(service, version, instance).set(1)

    def read_counters(self, counters: Sequence[tuple[str, str, Callable[[], float]]]) -> None:
        """Export counters whose values another object keeps, read at scrape time."""
        self.registry.register(_ReadCounters(counters))


class DispatcherMetrics(ServiceMetrics):
    def bind(self, dispatcher: DispatcherView) -> None:
        stats = dispatcher.stats
        self.read_counters(
            [
                (
                    "jetcrawl_frontier_messages",
                    "Frontier messages finished.",
                    lambda: stats.messages,
                ),
                ("jetcrawl_frontier_retries", "Frontier messages retried.", lambda: stats.retried),
                ("jetcrawl_urls_admitted", "New URLs published as tasks.", lambda: stats.admitted),
                (
                    "jetcrawl_urls_republished",
                    "Tasks published again when their frontier message was redelivered.",
                    lambda: stats.republished,
                ),
                (
                    "jetcrawl_dead_letters",
                    "Dead letters written.",
                    lambda: dispatcher.dead_letters,
                ),
            ]
        )
        self.registry.register(
            _ReadLabelled(
                "jetcrawl_urls_rejected",
                "URLs not admitted, by reason.",
                "reason",
                {
                    "duplicate": lambda: stats.duplicates,
                    "out_of_scope": lambda: stats.out_of_scope,
                    "too_deep": lambda: stats.too_deep,
                    "over_limit": lambda: stats.over_limit,
                    "not_followed": lambda: stats.not_followed,  # by the job spec's rules
                },
            )
        )
        Gauge(
            "jetcrawl_frontier_backlog",
            "Messages waiting on the dispatch consumer (num_pending at the last delivery).",
            registry=self.registry,
        ).set_function(lambda: dispatcher.frontier_backlog)


class WorkerMetrics(ServiceMetrics):
    def __init__(self, service: str, version: str, instance: str) -> None:
        super().__init__(service, version, instance)
        self._pages = Counter(
            "jetcrawl_pages",
            "Tasks finished with a result, by outcome and HTTP status class.",
            ["outcome", "status_class"],
            registry=self.registry,
        )
        self._page_counters: dict[tuple[str, str], Counter] = {}
        self._failures = Counter(
            "jetcrawl_fetch_failures",
            "Tasks that ended without a page, by cause (dns, refused, tls, timeout, too_large, "
            "blocked, robots_unavailable, http_status, ...).",
            ["kind"],
            registry=self.registry,
        )
        self._bytes = Counter(
            "jetcrawl_fetched_bytes", "Response body bytes fetched.", registry=self.registry
        )
        self._soft_blocks = Counter(
            "jetcrawl_soft_blocks",
            "Pages recorded as blocked (bot wall, CAPTCHA, login wall), by host and signal.",
            ["host", "signal"],
            registry=self.registry,
        )
        self._blocked_hosts: set[str] = set()
        self.fetch_seconds = Histogram(
            "jetcrawl_fetch_duration_seconds",
            "Duration of a task's HTTP GET, failures included.",
            buckets=FETCH_BUCKETS_S,
            registry=self.registry,
        )
        self.politeness_wait_seconds = Histogram(
            "jetcrawl_politeness_wait_seconds",
            "How long a task waited for its host's politeness slot.",
            buckets=WAIT_BUCKETS_S,
            registry=self.registry,
        )

    def page(self, outcome: str, status: int | None, length: int) -> None:
        key = (outcome, status_class(status))
        child = self._page_counters.get(key)
        if child is None:  # labels() takes a lock and checks its arguments per call
            child = self._page_counters[key] = self._pages.labels(*key)
        child.inc()
        if length > 0:
            self._bytes.inc(length)

    def failure(self, kind: str) -> None:
        self._failures.labels(kind).inc()

    def soft_block(self, host: str, message: str) -> None:
        """A blocked page of ``host``; ``message`` starts with the signal ("login_wall: ...")."""
        if host not in self._blocked_hosts:
            if len(self._blocked_hosts) >= SOFT_BLOCK_HOSTS:
                host = "other"  # a label per host, within bounds
            else:
                self._blocked_hosts.add(host)
        self._soft_blocks.labels(host, message.split(":", 1)[0]).inc()

    def bind(self, worker: WorkerView) -> None:
        self.read_counters(
            [
                (
                    "jetcrawl_robots_denials",
                    "Tasks robots.txt did not allow.",
                    lambda: worker.stats.disallowed,
                ),
                (
                    "jetcrawl_tasks_handed_back",
                    "Tasks waiting for their host handed back to JetStream to make room (no "
                    "attempts).",
                    lambda: worker.stats.deferred,
                ),
                (
                    "jetcrawl_task_retries",
                    "Tasks handed back for a retry.",
                    lambda: worker.stats.retried,
                ),
                (
                    "jetcrawl_links_published",
                    "Links sent to the frontier.",
                    lambda: worker.stats.links_published,
                ),
                (
                    "jetcrawl_links_sent_before",
                    "Links left out of a page's message: this worker sent them already, or an "
                    "earlier page of the same message carries them.",
                    lambda: worker.stats.links_sent_before,
                ),
                (
                    "jetcrawl_links_messages",
                    "crawl.discovered messages stored, each one page's links or several pages'.",
                    lambda: worker.stats.links_messages,
                ),
                (
                    "jetcrawl_publish_retries",
                    "Records published again in place after a failed publish.",
                    lambda: worker.stats.publish_retries,
                ),
                (
                    "jetcrawl_bodies_skipped",
                    "Responses of a media type their job does not read: released unread.",
                    lambda: worker.stats.skipped,
                ),
                (
                    "jetcrawl_links_skipped",
                    "Links not sent to the frontier: their extension is one their job skips.",
                    lambda: worker.stats.links_skipped,
                ),
                (
                    "jetcrawl_dead_letters",
                    "Dead letters written.",
                    lambda: worker.stats.dead_letters,
                ),
                (
                    "jetcrawl_items",
                    "Items of pages stored on crawl.items.<job> (job specs' extraction, plugins).",
                    lambda: worker.stats.items,
                ),
                (
                    "jetcrawl_extract_failures",
                    "A job's extraction or plugin failed on a page: dead letters of stage extract.",
                    lambda: worker.stats.extract_failures,
                ),
            ]
        )
        Gauge(
            "jetcrawl_owned_shards", "Shards this worker pulls.", registry=self.registry
        ).set_function(lambda: len(worker.shards))
        Gauge(
            "jetcrawl_tasks_in_flight",
            "Tasks pulled and not yet acked: waiting for their host, fetching or being stored.",
            registry=self.registry,
        ).set_function(lambda: worker.held)
        Gauge(
            "jetcrawl_fetches_in_flight", "HTTP fetches running.", registry=self.registry
        ).set_function(lambda: worker.in_flight)
        Gauge(
            "jetcrawl_handbacks_due",
            "Tasks handed back to make room whose turn is still to come.",
            registry=self.registry,
        ).set_function(lambda: worker.handbacks_due[0])
        Gauge(
            "jetcrawl_handback_furthest_due_timestamp_seconds",
            "Unix time the furthest handed-back task is due back (0: none is due).",
            registry=self.registry,
        ).set_function(lambda: worker.handbacks_due[1] or 0.0)


class _ReadCounters(Collector):
    def __init__(self, counters: Sequence[tuple[str, str, Callable[[], float]]]) -> None:
        self._counters = counters

    def collect(self) -> Iterable[Metric]:
        for name, documentation, read in self._counters:
            yield CounterMetricFamily(name, documentation, value=read())


class _ReadLabelled(Collector):
    def __init__(
        self, name: str, documentation: str, label: str, reads: dict[str, Callable[[], float]]
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._label = label
        self._reads = reads

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(self._name, self._documentation, labels=[self._label])
        for value, read in self._reads.items():
            family.add_metric([value], read())
        yield family
