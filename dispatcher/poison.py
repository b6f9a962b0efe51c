"""Poison tasks: from JetStream's max-deliveries advisory to a ``CRAWL_DEAD`` record.

A task that crashes or hangs its worker every time is never acked. After MaxDeliver deliveries
JetStream stops delivering it, leaves it in its task stream (a work queue keeps what is not
acked), and publishes an advisory; stream ``CRAWL_ADVISORIES`` keeps the advisory (advisories
are plain messages), so none is lost while no dispatcher runs. The collector, a loop of every
dispatcher on the shared durable consumer ``poison`` (one of them gets each advisory), reads the
task by its stream sequence, writes a dead letter (stage ``poison``, reason ``max_deliveries``,
``Nats-Msg-Id`` by stream and sequence, so a redelivered advisory adds none), deletes the task
from the work queue, and only then acks the advisory. A task that is gone already (acked late by
a slow worker, or handled before) just has its advisory acked. ``jetcrawl dlq replay --stage
poison`` sends it back to its shard.

A frontier message the dispatchers' intake could not admit in ``frontier_max_deliver``
deliveries (its publishes failed for minutes: retry_delay_s) is left in ``CRAWL_FRONTIER`` the
same way, with its advisory. The collector turns it into a dead letter too (stage ``frontier``,
reason ``max_deliveries``, the whole original so that it can be replayed), with the frontier
sequences whose seen marks it may have made (``origins``): ``dlq replay`` sends it back to its
subject carrying them, and the dispatcher publishes the tasks those marks lack.

It runs in the dispatcher because the dispatcher runs wherever a crawl does and, like the
frontier intake, is safe to run many times over one shared consumer; a worker would only
collect while it owned shards.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

import orjson
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.api import RawStreamMsg
from nats.js.errors import NotFoundError

from jetcrawl.contract.deadletters import STAGE_POISON, DeadLetter, origins_of
from jetcrawl.contract.errors import MessageError
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import (
    ADVISORIES_STREAM,
    FRONTIER_STREAM,
    POISON_CONSUMER,
)
from jetcrawl.dispatcher.intake import FRONTIER_STAGE
from jetcrawl.plumbing.backoff import wait_set
from jetcrawl.plumbing.bus import Outbox, PublishFailed
from jetcrawl.plumbing.deadletters import dead_letter, to_outgoing
from jetcrawl.plumbing.pull import Cut, hand_back, pull

__all__ = ["PoisonCollector", "PoisonStats"]

log = logging.getLogger(__name__)

BATCH = 16
FETCH_WAIT_S = 0.5
RETRY_DELAY_S = 1.0
REASON = "max_deliveries"
LETTER_HEADROOM = 1024  # of max_payload: the headers of the letter's message


@dataclass(slots=True)
class PoisonStats:
    dead_lettered: int = 0
    frontier_dead_lettered: int = 0  # frontier messages (of dead_lettered)
    gone: int = 0  # advisories of tasks no longer in the work queue
    unreadable: int = 0  # advisories that are not what we expect (terminated)


class PoisonCollector:
    def __init__(self, settings: Settings, js: JetStreamContext, outbox: Outbox) -> None:
        self._settings = settings
        self._js = js
        self._outbox = outbox
        self._sub: JetStreamContext.PullSubscription | None = None
        self._cut = Cut()  # stop(): a pull waiting for advisories returns at once
        self.stats = PoisonStats()

    async def start(self) -> None:
        self._sub = await self._js.pull_subscribe_bind(
            durable=POISON_CONSUMER, stream=ADVISORIES_STREAM
        )

    def stop(self) -> None:
        """Stop collecting; the advisories in hand are finished."""
        self._cut.set()

    async def run(self, stopping: asyncio.Event) -> None:
        """Collect until ``stop()``; ``stopping`` (set with it) ends a pause after a failure."""
        assert self._sub is not None, "start() first"
        while not self._cut.is_set:
            try:
                msgs = await pull(self._sub, BATCH, FETCH_WAIT_S, self._cut)
            except TimeoutError:
                continue  # nothing to collect (nats-py raises a TimeoutError subclass too)
            except NatsError as e:
                log.warning("poison fetch failed, retrying: %r", e)
                await wait_set(stopping, RETRY_DELAY_S)
                continue
            for msg in msgs:
                await self._handle(msg)
        try:
            await hand_back(self._sub, self._cut)
        except NatsError as e:  # gone with the connection: redelivered after AckWait
            log.warning("poison advisories delivered late not handed back: %r", e)

    async def _handle(self, advisory: Msg) -> None:
        try:
            doc = orjson.loads(advisory.data)
            seq, consumer = int(doc["stream_seq"]), str(doc.get("consumer", "?"))
            deliveries = int(doc.get("deliveries", 0))
            stream = str(doc["stream"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            log.error("unreadable max-deliveries advisory: %r", advisory.data[:300])
            self.stats.unreadable += 1
            await advisory.term()
            return
        try:
            await self._dead_letter(stream, seq, consumer, deliveries)
        except (NatsError, TimeoutError, PublishFailed) as e:
            log.warning("%s message %d not dead-lettered yet: %r", stream, seq, e)
            await advisory.nak(delay=RETRY_DELAY_S)
            return
        await advisory.ack()

    async def _dead_letter(self, stream: str, seq: int, consumer: str, deliveries: int) -> None:
        """Message ``seq`` of ``stream`` (the frontier, or a task stream) written as a dead
        letter, then deleted; one that is gone already is only counted."""
        frontier = stream == FRONTIER_STREAM
        try:
            msg = await self._js.get_msg(stream, seq)
        except NotFoundError:
            self.stats.gone += 1
            return
        if frontier:
            letter = self._frontier_letter(msg, consumer, deliveries)
        else:
            letter = dead_letter(
                msg,
                STAGE_POISON,
                REASON,
                f"consumer {consumer} delivered it {deliveries} times, never acked",
                max_bytes=self._settings.dead_original_max_bytes,
            )
        # Sequences are per stream, and there is a task stream per partition.
        [ack] = await self._outbox.send([to_outgoing(letter, f"dead-{stream}-{seq}")])
        if isinstance(ack, PublishFailed):
            raise ack
        with contextlib.suppress(NotFoundError):
            await self._js.delete_msg(stream, seq)
        self.stats.dead_lettered += 1
        if frontier:
            self.stats.frontier_dead_lettered += 1
            log.error(
                "frontier message %d dead-lettered: %s (`jetcrawl dlq replay --stage frontier "
                "--reason max_deliveries` admits its links)",
                seq,
                letter.detail,
            )
        else:
            log.warning("poison task dead-lettered (seq %d, %s): %s", seq, consumer, letter.detail)

    def _frontier_letter(self, msg: RawStreamMsg, consumer: str, deliveries: int) -> DeadLetter:
        """A frontier message's letter: whole, to be replayed, with the frontier sequences whose
        seen marks it may have made; cut to ``dead_original_max_bytes`` (and kept as a record)
        only if it does not fit in a message as a letter."""
        seq = msg.seq or 0
        original = msg.data or b""
        try:
            earlier = origins_of(msg.headers)
        except MessageError as e:
            log.warning("frontier message %d: %s; dead-lettered without them", seq, e)
            earlier = ()
        detail = (
            f"consumer {consumer} delivered it {deliveries} times and could not admit its links"
        )
        whole = dead_letter(
            msg, FRONTIER_STAGE, REASON, detail, max_bytes=len(original), origins=(*earlier, seq)
        )
        if len(whole.to_wire()) <= self._outbox.max_payload - LETTER_HEADROOM:
            return whole
        return dead_letter(
            msg,
            FRONTIER_STAGE,
            REASON,
            f"{detail}; too large to keep whole ({len(original)} bytes): not replayable",
            max_bytes=self._settings.dead_original_max_bytes,
            origins=(*earlier, seq),
        )
