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
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from jetcrawl.contract.deadletters import DeadLetter
from jetcrawl.contract.errors import JetcrawlError, MessageError
from jetcrawl.contract.messages import ResultHead
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import DEAD_STREAM, RESULTS_PREFIX, RESULTS_STREAM, SEEDS
from jetcrawl.local.drain import WATCHED_STREAMS, Snapshot, snapshot
from jetcrawl.local.embedded import EtcdServer, NatsServer
from jetcrawl.local.services import Launch, Prefork, Service, spawn
from jetcrawl.ops.export import Sink, open_sink
from jetcrawl.plumbing.backoff import wait_set
from jetcrawl.plumbing.bodies import BodyNotFound, BodyStore
from jetcrawl.plumbing.bus import connect
from jetcrawl.plumbing.pull import Cut, pull
from jetcrawl.plumbing.topology import ensure

log = logging.getLogger(__name__)

SNAPSHOT_EVERY_S = 0.5
# After a snapshot that shows nothing pending, unacked or queued, the one that may confirm it
# comes sooner: the crawl ends ~0.7 s earlier (the bench site, 3,000 pages). Drained is still
# two snapshots that agree, whatever their interval: work in flight is always visible in one
# (jetcrawl.local.drain).
SETTLE_CHECK_S = 0.1
# A snapshot with at most this much left (queued, in flight) means the crawl may be over by the
# next look: the next ones come SETTLE_CHECK_S apart too, for NEARLY_IDLE_FOR_S at most, so a
# crawl that keeps a small backlog for long is not asked ten times a second.
NEARLY_IDLE = 8
NEARLY_IDLE_FOR_S = 2.0
WORKERS_READY_TIMEOUT_S = 30.0
# Busy workers one nats-server core carries (the README's capacity plan: ~4,500 pages/s per core
# in a crawl, ~1,000-2,000 per worker on fast sites).
WORKERS_PER_NATS_CORE = 4
WORKERS_POLL_S = 0.05  # how often the shard owners are read until the workers share them
DEAD_REASONS_READ_MAX = 10_000
COLLECT_BATCH = 512
COLLECT_WAIT_S = 0.25
COLLECT_PAUSE_S = 0.2
PROGRESS_LOG_EVERY_S = 5.0
CHILD_STOP_TIMEOUT_S = 30.0


class CrawlFailed(JetcrawlError):
    """A service of the local crawl died or could not start."""


class Interrupted(JetcrawlError):
    """The user stopped the crawl (Ctrl-C); every service was stopped."""


class Interrupt:
    """Ctrl-C for a local crawl: the first asks for a clean stop, a second one hurries it.

    Signals set events that the crawl's loops check; nothing is cancelled, because on Python
    3.11 ``asyncio.wait_for`` (under nats-py's fetch and requests) can swallow a cancellation.
    """

    def __init__(self) -> None:
        self.requested = asyncio.Event()
        self.hurry = asyncio.Event()

    def __call__(self) -> None:
        (self.hurry if self.requested.is_set() else self.requested).set()


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


@dataclass(slots=True)
class Summary:
    results: int = 0
    duplicates: int = 0
    by_outcome: dict[str, int] = field(default_factory=dict)
    by_status_class: dict[str, int] = field(default_factory=dict)
    dead_letters: int = 0
    dead_reasons: dict[str, int] = field(default_factory=dict)  # "stage/reason" -> count
    seconds: float = 0.0

    def line(self) -> str:
        rate = self.results / self.seconds if self.seconds else 0.0
        parts = [f"crawled {self.results} URLs in {self.seconds:.1f} s ({rate:.1f}/s)"]
        if self.by_outcome:
            parts.append(", ".join(f"{k} {v}" for k, v in sorted(self.by_outcome.items())))
        if self.by_status_class:
            statuses = ", ".join(f"{k} {v}" for k, v in sorted(self.by_status_class.items()))
            parts.append(f"status {statuses}")
        dead = sum(self.dead_reasons.values()) or self.dead_letters
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(self.dead_reasons.items()))
        parts.append(f"dead letters {dead}" + (f" ({reasons})" if reasons else ""))
        parts.append(f"duplicate results {self.duplicates}")
        return "; ".join(parts)


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
        # The services start first: their start-up overlaps this command's topology check.
        # Each service ensures the topology too, and concurrent ensures agree.
        children = await stack.enter_async_context(
            _children(settings, request.workers, workdir, interrupt.hurry, prefork)
        )
        nc = await connect(settings, "jetcrawl-crawl")
        stack.push_async_callback(nc.close)
        js = nc.jetstream()
        await ensure(js, settings)
        before = {
            stream: (await js.stream_info(stream)).state.last_seq for stream in WATCHED_STREAMS
        }
        first_result = before[RESULTS_STREAM] + 1
        first_dead = before[DEAD_STREAM] + 1

        # Seeds go out once every worker holds its shards: no handover churn at the start.
        await _wait_for_workers(settings, request.workers, children, interrupt)
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
        async with asyncio.TaskGroup() as tg:
            tg.create_task(collector.follow())
            try:
                drained = await _wait_drained(
                    js, settings, children, collector.summary, started, interrupt
                )
            except (CrawlFailed, Interrupted) as e:
                failure = e
            finally:
                collector.stop()
        if failure is None:
            await collector.read_to_end()  # drained: the stream holds every result now
        if sink is not None:
            sink.close()
        if failure is not None:
            raise failure
        summary = collector.summary
        summary.dead_reasons = await _dead_reasons(js, first_dead)
        counts = ", ".join(
            f"{stream} {last - before[stream]}"
            for stream, last in zip(WATCHED_STREAMS, drained.last_seqs, strict=True)
        )
        log.info("messages stored by this crawl: %s", counts)
        summary.seconds = time.monotonic() - started
        return summary


def _seed_body(seed: str, request: CrawlRequest) -> bytes:
    obj: dict[str, object] = {"url": seed}
    if request.max_depth is not None:
        obj["max_depth"] = request.max_depth
    if request.scope is not None:
        obj["scope"] = request.scope
    if request.job is not None:
        obj["job"] = request.job
    return orjson.dumps(obj)


async def _wait_for_workers(
    settings: Settings, workers: int, children: Children, interrupt: Interrupt
) -> None:
    """Until the workers own every shard between them, balanced (bounded: then go anyway)."""
    from jetcrawl.registry import read_ownership
    from jetcrawl.registry.etcd import Etcd

    deadline = time.monotonic() + WORKERS_READY_TIMEOUT_S
    async with Etcd(settings.etcd_url, settings.etcd_timeout_s) as etcd:
        while time.monotonic() < deadline:
            if interrupt.requested.is_set():
                raise Interrupted("interrupted before the crawl started")
            children.check()
            owners = list((await read_ownership(settings, etcd)).values())
            counts = [owners.count(owner) for owner in set(owners)]
            balanced = bool(counts) and max(counts) - min(counts) <= 1
            if len(owners) == settings.shards and len(counts) >= workers and balanced:
                return
            await wait_set(interrupt.requested, WORKERS_POLL_S)
    log.warning(
        "workers did not share the shards within %.0f s; seeding anyway", WORKERS_READY_TIMEOUT_S
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

    A topology on our own nats-server has ``local_shards`` shards, if given. Shards are how
    ownership moves between workers that come and go; a local crawl's workers are fixed, so one
    shard each is all it needs, and every further shard costs a consumer to create, an idle
    pull loop and requests in each drain check: the bench crawls ~10% faster on ~10% less CPU
    with 2 shards than with 64.

    At the end the servers are killed, not stopped: their stores go with the workdir, and an
    orderly stop of nats-server (writing each stream's and consumer's state) takes ~0.7 s.

    Both are sized to the crawl (``GOMAXPROCS``, unless the environment sets it): nats-server
    gets a Go thread per ``WORKERS_PER_NATS_CORE`` workers, etcd (membership only) one. Go's
    default, a thread per core, spins idle threads looking for work: on the bench's 2 cores one
    thread cut nats-server's CPU per page by about a quarter and etcd's by a third, with pages/s
    unchanged (README, Performance).
    """
    changes: dict[str, Any] = {}
    if settings.nats_url == Settings().nats_url:
        nats_server = NatsServer(workdir / "nats", threads=nats_threads(workers))
        await nats_server.start()
        stack.push_async_callback(nats_server.kill)
        changes["nats_url"] = nats_server.url
        if local_shards is not None:
            changes["shards"] = local_shards
        log.info("started nats-server at %s", nats_server.url)
    if settings.etcd_url == Settings().etcd_url:
        etcd = EtcdServer(workdir / "etcd", threads=1)
        await etcd.start()
        stack.push_async_callback(etcd.kill)
        changes["etcd_url"] = etcd.url
        log.info("started etcd at %s", etcd.url)
    return settings.replace(**changes)


@dataclass(slots=True)
class Children:
    """The services of this crawl: forked ones where ``prefork`` has them, else spawned."""

    prefork: Prefork | None = None
    procs: list[Service] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def check(self) -> None:
        for proc, log_path in zip(self.procs, self.logs, strict=True):
            if proc.returncode is not None:
                raise CrawlFailed(
                    f"{log_path.stem} exited early with code {proc.returncode}; "
                    f"its log ends:\n{_tail(log_path)}"
                )

    async def start(self, launch: Launch) -> None:
        if self.prefork is not None and self.prefork.waiting(launch.role):
            self.procs.append(self.prefork.launch(launch))
        else:
            self.procs.append(await spawn(launch))
        self.logs.append(launch.log_path)


@asynccontextmanager
async def _children(
    settings: Settings,
    workers: int,
    workdir: Path,
    hurry: asyncio.Event,
    prefork: Prefork | None,
) -> AsyncIterator[Children]:
    env = {**os.environ, **settings.to_env()}
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
    base = ("--log-level", str(level))
    children = Children(prefork)
    try:
        await children.start(
            Launch("dispatcher", (*base, "dispatcher"), env, workdir / "dispatcher.log")
        )
        for n in range(workers):
            worker_env = {**env, "JETCRAWL_WORKER_ID": f"local-{n + 1}"}
            if settings.metrics_port:  # an endpoint each: the dispatcher's port, then the next
                worker_env["JETCRAWL_METRICS_PORT"] = str(settings.metrics_port + n + 1)
            log_path = workdir / f"worker-{n + 1}.log"
            await children.start(Launch("worker", (*base, "worker"), worker_env, log_path))
        yield children
    finally:
        await _stop_all(children.procs, hurry)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


async def _stop_all(procs: Sequence[Service], hurry: asyncio.Event) -> None:
    """SIGTERM every service and wait; SIGKILL what is left after the timeout or on ``hurry``."""
    for proc in procs:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
    loop = asyncio.get_running_loop()
    exits = [asyncio.ensure_future(proc.wait()) for proc in procs]
    hurried = asyncio.ensure_future(hurry.wait())
    deadline = loop.time() + CHILD_STOP_TIMEOUT_S
    try:
        while (running := [e for e in exits if not e.done()]) and not hurried.done():
            if loop.time() >= deadline:
                break
            await asyncio.wait(
                [*running, hurried],
                timeout=deadline - loop.time(),
                return_when=asyncio.FIRST_COMPLETED,
            )
    finally:
        hurried.cancel()
    for proc in procs:
        if proc.returncode is None:
            log.warning("pid %d did not stop in time; killing it", proc.pid)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
    await asyncio.gather(*exits)


@contextlib.contextmanager
def _open_output(path: Path | None) -> Iterator[IO[bytes] | None]:
    if path is None:
        yield None
        return
    with open(path, "wb") as f:
        yield f


class ResultCollector:
    """Follows CRAWL_RESULTS from a start sequence; writes each URL's first record once."""

    def __init__(
        self, js: JetStreamContext, first: int, sink: Sink | None, bodies: BodyStore | None
    ) -> None:
        self._js = js
        self._first = first
        self._sink = sink
        self._bodies = bodies
        self._sub: JetStreamContext.PullSubscription | None = None
        self._last_seq = first - 1
        self._seen: set[str] = set()
        self._stopping = asyncio.Event()
        self._cut = Cut()  # stop(): follow()'s pull in progress returns at once
        self.summary = Summary()

    async def open(self) -> None:
        self._sub = await self._js.pull_subscribe(
            f"{RESULTS_PREFIX}*",
            stream=RESULTS_STREAM,
            config=ConsumerConfig(
                ack_policy=AckPolicy.NONE,
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                opt_start_seq=self._first,
                filter_subject=f"{RESULTS_PREFIX}*",
                mem_storage=True,
                inactive_threshold=60.0,
            ),
        )

    async def close(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(NatsError):
                await self._sub.unsubscribe()

    async def follow(self) -> None:
        """Keep reading as results arrive, until ``stop()``."""
        while not self._stopping.is_set():
            if await self._read_batch(self._cut) < COLLECT_BATCH:
                # Let results gather: fewer, larger fetches cost the command far less CPU.
                await wait_set(self._stopping, COLLECT_PAUSE_S)

    def stop(self) -> None:
        self._stopping.set()
        self._cut.set()

    async def read_to_end(self) -> None:
        """Read up to the stream's last record (call once the crawl is drained)."""
        end = (await self._js.stream_info(RESULTS_STREAM)).state.last_seq
        while self._last_seq < end:
            await self._read_batch()

    async def _read_batch(self, cut: Cut | None = None) -> int:
        assert self._sub is not None, "open() first"
        try:
            msgs = await pull(self._sub, COLLECT_BATCH, COLLECT_WAIT_S, cut)
        except TimeoutError:
            return 0
        for msg in msgs:
            await self._record(msg.data)
        if msgs:  # parsing one reply subject is enough: they come in stream order
            self._last_seq = msgs[-1].metadata.sequence.stream
        return len(msgs)

    async def _record(self, data: bytes) -> None:
        # Only the few fields read here are checked and taken: building the whole Result was a
        # third of this command's CPU, and the JSON lines sink writes the record as it came.
        head = ResultHead.from_wire(data)
        if head.fp in self._seen:
            self.summary.duplicates += 1
            return
        self._seen.add(head.fp)
        summary = self.summary
        summary.results += 1
        summary.by_outcome[head.outcome] = summary.by_outcome.get(head.outcome, 0) + 1
        if head.status is not None:
            key = f"{head.status // 100}xx"
            summary.by_status_class[key] = summary.by_status_class.get(key, 0) + 1
        if self._sink is None:
            return
        bodies = self._bodies if self._sink.needs_bodies else None
        result = head.record() if self._sink.needs_records or bodies is not None else None
        body = None
        if bodies is not None and result is not None and result.body_ref:
            try:
                body = await bodies.get(result.body_ref)
            except BodyNotFound:
                log.warning("body %s of %s is gone", result.body_ref, result.url)
        self._sink.write(result, data, body)


async def _wait_drained(
    js: JetStreamContext,
    settings: Settings,
    children: Children,
    summary: Summary,
    started: float,
    interrupt: Interrupt,
) -> Snapshot:
    """The snapshot that shows the crawl drained."""
    progress = Progress(sys.stderr)
    previous: Snapshot | None = None
    cadence = Cadence()
    try:
        while True:
            # Checked before the services: on Ctrl-C a terminal signals them too, and their
            # exit is then no failure.
            if interrupt.requested.is_set():
                raise Interrupted("interrupted")
            children.check()
            current = await snapshot(js, settings.shards, previous)
            summary.dead_letters = current.dead
            progress.show(current, summary, time.monotonic() - started)
            if current.settled_after(previous):
                return current
            previous = current
            await wait_set(interrupt.requested, cadence.next_in(current, time.monotonic()))
    finally:
        progress.done()


class Cadence:
    """How long until the next snapshot of a crawl that is not drained yet."""

    def __init__(self) -> None:
        self._nearly_idle_since: float | None = None

    def next_in(self, snap: Snapshot, now: float) -> float:
        if snap.idle:
            return SETTLE_CHECK_S
        if snap.frontier_backlog + snap.task_backlog > NEARLY_IDLE:
            self._nearly_idle_since = None
            return SNAPSHOT_EVERY_S
        if self._nearly_idle_since is None:
            self._nearly_idle_since = now
        if now - self._nearly_idle_since < NEARLY_IDLE_FOR_S:
            return SETTLE_CHECK_S
        return SNAPSHOT_EVERY_S


class Progress:
    """One updating line on a terminal; a log line every few seconds otherwise."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._last_log = 0.0

    def show(self, snap: Snapshot, summary: Summary, elapsed: float) -> None:
        rate = summary.results / elapsed if elapsed > 0 else 0.0
        errors = summary.by_outcome.get("failed", 0)
        text = (
            f"pages {summary.results}  backlog {snap.task_backlog + snap.frontier_backlog}  "
            f"rate {rate:.1f}/s  errors {errors}  dead {snap.dead}"
        )
        if self._tty:
            self._stream.write(f"\r\x1b[K{text}")
            self._stream.flush()
        elif elapsed - self._last_log >= PROGRESS_LOG_EVERY_S:
            self._last_log = elapsed
            log.info("progress: %s", text)

    def done(self) -> None:
        if self._tty:
            self._stream.write("\n")
            self._stream.flush()
