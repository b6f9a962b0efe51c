"""The sink service: durable pull consumers over CRAWL_ITEMS and CRAWL_RESULTS, a sink behind.

One durable consumer per stream the sink stores, named from the sink and the job
(``sink-postgres-shop``): sinks of other names or jobs keep their own positions and never take
each other's messages, while two processes of one sink and job share the work. A message is
acked only once the sink returned it as durable (a committed transaction, a file renamed and
fsynced); until then it is kept alive with in-progress acks, however long the storage is down.
When the sink says its storage is unavailable the service pauses: it logs that once, retries the
same write with the project's backoff, acks nothing, and logs again when it resumes. A message
that does not decode, or that the storage refuses for its content, becomes a dead letter on
``crawl.dead.sink`` and is terminated; the rest of its batch goes through.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from jetcrawl.contract.errors import MessageError
from jetcrawl.contract.items import Item
from jetcrawl.contract.messages import Result
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import (
    ITEMS_PREFIX,
    ITEMS_STREAM,
    RESULTS_PREFIX,
    RESULTS_STREAM,
    item_subject,
)
from jetcrawl.plumbing.backoff import backoff_s, wait_set
from jetcrawl.plumbing.bus import connect
from jetcrawl.plumbing.deadletters import dead_letter, to_outgoing
from jetcrawl.plumbing.pull import Cut, hand_back, pull
from jetcrawl.plumbing.topology import ensure
from jetcrawl.sinks.api import ITEMS, RESULTS, Record, Sink
from jetcrawl.sinks.errors import SinkError, SinkRejected, SinkUnavailable

__all__ = ["STAGE_SINK", "SinkService", "SinkStats", "consumer_name"]

log = logging.getLogger(__name__)

STAGE_SINK = "sink"  # dead letters of the sinks: crawl.dead.sink
_RETRY_JITTER = 0.2
_KEEPALIVES_PER_ACK_WAIT = 3


def consumer_name(sink: str, job: str | None) -> str:
    """The durable consumer of sink ``sink`` for ``job`` (all jobs: ``all``)."""
    return f"sink-{sink}-{job or 'all'}"


@dataclass(slots=True)
class SinkStats:
    stored: int = 0  # records acked after the sink made them durable
    skipped: int = 0  # results of other jobs, and records the sink had stored before
    dead: int = 0  # undecodable or refused: dead-lettered
    pauses: int = 0  # times the storage went away


@dataclass(slots=True)
class _Stream:
    kind: str
    stream: str
    subject: str
    psub: JetStreamContext.PullSubscription | None = None
    cut: Cut = field(default_factory=Cut)


class SinkService:
    """Runs one sink until ``stop()``; see the module docstring for what it promises."""

    def __init__(
        self,
        settings: Settings,
        sink: Sink,
        kinds: frozenset[str],
        consumer: str,
        job: str | None,
    ) -> None:
        # what it serves
        self._settings = settings
        self._sink = sink
        self._consumer = consumer
        self._job = job
        self._streams = [
            _Stream(ITEMS, ITEMS_STREAM, item_subject(job) if job else f"{ITEMS_PREFIX}*"),
            _Stream(RESULTS, RESULTS_STREAM, f"{RESULTS_PREFIX}*"),
        ]
        self._streams = [s for s in self._streams if s.kind in kinds]
        # connection
        self.nc: NATS | None = None
        self._js: JetStreamContext | None = None
        # records handed to the sink and not yet durable, by (kind, stream sequence)
        self._held: dict[tuple[str, int], Msg] = {}
        self._writing = asyncio.Lock()  # one write at a time: the sink is not re-entrant
        # the storage: open yet, and why it is away (None: it answers)
        self._opened = False
        self._paused_by: str | None = None
        # stopping
        self._stopping = asyncio.Event()
        self.stats = SinkStats()

    @property
    def held(self) -> int:
        """Records handed to the sink and not yet durable."""
        return len(self._held)

    @property
    def paused(self) -> bool:
        return self._paused_by is not None

    async def ready(self) -> str | None:
        """A readiness check: None while connected, open and not paused, else why not."""
        if self.nc is None or not self.nc.is_connected:
            return "nats: not connected"
        if not self._opened:
            return f"sink: {self._sink.describe()} not open yet"
        if self._paused_by is not None:
            return f"sink paused: {self._paused_by}"
        return None

    def stop(self) -> None:
        self._stopping.set()
        for s in self._streams:
            s.cut.set()

    async def run(self) -> None:
        """Connect (failing fast when NATS cannot be reached), open the sink, store until
        stopped, then make what is held durable and ack it."""
        settings = self._settings
        self.nc = await connect(
            settings, f"jetcrawl-{self._consumer}", give_up_s=settings.command_timeout_s
        )
        try:
            self._js = self.nc.jetstream()
            await ensure(self._js, settings)
            for s in self._streams:
                s.psub = await self._subscribe(s)
            if not await self._open():
                return
            try:
                await self._serve()
                await self._flush()
                # What no write made durable goes back now, for another process of this sink.
                for msg in self._held.values():
                    with contextlib.suppress(NatsError):  # then they come back after AckWait
                        await msg.nak()
            finally:
                for s in self._streams:
                    if s.psub is not None:
                        await hand_back(s.psub, s.cut)
                await self._sink.close()
        finally:
            await self.nc.close()

    async def _serve(self) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                keepalive = tg.create_task(self._keep_alive())
                pumps = [tg.create_task(self._pump(s)) for s in self._streams]
                await asyncio.gather(*pumps)
                keepalive.cancel()
        except BaseExceptionGroup as group:
            # A sink's own error (a directory it may not write) is said in one line, as at start.
            ours = group.subgroup(lambda e: isinstance(e, SinkError))
            if ours is not None:
                raise ours.exceptions[0] from None
            raise

    async def _flush(self) -> None:
        async with self._writing:
            try:
                durable = await self._sink.flush()
            except SinkUnavailable as e:
                log.warning(
                    "sink %s stopped with %d records not stored (%s): they come again",
                    self._consumer,
                    len(self._held),
                    e,
                )
                return
            await self._ack(durable)

    async def _subscribe(self, s: _Stream) -> JetStreamContext.PullSubscription:
        assert self._js is not None
        config = ConsumerConfig(
            name=self._consumer,
            durable_name=self._consumer,
            description=f"jetcrawl sink {self._consumer}",
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=self._settings.ack_wait_s,
            max_deliver=-1,  # an outage may outlast any count: a record is never given up on
            max_ack_pending=self._settings.sink_max_pending,
            filter_subject=s.subject,
        )
        try:
            existing = await self._js.consumer_info(s.stream, self._consumer)
        except NotFoundError:
            pass
        else:
            # One name, another filter: binding to it would store what this sink was not
            # asked for (a job named "all" beside the all-jobs sink, say).
            if existing.config.filter_subject != s.subject:
                raise SinkError(
                    f"consumer {self._consumer} on {s.stream}",
                    f"exists with filter {existing.config.filter_subject!r}, not {s.subject!r}; "
                    "name this sink's consumer with --consumer",
                )
        return await self._js.pull_subscribe(
            s.subject, durable=self._consumer, stream=s.stream, config=config
        )

    async def _open(self) -> bool:
        """Open the sink, waiting out an unavailable storage; False if stopped meanwhile."""
        attempt = 0
        while True:
            try:
                await self._sink.open()
            except SinkUnavailable as e:
                self._paused_by = str(e)
                if attempt == 0:
                    log.warning("sink %s cannot start yet: %s; retrying", self._consumer, e)
                attempt += 1
                if await wait_set(self._stopping, self._retry_delay_s(attempt)):
                    return False
                continue
            self._opened = True
            self._paused_by = None
            if attempt:
                log.info("sink %s started after %d tries", self._consumer, attempt + 1)
            log.info("sink %s writing to %s", self._consumer, self._sink.describe())
            return True

    async def _pump(self, s: _Stream) -> None:
        assert s.psub is not None
        batch, idle_s = self._settings.sink_batch, self._settings.sink_idle_s
        while not self._stopping.is_set():
            try:
                msgs: list[Msg] = await pull(s.psub, batch, idle_s, s.cut)
            except TimeoutError:
                msgs = []
            records = [r for r in [await self._decode(s, m) for m in msgs] if r is not None]
            for record, msg in records:
                self._held[(record.kind, record.seq)] = msg
            async with self._writing:
                durable = await self._store([r for r, _ in records])
                if durable is None:
                    return  # stopped while paused: what is held stays unacked, for later
                await self._ack(durable)

    async def _decode(self, s: _Stream, msg: Msg) -> tuple[Record, Msg] | None:
        seq = msg.metadata.sequence.stream
        try:
            if s.kind == ITEMS:
                record = Record(ITEMS, seq, msg.data, item=Item.from_wire(msg.data))
            else:
                result = Result.from_wire(msg.data)
                if self._job is not None and result.job != self._job:
                    self.stats.skipped += 1
                    with contextlib.suppress(NatsError):  # if lost, skipped again later
                        await msg.ack()
                    return None
                record = Record(RESULTS, seq, msg.data, result=result)
        except MessageError as e:
            await self._dead(msg, e.reason, e.detail or str(e))
            return None
        return record, msg

    async def _store(self, records: Sequence[Record]) -> Sequence[Record] | None:
        """``sink.write(records)``, retried while the storage is unavailable; what is durable,
        or None when stopped before the storage came back. Refused records are dead-lettered
        one by one."""
        paused_at: float | None = None
        attempt = 0
        while True:
            try:
                durable = await self._sink.write(records)
            except SinkUnavailable as e:
                self._paused_by = str(e)
                if paused_at is None:
                    paused_at = time.monotonic()
                    self.stats.pauses += 1
                    log.warning(
                        "sink %s paused, nothing acked until the storage is back: %s",
                        self._consumer,
                        e,
                    )
                attempt += 1
                if await wait_set(self._stopping, self._retry_delay_s(attempt)):
                    return None
                continue
            except SinkRejected as e:
                if len(records) == 1:
                    msg = self._held.pop((records[0].kind, records[0].seq))
                    await self._dead(msg, "rejected", e.problem)
                    return []
                return await self._one_by_one(records)
            self._paused_by = None
            if paused_at is not None:
                log.info(
                    "sink %s resumed after %.1f s", self._consumer, time.monotonic() - paused_at
                )
            return durable

    async def _one_by_one(self, records: Sequence[Record]) -> Sequence[Record] | None:
        durable: list[Record] = []
        for record in records:
            stored = await self._store([record])
            if stored is None:
                return None
            durable.extend(stored)
        return durable

    async def _ack(self, durable: Sequence[Record]) -> None:
        lost = 0
        for record in durable:
            msg = self._held.pop((record.kind, record.seq), None)
            if msg is None:
                continue  # acked before: the sink returned it twice
            self.stats.stored += 1
            try:
                await msg.ack()
            except NatsError:  # the connection's buffer is full while it reconnects
                lost += 1
        if durable and self.nc is not None and not lost:
            try:
                await self.nc.flush()  # the server has the acks: a crash now doubles nothing
            except (NatsError, TimeoutError):
                lost = len(durable)
        if lost:
            # Stored already: their redelivery changes nothing (a sink stores twice alike).
            log.warning("sink %s: %d acks may be lost (NATS reconnecting)", self._consumer, lost)

    async def _keep_alive(self) -> None:
        """In-progress acks for what the sink holds, so AckWait never redelivers it."""
        every_s = self._settings.ack_wait_s / _KEEPALIVES_PER_ACK_WAIT
        while not await wait_set(self._stopping, every_s):
            for msg in list(self._held.values()):
                try:
                    await msg.in_progress()
                except NatsError as e:  # reconnecting: the next round tries again
                    log.debug("in-progress ack failed: %r", e)

    async def _dead(self, msg: Msg, reason: str, detail: str) -> None:
        assert self._js is not None
        seq = msg.metadata.sequence.stream
        letter = dead_letter(
            msg,
            STAGE_SINK,
            reason,
            detail,
            max_bytes=self._settings.dead_original_max_bytes,
        )
        out = to_outgoing(letter, f"{self._consumer}:{msg.subject}:{seq}")
        try:
            await self._js.publish(out.subject, out.payload, headers=dict(out.headers or {}))
        except NatsError as e:  # not terminated: it comes back and is tried again
            log.warning("dead letter for %s seq %d not stored: %r", msg.subject, seq, e)
            return
        with contextlib.suppress(NatsError):  # if lost, the letter is made again: same id
            await msg.term()
        self.stats.dead += 1
        log.warning("dead-lettered %s seq %d (%s): %s", msg.subject, seq, reason, detail)

    def _retry_delay_s(self, attempt: int) -> float:
        settings = self._settings
        return backoff_s(
            attempt, settings.sink_retry_first_s, settings.sink_retry_max_s, jitter=_RETRY_JITTER
        )
