"""A real crawl by dispatcher and worker processes, traced into a local OTLP/HTTP receiver.

The receiver decodes what the services' exporters send (tests/support/otlp.py); the assertions
follow one seed through the mesh — nats pub, dispatch, task publish, worker, robots, politeness,
GET, parse, result and links — and check where the trace is cut (``trace_continue_depth``, 0 by
default).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from urllib.parse import urlsplit

import orjson
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from jetcrawl.contract.messages import Discovered, Lineage, Result, Task
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import (
    DISCOVERED,
    SEEDS,
    TASKS_STREAM,
    lane_consumer,
    task_subject,
)
from jetcrawl.contract.urls import fingerprint
from jetcrawl.dispatcher import Dispatcher
from jetcrawl.local.embedded import EtcdServer, NatsServer
from jetcrawl.otel import Tracing, remote_span_context
from jetcrawl.plumbing.logs import JsonFormatter
from tests.support.mesh import Mesh
from tests.support.otlp import OtlpReceiver, ReceivedLink, ReceivedSpan
from tests.support.site import MultiHostSite
from tests.support.streams import eventually, stored

DISPATCHER = "jetcrawl-dispatcher"
WORKER = "jetcrawl-worker"


@pytest.fixture
async def receiver() -> AsyncIterator[OtlpReceiver]:
    async with OtlpReceiver() as started:
        yield started


async def crawl_traced(
    mesh: Mesh, receiver: OtlpReceiver, seeds: list[str]
) -> tuple[list[Result], list[ReceivedSpan]]:
    """Crawl ``seeds`` with a traced dispatcher and two workers; stop them (which flushes)."""
    services = [await mesh.start("dispatcher", "dispatcher", **receiver.env())]
    services += [await mesh.start("worker", name, **receiver.env()) for name in ("w1", "w2")]
    await mesh.wait_ownership({"w1", "w2"})
    await mesh.seed(seeds)
    await mesh.wait_drained()
    results = await mesh.results()
    for service in services:
        service.signal(signal.SIGTERM)
    for service in services:
        assert await service.wait() == 0, service.log()

    def every_task_traced(spans: Sequence[ReceivedSpan]) -> bool:
        return sum(s.name.startswith("process crawl.tasks.") for s in spans) >= len(results)

    await receiver.wait_for(every_task_traced, within_s=10)  # flushed at exit: already there
    return results, receiver.spans


def one(spans: list[ReceivedSpan]) -> ReceivedSpan:
    assert len(spans) == 1, [(s.name, s.service) for s in spans]
    return spans[0]


def child_of(span: ReceivedSpan, parent: ReceivedSpan) -> bool:
    return span.trace_id == parent.trace_id and span.parent_span_id == parent.span_id


def messaging(span: ReceivedSpan, destination: str, operation: str) -> None:
    assert span.attributes["messaging.system"] == "nats"
    assert span.attributes["messaging.destination.name"] == destination
    assert span.attributes["messaging.operation.type"] == operation


async def test_one_seed_reads_as_one_story_across_processes(
    nats_server: NatsServer,
    etcd_server: EtcdServer,
    tmp_path: Path,
    site: MultiHostSite,
    receiver: OtlpReceiver,
) -> None:
    async with Mesh(nats_server.url, etcd_server.url, tmp_path) as mesh:
        results, spans = await crawl_traced(mesh, receiver, site.seeds)
    assert {r.url for r in results} == site.reachable
    by_url = {r.url: r for r in results}
    [seed_url] = site.seeds
    seed = by_url[seed_url]

    # nats pub (no headers) -> the dispatcher starts a trace.
    intake = one([s for s in spans if s.name == "process crawl.seeds"])
    assert intake.service == DISPATCHER and intake.kind == "CONSUMER" and intake.is_root
    messaging(intake, "crawl.seeds", "process")
    assert intake.attributes["messaging.destination.subscription.name"] == "dispatch"
    assert intake.attributes["jetcrawl.tasks"] == 1
    trace = [s for s in spans if s.trace_id == intake.trace_id]
    assert seed.trace_id == intake.trace_id, "the result names the trace it was crawled in"

    # dispatch -> the task's publish, a child in the same trace.
    task_subject = f"crawl.tasks.{seed.shard}.2.default"
    publish = one([s for s in trace if s.name == f"publish {task_subject}"])
    assert child_of(publish, intake) and publish.kind == "PRODUCER"
    messaging(publish, task_subject, "send")
    assert publish.attributes["messaging.message.id"] == seed.fp
    assert publish.attributes["jetcrawl.url"] == seed_url
    assert publish.attributes["jetcrawl.depth"] == 0

    # -> the worker process that owns the shard, continuing the trace from the task's headers.
    process = one([s for s in trace if s.name == f"process {task_subject}"])
    assert process.service == WORKER and process.kind == "CONSUMER"
    assert child_of(process, publish), "the context crossed from dispatcher to worker"
    assert process.resource["service.instance.id"] == seed.worker
    messaging(process, task_subject, "process")
    assert process.attributes["messaging.destination.subscription.name"] == lane_consumer(
        seed.shard, 2, "default"
    )
    assert process.attributes["jetcrawl.url"] == seed_url
    assert process.attributes["jetcrawl.outcome"] == "fetched"

    # -> robots, politeness, the HTTP GET, parse and the two publishes, children of the task.
    children = {s.name: s for s in receiver.children(process)}
    assert set(children) == {
        "robots",
        "politeness wait",
        "GET",
        "parse",
        f"publish crawl.results.{seed.shard}",
        "publish crawl.discovered",
    }
    assert children["robots"].attributes["jetcrawl.robots.allowed"] is True
    get = children["GET"]
    parts = urlsplit(seed_url)
    assert get.kind == "CLIENT" and get.service == WORKER
    assert get.attributes["http.request.method"] == "GET"
    assert get.attributes["url.full"] == seed_url
    assert get.attributes["server.address"] == parts.hostname
    assert get.attributes["server.port"] == parts.port
    assert get.attributes["http.response.status_code"] == 200
    assert get.status == "UNSET"
    stored = children[f"publish crawl.results.{seed.shard}"]
    assert stored.kind == "PRODUCER" and stored.attributes["messaging.message.id"] == seed.fp
    messaging(stored, f"crawl.results.{seed.shard}", "send")
    links_out = children["publish crawl.discovered"]
    messaging(links_out, "crawl.discovered", "send")
    assert get.start_ns < children["parse"].start_ns < stored.start_ns

    # -> the links go back to a dispatcher with the page's context: still the seed's trace.
    dispatch_links = one([s for s in spans if s.parent_span_id == links_out.span_id])
    assert dispatch_links.name == "process crawl.discovered"
    assert dispatch_links.service == DISPATCHER and child_of(dispatch_links, links_out)
    admitted = sum(r.parent == seed_url for r in results)
    assert dispatch_links.attributes["jetcrawl.tasks"] == admitted > 0

    # Depth 1 > trace_continue_depth 0: each link's publish starts a trace of its own, linked
    # to the dispatch of its parent page's links; its crawl continues that new trace.
    parent_page = ReceivedLink(dispatch_links.trace_id, dispatch_links.span_id)
    link_publishes = [s for s in spans if parent_page in s.links]
    assert len(link_publishes) == admitted
    for root in link_publishes:
        assert root.is_root and root.kind == "PRODUCER" and root.trace_id != intake.trace_id
        assert root.attributes["jetcrawl.depth"] == 1
        crawl = one([s for s in spans if child_of(s, root)])
        assert crawl.name.startswith("process crawl.tasks.") and crawl.service == WORKER
        assert crawl.attributes["jetcrawl.url"] == root.attributes["jetcrawl.url"]

    # The seed's trace holds the seed page alone; no trace grows with the crawl.
    assert Counter(s.name.split(" ")[0] for s in trace) == {
        "process": 3,  # crawl.seeds, crawl.tasks.<n>, crawl.discovered
        "publish": 3,  # the task, the result, the links
        "robots": 1,
        "politeness": 1,
        "GET": 1,
        "parse": 1,
    }

    # Every result was traced once, as a new trace linked to its parent's, by its own worker.
    crawls = [s for s in spans if s.name.startswith("process crawl.tasks.")]
    assert sorted(str(s.attributes["jetcrawl.url"]) for s in crawls) == sorted(by_url)
    for span in crawls:
        result = by_url[str(span.attributes["jetcrawl.url"])]
        assert span.resource["service.instance.id"] == result.worker
        parent = receiver.get(span.parent_span_id)
        published = f"publish crawl.tasks.{result.shard}.2.default"
        assert parent.service == DISPATCHER and parent.name == published
        if result.depth > 0:
            assert parent.is_root and len(parent.links) == 1
    gets = [s for s in spans if s.name == "GET"]
    assert len(gets) == sum(r.outcome == "fetched" for r in results)
    for span in gets:
        failed = span.attributes["http.response.status_code"] >= 400
        assert (span.status == "ERROR") is failed, "4xx and 5xx mark a client span failed"
        assert span.attributes["url.full"] in by_url


@pytest.mark.parametrize("continue_depth", [-1, 0, 1])
async def test_trace_continue_depth_says_which_tasks_start_a_trace_of_their_own(
    nats_server: NatsServer, nc: NATS, js: JetStreamContext, continue_depth: int
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing(provider.get_tracer("test"), provider)
    settings = Settings(nats_url=nats_server.url, shards=4, trace_continue_depth=continue_depth)
    # a worker's `publish crawl.discovered`, as its traceparent arrives in the headers
    worker = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    lineage = Lineage("default", "any", "", 5)
    async with Dispatcher(settings, tracing) as dispatcher, asyncio.TaskGroup() as tg:
        tg.create_task(dispatcher.run())
        await js.publish(SEEDS, b"https://a.example/")
        seed_url = "https://a.example/"
        links = Discovered(seed_url, fingerprint(seed_url), 1, lineage, (f"{seed_url}x",))
        await js.publish(DISCOVERED, links.to_wire(), headers=worker)
        async with asyncio.timeout(20):
            await dispatcher.wait_until(lambda s: s.messages == 2)
        dispatcher.stop()
    provider.shutdown()

    spans = exporter.get_finished_spans()
    [seeds] = [s for s in spans if s.name == "process crawl.seeds"]
    [found] = [s for s in spans if s.name == "process crawl.discovered"]
    assert seeds.parent is None, "nats pub: a new trace"
    assert found.parent is not None and found.parent.span_id == int("b7ad6b7169203331", 16)
    assert found.context.trace_id == int("0af7651916cd43dd8448eb211c80319c", 16)
    publishes = {
        s.attributes["jetcrawl.depth"]: s  # type: ignore[index]
        for s in spans
        if s.name.startswith("publish crawl.tasks.")
    }
    for depth, process in ((0, seeds), (1, found)):
        publish = publishes[depth]
        if depth <= continue_depth:
            assert publish.parent is not None and publish.parent.span_id == process.context.span_id
            assert publish.context.trace_id == process.context.trace_id
            assert not publish.links
        else:
            assert publish.parent is None and publish.context.trace_id != process.context.trace_id
            [link] = publish.links
            assert link.context.span_id == process.context.span_id
    for m in await stored(js, TASKS_STREAM):
        task = Task.from_wire(m.data)
        carried = remote_span_context(m.headers)
        assert carried is not None and carried.span_id == publishes[task.depth].context.span_id


async def test_json_log_lines_carry_the_trace_of_the_task_they_were_written_in(
    nats_server: NatsServer,
    etcd_server: EtcdServer,
    tmp_path: Path,
    receiver: OtlpReceiver,
    js: JetStreamContext,
) -> None:
    # A task nobody can read, sent inside a trace of ours: the worker dead-letters it inside
    # the task's span, and its JSON log line about it carries our trace id.
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    async with Mesh(nats_server.url, etcd_server.url, tmp_path) as mesh:
        worker = await mesh.start("worker", "w1", JETCRAWL_LOG_FORMAT="json", **receiver.env())
        await mesh.wait_ownership({"w1"})
        headers = {"traceparent": f"00-{trace_id}-{parent_id}-01"}
        await js.publish(task_subject(0), b"this is no task", headers=headers)

        def said() -> list[dict[str, object]]:
            lines = [
                orjson.loads(line) for line in worker.log().splitlines() if line.startswith("{")
            ]
            return [line for line in lines if "dead-lettered task" in str(line["message"])]

        async def dead_lettered() -> bool:
            return bool(said())

        await eventually(dead_lettered)
        [line] = said()
    assert (line["trace_id"], line["service"], line["instance"]) == (trace_id, "worker", "w1")
    assert isinstance(line["span_id"], str) and len(line["span_id"]) == 16
    assert line["level"] == "WARNING" and line["logger"] == "jetcrawl.worker.crawl"
    every = [orjson.loads(text) for text in worker.log().splitlines() if text.strip()]
    assert all({"time", "level", "logger", "message"} <= line.keys() for line in every)


def test_a_json_line_outside_any_span_has_no_trace_and_an_exception_has_its_traceback() -> None:
    formatter = JsonFormatter()
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.getLogger("x").makeRecord(
            "x", logging.ERROR, __file__, 1, "it failed: %s", ("here",), sys.exc_info()
        )
    line = orjson.loads(formatter.format(record))
    assert line["message"] == "it failed: here" and "trace_id" not in line
    assert "ValueError: boom" in line["exception"]
