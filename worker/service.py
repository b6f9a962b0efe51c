"""The worker: owns shards handed to it by the registry and crawls their tasks.

It implements the registry's ``ShardOwner`` protocol: ``on_acquired`` starts a pull loop for the
shard, ``on_revoke`` stops it and waits for its in-flight tasks (under ``drain_deadline_s``), and
``on_lease_lost`` stops every pull loop at once. All pull loops, and the keepalive loop that
sends in-progress acks for the tasks they hold, are tasks of the TaskGroup that ``run()`` holds
open, so nothing outlives the worker.

Which of a shard's lanes (priority level, job) it takes from is :mod:`jetcrawl.worker.lanes`,
from a board of every lane's tasks that one poll of the task streams keeps; job run states come
from the watch of KV ``crawl_control``, and a paused job's held tasks are parked
(:mod:`jetcrawl.worker.parking`).

Two limits, shared by every shard: ``concurrency`` fetches in flight (a task takes a fetch slot
only for its host's turn, :mod:`jetcrawl.worker.politeness`), and ``concurrency`` plus a waiting
room sized to the worker's pace (:mod:`jetcrawl.worker.capacity`) tasks held (pulled and not yet
acked: in flight, reading robots.txt or waiting for their host).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from functools import partial

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from jetcrawl.contract.messages import WorkerReport
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import VALIDATORS_BUCKET, WORKERS_BUCKET, tasks_streams
from jetcrawl.otel import NO_TRACING, Tracing
from jetcrawl.plumbing.backoff import wait_set
from jetcrawl.plumbing.bodies import BodyStore
from jetcrawl.plumbing.bus import Outbox, connect
from jetcrawl.plumbing.control import ControlWatch
from jetcrawl.plumbing.metrics import WorkerMetrics
from jetcrawl.plumbing.specs import SpecWatch
from jetcrawl.plumbing.topology import ensure
from jetcrawl.worker.capacity import Capacity, room_for
from jetcrawl.worker.crawl import CrawlStats, TaskProcessor
from jetcrawl.worker.fetcher import Fetcher
from jetcrawl.worker.jobs import Jobs
from jetcrawl.worker.keepalive import KeepAlive
from jetcrawl.worker.lanes import JobRates, LaneBoard
from jetcrawl.worker.outcome import Ownership
from jetcrawl.worker.pages import PageFetcher
from jetcrawl.worker.parking import Parking
from jetcrawl.worker.politeness import Politeness
from jetcrawl.worker.render import RenderClient
from jetcrawl.worker.report import Reporter, wall_time
from jetcrawl.worker.robots import Robots
from jetcrawl.worker.shards import JobTerms, ShardPuller
from jetcrawl.worker.telemetry import TaskTelemetry
from jetcrawl.worker.validators import Validators

log = logging.getLogger(__name__)

WAITING_ON_REPORTED = 5  # the longest waits a report names
# How often the waiting room follows the worker's pace: a crawl's first half second decides how
# soon the tasks deep in its lanes (a slow host's, behind the fast hosts') are in hand.
ROOM_EVERY_S = 0.1
PACE_FALL = 0.05  # a slower pace weighs this much at each look; a faster one is taken at once


class Worker:
    """Async context manager (connections); ``run()`` crawls until ``stop()``."""

    def __init__(
        self,
        settings: Settings,
        worker_id: str,
        tracing: Tracing = NO_TRACING,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        # identity and configuration
        self._settings = settings
        self.worker_id = worker_id
        # spans and metrics
        self._tracing = tracing
        self._telemetry = TaskTelemetry(tracing, metrics)  # None: nothing observed
        # connections and components, set by start()
        self._resources = AsyncExitStack()
        self._nc: NATS | None = None
        self._js: JetStreamContext | None = None
        self._processor: TaskProcessor | None = None
        self._reporter: Reporter | None = None  # with report_interval_s
        self.specs: SpecWatch | None = None  # the job specs, as KV crawl_specs last showed them
        self._jobs: Jobs | None = None  # the specs compiled: extraction, plugins
        self.control: ControlWatch | None = None  # job run states, as KV crawl_control shows
        self._board: LaneBoard | None = None  # the tasks of every lane
        self._rates = JobRates()  # what shards take in of capped jobs
        self._fetch_rates = JobRates(burst_s=0.0)  # what is fetched of them: no bursts
        # shards, limits and politeness
        self._capacity = Capacity(settings.concurrency)  # fetches in flight
        self._holding = Capacity(settings.concurrency + room_for(settings, 0.0))  # tasks held
        self._keepalive = KeepAlive(settings.ack_wait_s)
        self.politeness = Politeness(settings, self._capacity, self._holding)
        self._parking: Parking | None = None
        self._pullers: dict[int, tuple[ShardPuller, asyncio.Task[None]]] = {}
        self._pulling: set[asyncio.Task[None]] = set()  # every pull loop's task, until it ends
        self._tg: asyncio.TaskGroup | None = None
        # lifecycle
        self._running = asyncio.Event()
        self._stopping = asyncio.Event()
        self._closed = False

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        self._nc = await connect(self._settings, f"jetcrawl-worker-{self.worker_id}")
        self._resources.push_async_callback(self._nc.close)
        self._js = self._nc.jetstream()
        await ensure(self._js, self._settings)
        fetcher = await self._resources.enter_async_context(Fetcher(self._settings))
        robots = Robots(self._settings, fetcher)
        self.specs = SpecWatch(self._js)
        self._jobs = Jobs(self.specs.current)
        self.control = ControlWatch(self._js)
        self._parking = Parking(self.control, self._holding)
        self._board = LaneBoard(
            self._js, self._settings.lanes_poll_s, tasks_streams(self._settings.partitions)
        )
        self._processor = TaskProcessor(
            self._settings,
            self.worker_id,
            Outbox(
                self._nc,
                tracer=self._tracing.tracer,
                linger_s=self._settings.publish_linger_s,
                propagate=self._tracing.enabled,
            ),
            fetcher,
            robots,
            self.politeness,
            self._telemetry,
            bodies=await BodyStore.open(self._js) if self._settings.store_bodies else None,
            pages=PageFetcher(
                self._settings,
                fetcher,
                RenderClient(self._nc, self._settings.render_timeout_s),
                job_policy=self._jobs.fetch_policy,
            ),
            # re-crawls come with recrawl_after_s, or with a job spec's own
            validators=Validators(await self._js.key_value(VALIDATORS_BUCKET)),
            jobs=self._jobs,
            control=(self.control, self._parking),
            paced=self._paced,
        )
        if self._settings.report_interval_s > 0:
            self._reporter = Reporter(
                await self._js.key_value(WORKERS_BUCKET),
                self.worker_id,
                self._settings.report_interval_s,
                self.report,
            )

    async def run(self) -> None:
        """Hold the TaskGroup of all pull loops until ``stop()``, then drain them."""
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            keepalive = tg.create_task(self._keepalive.run())
            reporting = tg.create_task(self._reporter.run()) if self._reporter else None
            assert self.specs is not None and self._jobs is not None, "start() first"
            assert self.control is not None and self._board is not None
            tg.create_task(self.specs.run(self._stopping))
            tg.create_task(self.control.run(self._stopping))
            tg.create_task(self._board.run(self._stopping))
            if not self._settings.buffer_max:
                tg.create_task(self._pace_room())
            await self.specs.wait_ready()  # no task is crawled without its job's spec
            await self.control.wait_ready()  # nor a paused job's
            following = tg.create_task(self._follow_control(self.control))
            self._jobs.compile_all(self.specs.jobs())  # plugins refused now, not at a page
            self._running.set()
            await self._stopping.wait()
            following.cancel()
            for puller, _ in self._pullers.values():
                puller.stop()
            if self._parking is not None:
                self._parking.leave()  # parked tasks are handed back
            if self._pulling:
                await asyncio.wait(self._pulling)  # what they hold is finished or handed back
            keepalive.cancel()
            if reporting is not None and self._reporter is not None:
                reporting.cancel()
                await self._reporter.report()  # the hand-backs it leaves due
        self._tg = None

    async def _pace_room(self) -> None:
        """Size the waiting room to the worker's pace (:func:`room_for`) until ``stop()``: the
        tasks it finishes, not the places freed (a hand-back frees one, and the room it makes
        must not grow the room)."""
        pace = 0.0
        finished, at = self.stats.tasks, time.monotonic()
        while not await wait_set(self._stopping, ROOM_EVERY_S):
            now = time.monotonic()
            latest = (self.stats.tasks - finished) / (now - at)
            finished, at = self.stats.tasks, now
            pace = max(latest, (1 - PACE_FALL) * pace + PACE_FALL * latest)
            self._holding.resize(self._settings.concurrency + room_for(self._settings, pace))

    async def _follow_control(self, control: ControlWatch) -> None:
        """Wake every shard's puller when a job's state changes (a resumed job's lanes)."""
        while True:
            seen = control.changes
            await control.wait_for(partial(_changed_since, control, seen))
            for puller, _ in self._pullers.values():
                puller.wake()

    def _weight(self, job: str) -> int:
        stored = self.specs.current(job) if self.specs is not None else None
        return 1 if stored is None else stored.spec.priority.weight

    def _rate(self, job: str) -> float | None:
        """``job``'s pages per second here: its cap, shared by its tasks on the shards owned."""
        stored = self.specs.current(job) if self.specs is not None else None
        cap = None if stored is None else stored.spec.max_pages_per_s
        if cap is None or self._board is None:
            return cap
        total = self._board.job_total(job)
        return cap if total == 0 else cap * self._board.job_on(job, self._pullers) / total

    async def _paced(self, job: str) -> None:
        """Until ``job`` may fetch a page here under its rate cap (at once without one)."""
        if self._rate(job) is not None:
            await self._fetch_rates.acquire(job, partial(self._rate, job))

    def fence_on(self, holds_lease: Callable[[], bool]) -> None:
        """Start no fetch unless ``holds_lease()`` (the registry's local lease deadline)."""
        assert self._processor is not None, "start() first"
        self._processor.holds_lease = holds_lease

    async def wait_running(self) -> None:
        await self._running.wait()

    def stop(self) -> None:
        self._stopping.set()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.stop()
        await self._resources.aclose()

    @property
    def nc(self) -> NATS:
        assert self._nc is not None, "start() first"
        return self._nc

    @property
    def stats(self) -> CrawlStats:
        assert self._processor is not None
        return self._processor.stats

    @property
    def shards(self) -> frozenset[int]:
        return frozenset(self._pullers)

    @property
    def in_flight(self) -> int:
        """Fetches running now (at most ``concurrency``)."""
        return self._capacity.in_flight

    @property
    def room(self) -> int:
        """Tasks the worker holds now beside its fetch slots, at most (its waiting room)."""
        return self._holding.limit - self._settings.concurrency

    @property
    def held(self) -> int:
        """Tasks pulled and not yet acked: waiting for their host, fetching, or being stored."""
        return self._holding.in_flight

    @property
    def handbacks_due(self) -> tuple[int, float | None]:
        """Hand-backs still due, and the unix time the furthest of them is due."""
        due, furthest = self.politeness.handed_back()
        return due, None if furthest is None else wall_time(furthest)

    async def report_now(self) -> None:
        """Write this worker's report now, not at the next interval."""
        if self._reporter is not None:
            await self._reporter.report()

    def report(self) -> WorkerReport:
        due, furthest = self.handbacks_due
        return WorkerReport(
            worker=self.worker_id,
            at=time.time(),
            held=self.held,
            waiting=self.politeness.waiting,
            handed_back=self.politeness.deferred,
            handbacks_due=due,
            furthest_due_at=furthest,
            hosts_waiting=self.politeness.hosts_waiting,
            hosts_paused=self.politeness.hosts_paused(),
            waiting_on=self._processor.waiting_on(WAITING_ON_REPORTED) if self._processor else (),
            jobs=self._processor.tally.read() if self._processor else {},
        )

    # ------------------------------------------------------------------ ShardOwner

    async def on_acquired(self, shard: int, fence: int) -> None:
        await self._running.wait()
        assert self._js is not None and self._processor is not None and self._tg is not None
        if shard in self._pullers or self._stopping.is_set():
            return
        assert self.control is not None and self._board is not None and self._parking is not None
        self.politeness.handover(shard)
        self._parking.arrive(shard)
        puller = ShardPuller(
            Ownership(shard, fence),
            self._js,
            self._settings,
            (self._board, self.control, self._rates, JobTerms(self._weight, self._rate)),
            self._holding,
            self._keepalive,
            self._processor.process,
        )
        task = self._tg.create_task(puller.run())
        self._pulling.add(task)
        task.add_done_callback(self._pulling.discard)
        self._pullers[shard] = (puller, task)
        log.info("worker %s owns shard %d (fence %d)", self.worker_id, shard, fence)

    async def on_revoke(self, shard: int) -> None:
        entry = self._pullers.pop(shard, None)
        if entry is None:
            return
        puller, task = entry
        puller.stop()
        if self._parking is not None:
            self._parking.leave(shard)
        if not await wait_set(puller.done, self._settings.drain_deadline_s):
            log.warning(
                "shard %d did not drain in %.0f s; cancelling",
                shard,
                self._settings.drain_deadline_s,
            )
            task.cancel()
            await puller.done.wait()
        log.info("worker %s released shard %d", self.worker_id, shard)

    async def on_lease_lost(self) -> None:
        log.warning("worker %s lost its lease: stopping all pulls", self.worker_id)
        for puller, _ in self._pullers.values():
            puller.abandon()
        if self._parking is not None:
            self._parking.leave()
        self.politeness.wake_all()  # tasks waiting for their host's turn see the abandon
        self._pullers.clear()


def _changed_since(control: ControlWatch, seen: int) -> bool:
    return control.changes != seen
