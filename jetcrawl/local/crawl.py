"""``jetcrawl crawl``: a whole crawl on one machine.

Starts nats-server and etcd from their wheels in a temporary directory (unless URLs of running
ones are given), creates the topology, publishes the seeds, runs one dispatcher and N worker
processes (``jetcrawl dispatcher|worker``, the very services compose runs, forked from this
command or started as new interpreters: :mod:`jetcrawl.local.services`), streams the
results into the output file as they arrive, shows progress, and stops when the crawl is drained
(:mod:`jetcrawl.local.drain`). Every child is stopped on the way out, on success, error or Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from jetcrawl.contract.deadletters import DeadLetter
from jetcrawl.contract.errors import JetcrawlError, MessageError, SettingsError
from jetcrawl.contract.fetchpolicy import FetchPolicy
from jetcrawl.contract.messages import WorkerReport
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import DEAD_STREAM, RESULTS_STREAM, SEEDS, tasks_streams
from jetcrawl.local.children import Children, CrawlFailed, start_children
from jetcrawl.local.collector import ResultCollector
from jetcrawl.local.drain import WATCHED_STREAMS, Cadence, Snapshot, snapshot
from jetcrawl.local.embedded import EtcdServer, NatsServer
from jetcrawl.local.interrupt import Interrupt, Interrupted
from jetcrawl.local.progress import Progress, State
from jetcrawl.local.services import Prefork
from jetcrawl.local.summary import Summary
from jetcrawl.ops.export import open_sink
from jetcrawl.ops.status import read_reports
from jetcrawl.plumbing.backoff import wait_set
from jetcrawl.plumbing.bodies import BodyStore
from jetcrawl.plumbing.bus import connect
from jetcrawl.plumbing.topology import ensure

__all__ = ["CrawlFailed", "CrawlRequest", "Interrupt", "Interrupted", "Summary", "crawl"]

log = logging.getLogger(__name__)

WORKERS_READY_TIMEOUT_S = 30.0
RENDERER_READY_TIMEOUT_S = 60.0  # Chromium's first launch can be slow on a busy machine
# Busy workers one nats-server core carries (the capacity plan in bench/RESULTS.md).
WORKERS_PER_NATS_CORE = 4
WORKERS_POLL_S = 0.05  # how often the shard owners are read until the workers share them
DEAD_REASONS_READ_MAX = 10_000
REPORTS_EVERY_S = 1.0  # the workers' reports, for the progress: read this often at most


@dataclass(frozen=True, slots=True)
class CrawlRequest:
    seeds: tuple[str, ...]
    workers: int
    output: Path | None
    format: str = "jsonl"  # of the output: "jsonl" or "warc"
    max_depth: int | None = None
    scope: str | None = None
    job: str | None = None
    # The shard count when the crawl starts its own nats-server and none was asked for: one
    # per worker (see _servers).
    local_shards: int | None = None


async def crawl(
    settings: Settings,
    request: CrawlRequest,
    interrupt: Interrupt | None = None,
    prefork: Prefork | None = None,
) -> Summary:
    """Run the crawl to the end; raises :class:`Interrupted` or :class:`CrawlFailed`.

    The services are ``prefork``'s where it has them (forked before this loop started, see
    :mod:`jetcrawl.local.services`), else new processes.
    """
    interrupt = interrupt or Interrupt()
    started = time.monotonic()
    if request.format == "warc":
        settings = settings.replace(store_bodies=True)  # WARC responses carry the bodies
    async with AsyncExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="jetcrawl-")))
        settings = await _servers(stack, settings, workdir, request.local_shards, request.workers)
        # NATS and etcd answer before any service starts: a wrong --nats or --etcd fails in
        # seconds, alone, naming the URL.
        nc = await interrupt.unless_requested(
            connect(settings, "jetcrawl-crawl", give_up_s=settings.command_timeout_s)
        )
        stack.push_async_callback(nc.close)
        await interrupt.unless_requested(_etcd_answers(settings))
        js = nc.jetstream()
        # The services start before the topology check: their start-up overlaps it. Each
        # service ensures the topology too, and concurrent ensures agree.
        children = await stack.enter_async_context(
            start_children(settings, request.workers, workdir, interrupt.hurry, prefork)
        )
        await interrupt.unless_requested(ensure(js, settings))
        counted = [*WATCHED_STREAMS, *tasks_streams(settings.partitions)]  # as a snapshot's
        before = {stream: (await js.stream_info(stream)).state.last_seq for stream in counted}
        first_result = before[RESULTS_STREAM] + 1
        first_dead = before[DEAD_STREAM] + 1

        # Seeds go out once every worker holds its shards: no handover churn at the start.
        await _wait_for_workers(settings, request.workers, children, interrupt)
        if FetchPolicy.from_settings(settings).may_render:
            await _wait_for_renderer(nc, settings, children, interrupt)
        for seed in request.seeds:
            await js.publish(SEEDS, _seed_body(seed, request))
        output = stack.enter_context(_open_output(request.output))
        sink = None
        if output is not None:
            gzip = request.output is not None and request.output.name.endswith(".gz")
            sink = open_sink(output, request.format, gzip=gzip, user_agent=settings.user_agent)
        collector = ResultCollector(js, first_result, sink, await BodyStore.open(js))
        await collector.open()
        stack.push_async_callback(collector.close)
        failure: JetcrawlError | None = None
        progress = Progress(sys.stderr, settings.progress_log_every_s)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(collector.follow())
            try:
                drained = await _wait_drained(
                    js, settings, children, collector.summary, started, interrupt, progress
                )
            except (CrawlFailed, Interrupted) as e:
                failure = e
                progress.done()
            except BaseException:
                progress.done()
                raise
            finally:
                collector.stop()
        if failure is None:
            try:
                await collector.read_to_end()  # drained: the stream holds every result now
                # the last frame counts every result, not what the collector had at the drain
                elapsed = time.monotonic() - started
                progress.show(State(drained, collector.summary, elapsed, (), time.time()))
            finally:
                progress.done()
        if sink is not None:
            sink.close()
        if failure is not None:
            raise failure
        summary = collector.summary
        summary.dead_reasons = await _dead_reasons(js, first_dead)
        counts = ", ".join(
            f"{stream} {last - before[stream]}"
            for stream, last in zip(counted, drained.last_seqs, strict=True)
        )
        log.info("messages stored by this crawl: %s", counts)
        summary.restarts = children.restarted
        summary.seconds = time.monotonic() - started
        return summary


async def _etcd_answers(settings: Settings) -> None:
    from jetcrawl.registry import read_members

    await read_members(settings.replace(etcd_timeout_s=settings.command_timeout_s))


def _seed_body(seed: str, request: CrawlRequest) -> bytes:
    """The seed as crawl.seeds takes it; a seed given as a JSON object keeps its own fields."""
    obj: dict[str, object] = orjson.loads(seed) if seed.startswith("{") else {"url": seed}
    own = set(obj)
    for name, value in (
        ("max_depth", request.max_depth),
        ("scope", request.scope),
        ("job", request.job),
    ):
        if value is not None and name not in own:
            obj[name] = value
    return orjson.dumps(obj)


async def _wait_for_workers(
    settings: Settings, workers: int, children: Children, interrupt: Interrupt
) -> None:
    """Until the workers own every shard between them, balanced (bounded: then go anyway)."""
    from jetcrawl.registry import read_ownership
    from jetcrawl.registry.etcd import Etcd

    deadline = time.monotonic() + WORKERS_READY_TIMEOUT_S
    async with Etcd.from_settings(settings) as etcd:
        while time.monotonic() < deadline:
            if interrupt.requested.is_set():
                raise Interrupted("interrupted before the crawl started")
            await children.supervise()
            owners = list((await read_ownership(settings, etcd)).values())
            counts = [owners.count(owner) for owner in set(owners)]
            balanced = bool(counts) and max(counts) - min(counts) <= 1
            if len(owners) == settings.shards and len(counts) >= workers and balanced:
                return
            await wait_set(interrupt.requested, WORKERS_POLL_S)
    log.warning(
        "workers did not share the shards within %.0f s; seeding anyway", WORKERS_READY_TIMEOUT_S
    )


async def _wait_for_renderer(
    nc: NATS, settings: Settings, children: Children, interrupt: Interrupt
) -> None:
    """Until the renderer answers (Chromium launched): the first pages need it."""
    from jetcrawl.worker.render import RenderClient

    client = RenderClient(nc, settings.render_timeout_s)
    deadline = time.monotonic() + RENDERER_READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if interrupt.requested.is_set():
            raise Interrupted("interrupted before the crawl started")
        await children.supervise()
        if await client.answers():
            return
        await wait_set(interrupt.requested, WORKERS_POLL_S)
    log.warning(
        "the renderer did not answer within %.0f s; seeding anyway", RENDERER_READY_TIMEOUT_S
    )


async def _dead_reasons(js: JetStreamContext, first: int) -> dict[str, int]:
    """How many dead letters this crawl made, by stage and reason."""
    reasons: dict[str, int] = {}
    info = await js.stream_info(DEAD_STREAM)
    for seq in range(max(first, info.state.first_seq), info.state.last_seq + 1):
        if seq - first >= DEAD_REASONS_READ_MAX:
            reasons["(more not read)"] = info.state.last_seq - seq + 1
            break
        try:
            letter = DeadLetter.from_wire((await js.get_msg(DEAD_STREAM, seq)).data or b"")
        except (NotFoundError, MessageError):
            continue
        key = f"{letter.stage}/{letter.reason}"
        reasons[key] = reasons.get(key, 0) + 1
    return reasons


def nats_threads(workers: int, cores: int | None = None) -> int:
    """Go threads for the crawl's own nats-server: a core per ``WORKERS_PER_NATS_CORE`` workers,
    at most the machine's cores."""
    cores = cores or os.cpu_count() or 1
    return max(1, min(cores, math.ceil(workers / WORKERS_PER_NATS_CORE)))


async def _servers(
    stack: AsyncExitStack,
    settings: Settings,
    workdir: Path,
    local_shards: int | None,
    workers: int,
) -> Settings:
    """Start the servers the settings leave at their defaults, in the throwaway ``workdir``.

    A topology on our own nats-server has ``local_shards`` shards, if given: shards are how
    ownership moves between workers that come and go, and a local crawl's workers are fixed,
    while every further shard costs a consumer, an idle pull loop and requests in each drain
    check. At the end the servers are killed, not stopped: their stores go with the workdir.
    Both are sized to the crawl (``GOMAXPROCS``, unless the environment sets it): Go's default,
    a thread per core, spins idle threads (the readings are in bench/RESULTS.md).
    """
    changes: dict[str, Any] = {}
    if settings.nats_url == Settings().nats_url:
        if local_shards is not None:
            try:  # what the shard count refuses (partitions) is refused before anything starts
                settings = settings.replace(shards=local_shards)
            except SettingsError as e:
                hint = "a local crawl has a shard per worker: --workers N, or --shards N"
                raise SettingsError(e.name, f"{e.problem} ({hint})") from None
        nats_server = NatsServer(workdir / "nats", threads=nats_threads(workers))
        await nats_server.start()
        stack.push_async_callback(nats_server.kill)
        changes["nats_url"] = nats_server.url
        log.info("started nats-server at %s", nats_server.url)
    if settings.etcd_url == Settings().etcd_url:
        etcd = EtcdServer(workdir / "etcd", threads=1)
        await etcd.start()
        stack.push_async_callback(etcd.kill)
        changes["etcd_url"] = etcd.url
        log.info("started etcd at %s", etcd.url)
    return settings.replace(**changes)


@contextlib.contextmanager
def _open_output(path: Path | None) -> Iterator[IO[bytes] | None]:
    if path is None:
        yield None
        return
    with open(path, "wb") as f:
        yield f


async def _wait_drained(
    js: JetStreamContext,
    settings: Settings,
    children: Children,
    summary: Summary,
    started: float,
    interrupt: Interrupt,
    progress: Progress,
) -> Snapshot:
    """The snapshot that shows the crawl drained (``progress`` shown meanwhile; the caller
    ends it)."""
    previous: Snapshot | None = None
    cadence = Cadence()
    reports: tuple[WorkerReport, ...] = ()
    reports_read = -math.inf
    while True:
        # Checked before the services: on Ctrl-C a terminal signals them too, and their
        # exit is then no failure.
        if interrupt.requested.is_set():
            raise Interrupted("interrupted")
        await children.supervise()
        current = await snapshot(js, settings.shards, previous)
        summary.dead_letters = current.dead
        if time.monotonic() - reports_read >= REPORTS_EVERY_S:
            reports, reports_read = await read_reports(js), time.monotonic()
        elapsed = time.monotonic() - started
        progress.show(State(current, summary, elapsed, reports, time.time()))
        if current.settled_after(previous):
            return current
        previous = current
        await wait_set(interrupt.requested, cadence.next_in(current, time.monotonic()))
