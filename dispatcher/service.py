"""The dispatcher: frontier messages in, sharded tasks out.

One batch at a time: pull up to ``dispatch_batch`` messages from the shared ``dispatch`` consumer,
read each (:mod:`jetcrawl.dispatcher.intake`), mark new URLs seen
(:mod:`jetcrawl.dispatcher.seen`), publish their tasks with ``Nats-Msg-Id`` = fingerprint and every
rejection as a dead letter — all pipelined — and ack a frontier message only once JetStream has
acknowledged everything it produced. A message whose publishes failed is nak'ed and comes back.

Crash recovery: a seen mark records the sequence of the frontier message that admitted it. When a
message is redelivered, the tasks of marks that carry its sequence are published again; copies that
did get through the first time are dropped by JetStream's duplicate window.

A redelivery is known by its delivery count, and also by this dispatcher's own memory of the
messages it began and did not finish: a clustered consumer replicates its delivery counts after it
delivers, so a new consumer leader (after a quorum loss) can deliver again with a count of 1 what
the old leader had delivered. Taken for a first delivery, such a message's links would have been
dropped as duplicates of the marks it had made itself, and their tasks never published. (Delivered
so to another dispatcher, whose cache does not know those marks, the same can still happen.)

Job specs: the dispatcher watches KV ``crawl_specs`` (:mod:`jetcrawl.plumbing.specs`), stores the
specs seeds carry inline before it admits them, and drops the links a job's spec does not follow
(:mod:`jetcrawl.dispatcher.jobrules`) before any seen mark is made; a spec's ``max_pages`` and
``recrawl_after_s`` replace the settings' for its job.

Priorities and job states: each task is published on its lane, ``crawl.tasks.<shard>.<level>.<job>``
(its level from :func:`jetcrawl.dispatcher.jobrules.level_of`); the input of a job cancelled in KV
``crawl_control`` is dropped (counted), never admitted.

A message that runs out of deliveries becomes a dead letter (:mod:`jetcrawl.dispatcher.poison`);
replayed, it carries the sequences it came from (``Jetcrawl-Origin``), and the tasks of marks that
carry any of them are published as on a redelivery.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js import JetStreamContext

from jetcrawl.contract.deadletters import origins_of
from jetcrawl.contract.errors import JetcrawlError, MessageError
from jetcrawl.contract.jobs import JobSpec
from jetcrawl.contract.messages import Task
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import (
    DISPATCH_CONSUMER,
    FRONTIER_STREAM,
    JOBS_BUCKET,
    shard_partition,
    task_subject,
)
from jetcrawl.contract.urls import host_of, shard_of
from jetcrawl.dispatcher.admission import Candidates, candidates, decide, unknown_origins
from jetcrawl.dispatcher.intake import Intake, Reading
from jetcrawl.dispatcher.jobrules import follow
from jetcrawl.dispatcher.poison import PoisonCollector
from jetcrawl.dispatcher.quota import AdmissionQuota
from jetcrawl.dispatcher.seen import UNKNOWN, Mark, SeenSet, SeenSetUnavailable, SeenStats
from jetcrawl.dispatcher.tracing import BatchTrace
from jetcrawl.otel import NO_TRACING, Tracing
from jetcrawl.plumbing.backoff import backoff_s, wait_set
from jetcrawl.plumbing.bus import MSG_ID, Outbox, Outgoing, PublishFailed, connect
from jetcrawl.plumbing.control import ControlWatch
from jetcrawl.plumbing.deadletters import dead_letter, to_outgoing
from jetcrawl.plumbing.leaders import spread_leaders
from jetcrawl.plumbing.pull import Cut, hand_back, pull
from jetcrawl.plumbing.specs import SpecStore, SpecWatch
from jetcrawl.plumbing.topology import ensure

log = logging.getLogger(__name__)

FETCH_WAIT_S = 0.5
RETRY_DELAY_S = 1.0  # a frontier message handed back comes again after this, doubled each time
MAX_RETRY_DELAY_S = 30.0
# Frontier messages begun and not finished, remembered by sequence (most recent kept): ~100 bytes
# each, and only failed or in-flight messages stay.
MAX_UNFINISHED = 65_536
SPEC_APPLIED_WITHIN_S = 10.0  # a seed's inline spec, stored, reaches this dispatcher's watch


@dataclass(slots=True)
class DispatchStats:
    messages: int = 0  # frontier messages finished (acked or terminated)
    retried: int = 0  # frontier messages nak'ed for a retry
    admitted: int = 0  # new URLs published as tasks
    republished: int = 0  # tasks published again on redelivery of their origin message
    duplicates: int = 0
    out_of_scope: int = 0
    too_deep: int = 0
    rejected: int = 0  # dead letters written
    over_limit: int = 0  # new URLs not admitted because their job reached max_pages
    over_host_limit: int = 0  # ... because their host reached max_urls_per_host in the job
    traps: int = 0  # links dropped by the spider-trap guard (repeated path segments)
    # links their job's spec does not follow (link rules, extensions), or the crawl's default
    # extension filter (ignored_extensions) for a job without a spec
    not_followed: int = 0
    cancelled: int = 0  # URLs of cancelled jobs dropped


class Dispatcher:
    """Async context manager; ``run()`` pulls until ``stop()``."""

    def __init__(self, settings: Settings, tracing: Tracing = NO_TRACING) -> None:
        # configuration
        self._settings = settings
        self._intake = Intake(settings)
        self._tracing = tracing
        # connections, set by start()
        self._nc: NATS | None = None
        self._js: JetStreamContext | None = None
        self._sub: JetStreamContext.PullSubscription | None = None
        self._seen: SeenSet | None = None
        self._quota: AdmissionQuota | None = None
        self._host_quota: AdmissionQuota | None = None
        self._outbox: Outbox | None = None
        self.poison: PoisonCollector | None = None  # max-deliveries advisories -> dead letters
        self.specs: SpecWatch | None = None  # the job specs, as KV crawl_specs last showed them
        self._specs_store: SpecStore | None = None  # for the specs seeds carry inline
        self.control: ControlWatch | None = None  # job run states: a cancelled job's input goes
        # lifecycle
        self._stopping = asyncio.Event()
        self._cut = Cut()  # set with _stopping: a pull waiting for work returns at once
        self._closed = False
        # progress, for status and for tests that wait on a state
        self.stats = DispatchStats()
        self.frontier_backlog = 0  # the dispatch consumer's num_pending at the last delivery
        # frontier sequences begun and not acked: a delivery of one again is a redelivery
        self._unfinished: OrderedDict[int, None] = OrderedDict()
        self._progress = asyncio.Condition()

    @property
    def dead_letters(self) -> int:
        """Dead letters written: rejected input, and messages JetStream gave up on (poison)."""
        poisoned = self.poison.stats.dead_lettered if self.poison is not None else 0
        return self.stats.rejected + poisoned

    @property
    def seen_stats(self) -> SeenStats:
        """The seen set's counters (after ``start()``)."""
        assert self._seen is not None, "start() first"
        return self._seen.stats

    async def __aenter__(self) -> Dispatcher:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        self._nc = await connect(self._settings, "jetcrawl-dispatcher")
        self._js = self._nc.jetstream()
        await ensure(self._js, self._settings)
        if self._settings.create_topology:  # else the admin's `jetcrawl topology --apply` does
            await spread_leaders(self._nc, self._settings.partitions)
        self._outbox = Outbox(self._nc, propagate=self._tracing.enabled)
        self._seen = SeenSet(
            self._outbox,
            self._js,
            self._settings.dedupe_cache_size,
            self._settings.recrawl_after_s,
            self._settings.partitions,
        )
        jobs = await self._js.key_value(JOBS_BUCKET)
        self._quota = AdmissionQuota(jobs, self._settings.max_pages)
        self._host_quota = AdmissionQuota(jobs, self._settings.max_urls_per_host, prefix="hosts")
        self._sub = await self._js.pull_subscribe_bind(
            durable=DISPATCH_CONSUMER, stream=FRONTIER_STREAM
        )
        self.poison = PoisonCollector(self._settings, self._js, self._outbox)
        await self.poison.start()
        self.specs = SpecWatch(self._js)
        self._specs_store = await SpecStore.open(self._js)
        self.control = ControlWatch(self._js)

    def stop(self) -> None:
        """Stop taking new batches; the batch in hand is finished."""
        self._stopping.set()
        self._cut.set()
        if self.poison is not None:
            self.poison.stop()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.stop()
        if self._nc is not None and not self._nc.is_closed:
            await self._nc.close()

    @property
    def nc(self) -> NATS:
        assert self._nc is not None, "start() first"
        return self._nc

    async def run(self) -> None:
        """The frontier intake, and the poison-task collector beside it, until ``stop()``."""
        assert self.poison is not None and self.specs is not None, "start() first"
        assert self.control is not None, "start() first"
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.poison.run(self._stopping))
            tg.create_task(self.specs.run(self._stopping))
            tg.create_task(self.control.run(self._stopping))
            await self.specs.wait_ready()  # no URL is admitted without its job's spec
            await self.control.wait_ready()  # nor a cancelled job's
            await self._pull_frontier()

    async def _pull_frontier(self) -> None:
        assert self._sub is not None, "start() first"
        while not self._stopping.is_set():
            try:
                msgs = await pull(self._sub, self._settings.dispatch_batch, FETCH_WAIT_S, self._cut)
            except TimeoutError:
                continue  # nothing to do (nats-py raises a TimeoutError subclass too)
            except NatsError as e:
                log.warning("dispatch fetch failed, retrying: %r", e)
                await self._pause(RETRY_DELAY_S)
                continue
            await self._handle(msgs)
            if msgs.drained and self._settings.dispatch_linger_s > 0:
                # The server had no more: let the frontier fill up. A batch the deadline cut
                # short is no empty frontier (a busy server delivers late), as for the workers.
                await self._pause(self._settings.dispatch_linger_s)
        try:
            await hand_back(self._sub, self._cut)  # what the last requests delivered late
        except NatsError as e:  # gone with the connection: redelivered after AckWait
            log.warning("frontier messages delivered late not handed back: %r", e)

    async def wait_until(self, predicate: Callable[[DispatchStats], bool]) -> None:
        """Wait until ``predicate(stats)`` holds (callers bound it with ``asyncio.timeout``)."""
        async with self._progress:
            await self._progress.wait_for(lambda: predicate(self.stats))

    # ------------------------------------------------------------------ one batch

    async def _handle(self, msgs: list[Msg]) -> None:
        assert self._seen is not None and self._outbox is not None
        trace = BatchTrace(self._tracing, msgs, self._settings.trace_continue_depth)
        if msgs:
            self.frontier_backlog = msgs[-1].metadata.num_pending or 0
        seqs = [m.metadata.sequence.stream for m in msgs]
        owned = [self._owned(m, seq) for m, seq in zip(msgs, seqs, strict=True)]
        self._begin(seqs)
        # A first delivery's links that the seen cache knows are duplicates, settled in the
        # intake; a redelivery looks at every link (its marks may lack their tasks).
        known = self._seen.cached
        readings = [
            self._intake.read(m.subject, m.data, known if own is None else None)
            for m, own in zip(msgs, owned, strict=True)
        ]
        try:
            await self._store_specs(readings)
            for reading in readings:
                followed = follow(
                    reading,
                    self._spec,
                    self._settings.default_priority,
                    self._settings.ignored_extensions,
                )
                self.stats.not_followed += followed.not_followed
                self.stats.too_deep += followed.too_deep
                self._drop_cancelled(reading)
            tasks = await self._admit(seqs, owned, readings)
        except SeenSetUnavailable as e:
            log.warning("seen set unavailable, retrying %d messages: %s", len(msgs), e)
            trace.finish(set(range(len(msgs))), why="seen set unavailable")
            await asyncio.gather(*(self._retry(m) for m in msgs))
            await self._notify()
            return

        outgoing: list[Outgoing] = []
        owners: list[int] = []
        for i, task in tasks:
            shard = shard_of(host_of(task.url), self._settings.shards)
            subject = task_subject(shard, task.level, task.lineage.job)
            outgoing.append(Outgoing(subject, task.to_wire(), {MSG_ID: task.crawl_id}))
            owners.append(i)
        for i, (msg, reading) in enumerate(zip(msgs, readings, strict=True)):
            seq = seqs[i]
            for j, rej in enumerate(reading.rejections):
                letter = dead_letter(
                    msg,
                    rej.stage,
                    rej.reason,
                    rej.detail,
                    max_bytes=self._settings.dead_original_max_bytes,
                    original=rej.original,
                )
                outgoing.append(to_outgoing(letter, f"dead-{FRONTIER_STREAM}-{seq}-{j}"))
                owners.append(i)
                if msg.metadata.num_delivered == 1:
                    log.warning(
                        "rejected %s input (seq %d): %s %s", rej.stage, seq, rej.reason, rej.detail
                    )

        outgoing = trace.publishes(outgoing, owners, tasks)  # the tasks come first
        acks = await self._outbox.send(outgoing)
        trace.published(acks)
        failed = {owners[k] for k, ack in enumerate(acks) if isinstance(ack, PublishFailed)}
        for k, ack in enumerate(acks):
            if isinstance(ack, PublishFailed):
                log.warning("publish failed, message %d will be retried: %s", owners[k], ack)
        finishes = []
        for i, (msg, reading) in enumerate(zip(msgs, readings, strict=True)):
            if i in failed:
                finishes.append(self._retry(msg))
            else:
                finishes.append(msg.term() if reading.unreadable else msg.ack())
                self._unfinished.pop(seqs[i], None)
                self.stats.messages += 1
                self.stats.rejected += len(reading.rejections)
                self.stats.out_of_scope += reading.out_of_scope
                self.stats.too_deep += reading.too_deep
                self.stats.traps += reading.traps
        trace.finish(failed, tasks, [len(r.rejections) for r in readings], "publish failed")
        await asyncio.gather(*finishes)
        await self._notify()

    def _drop_cancelled(self, reading: Reading) -> None:
        gone = self.control.cancelled() if self.control is not None else ()
        if gone:
            kept = [t for t in reading.tasks if t.lineage.job not in gone]
            self.stats.cancelled += len(reading.tasks) - len(kept)
            reading.tasks = kept

    def _retry(self, msg: Msg) -> Awaitable[None]:
        """Hand ``msg`` back, to come again after ``retry_delay_s`` of its deliveries."""
        delivered = msg.metadata.num_delivered or 1
        if 0 < self._settings.frontier_max_deliver <= delivered:  # -1: JetStream's no limit
            log.error(
                "frontier message %d failed its last delivery (%d): JetStream will not deliver "
                "it again; it becomes a dead letter to replay (stage frontier)",
                msg.metadata.sequence.stream,
                delivered,
            )
        self.stats.retried += 1
        return msg.nak(delay=retry_delay_s(delivered))

    def _owned(self, msg: Msg, seq: int) -> tuple[int, ...] | None:
        """The frontier sequences whose seen marks ``msg`` may have made without publishing
        their tasks: none (None) on a first delivery; its own on a redelivery; and, replayed
        from a dead letter, those of the messages it came from (``ORIGIN_HEADER``)."""
        try:
            origins = origins_of(msg.headers)
        except MessageError as e:
            log.warning("frontier message %d: %s; read as a message of its own", seq, e)
            origins = ()
        if origins:
            return (seq, *origins)
        if msg.metadata.num_delivered > 1 or seq in self._unfinished:
            return (seq,)
        return None

    def _begin(self, seqs: list[int]) -> None:
        unfinished = self._unfinished
        for seq in seqs:
            unfinished[seq] = None
            unfinished.move_to_end(seq)
        while len(unfinished) > MAX_UNFINISHED:
            unfinished.popitem(last=False)

    async def _admit(
        self, seqs: list[int], owned: list[tuple[int, ...] | None], readings: list[Reading]
    ) -> list[tuple[int, Task]]:
        """The tasks to publish, each with the index of the message that owns it. ``owned``:
        for a message that may have made marks before (``_owned``), the sequences they carry.
        The decisions are :mod:`jetcrawl.dispatcher.admission`'s; this is their I/O."""
        assert self._seen is not None and self._quota is not None
        assert self._host_quota is not None
        seen = self._seen
        c = candidates(seqs, readings, seen.cached)
        granted_by_job: dict[str, int] = {}
        for job, keys in c.by_job.items():
            limit = self._max_pages(job)
            if limit > 0:
                granted_by_job[job] = await self._quota.reserve(job, len(keys), limit)
                c.drop(keys[granted_by_job[job] :])
                self.stats.over_limit += len(keys) - granted_by_job[job]
        granted_by_host = await self._reserve_hosts(c)
        ttls = self._recrawl_ttls(c)
        where = self._partitions_of(c)
        made = await seen.create(list(c.to_create.items()), ttls, where)
        created: dict[str, Mark] = {}
        for key, mark in zip(c.to_create, made, strict=True):
            if mark is None:
                c.known[key] = UNKNOWN  # the bucket has it: its origin is not known here
            else:
                created[key] = mark
        await self._give_back(granted_by_job, granted_by_host, c, created)
        # On redelivery, a mark that carries this message's sequence may lack its task.
        for key in unknown_origins(c, owned):
            c.known[key] = await seen.read(key, ttls.get(key), where.get(key, 0))
        decision = decide(
            c,
            seqs,
            owned,
            created,
            recrawl=self._settings.recrawl_after_s > 0,
            recrawl_jobs={t.lineage.job for _, t, _ in c.pairs if self._recrawl_s(t.lineage.job)},
        )
        self.stats.admitted += decision.admitted
        self.stats.republished += decision.republished
        self.stats.duplicates += decision.duplicates + sum(r.known for r in readings)
        return decision.tasks

    async def _give_back(
        self,
        by_job: dict[str, int],
        by_host: dict[str, int],
        c: Candidates,
        created: dict[str, Mark],
    ) -> None:
        """Return the quota granted to keys whose create found a mark already there."""
        assert self._quota is not None and self._host_quota is not None
        for job, granted in by_job.items():
            used = sum(1 for key in c.by_job[job][:granted] if key in created)
            await self._quota.give_back(job, granted - used)
        if by_host:
            await asyncio.gather(
                *(
                    self._host_quota.give_back(
                        host, granted - sum(1 for k in c.by_host[host][:granted] if k in created)
                    )
                    for host, granted in by_host.items()
                )
            )

    async def _reserve_hosts(self, c: Candidates) -> dict[str, int]:
        """Admissions per job and host (``max_urls_per_host``); drops the rest from ``c``."""
        assert self._host_quota is not None
        if not self._host_quota.limited:
            return {}
        for keys in c.by_host.values():
            keys[:] = [key for key in keys if key in c.to_create]  # what max_pages left
        hosts = [host for host, keys in c.by_host.items() if keys]
        grants = await asyncio.gather(
            *(self._host_quota.reserve(host, len(c.by_host[host])) for host in hosts)
        )
        for host, granted in zip(hosts, grants, strict=True):
            c.drop(c.by_host[host][granted:])
            self.stats.over_host_limit += len(c.by_host[host]) - granted
        return dict(zip(hosts, grants, strict=True))

    async def _store_specs(self, readings: list[Reading]) -> None:
        """Store the specs seeds carry inline (a spec already stored is no new version), and
        wait until the watch applies them, so they govern the seeds' own admission."""
        assert self._specs_store is not None and self.specs is not None
        for spec in (spec for reading in readings for spec in reading.specs):
            try:
                put = await self._specs_store.put(spec)
                async with asyncio.timeout(SPEC_APPLIED_WITHIN_S):
                    await self.specs.wait_version(spec.name, put.stored.version)
            except (TimeoutError, NatsError, JetcrawlError) as e:
                raise SeenSetUnavailable(f"job spec {spec.name} not stored: {e!r}") from e
            if put.changed:
                log.info("job %s: version %d from a seed", spec.name, put.stored.version)

    def _spec(self, job: str) -> JobSpec | None:
        stored = self.specs.current(job) if self.specs is not None else None
        return stored.spec if stored is not None else None

    def _recrawl_s(self, job: str) -> float | None:
        spec = self._spec(job)
        return spec.recrawl_after_s if spec is not None else None

    def _partitions_of(self, c: Candidates) -> dict[str, int]:
        """Each key's seen-set partition, by its host's shard ({} with one partition)."""
        k, shards = self._settings.partitions, self._settings.shards
        if k == 1:
            return {}
        by_host: dict[str, int] = {}  # a batch's links share few hosts
        where: dict[str, int] = {}
        for _, task, key in c.pairs:
            host = host_of(task.url)
            if (p := by_host.get(host)) is None:
                p = by_host[host] = shard_partition(shard_of(host, shards), shards, k)
            where[key] = p
        return where

    def _recrawl_ttls(self, c: Candidates) -> dict[str, float]:
        """The seen marks' own lifetimes: of the keys whose job spec says re-crawl."""
        ttls = {}
        for _, task, key in c.pairs:
            recrawl_s = self._recrawl_s(task.lineage.job)
            if recrawl_s:
                ttls[key] = recrawl_s
        return ttls

    def _max_pages(self, job: str) -> int:
        """The job's spec's max_pages, else the setting's (0: no limit)."""
        spec = self._spec(job)
        if spec is not None and spec.max_pages is not None:
            return spec.max_pages
        return self._settings.max_pages

    async def _notify(self) -> None:
        async with self._progress:
            self._progress.notify_all()

    async def _pause(self, seconds: float) -> None:
        await wait_set(self._stopping, seconds)


def retry_delay_s(delivered: int) -> float:
    """How long a frontier message handed back after its ``delivered``-th delivery waits: 1 s,
    doubled at each delivery, at most 30 s. Its deliveries are few (``frontier_max_deliver``, 20),
    so a flat 1 s spent them all in well under a minute of a stream without a leader; this way
    they last about seven minutes."""
    return backoff_s(delivered, RETRY_DELAY_S, MAX_RETRY_DELAY_S)
