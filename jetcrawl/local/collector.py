"""Follows CRAWL_RESULTS during a local crawl: the summary's counts, and the output file.

A URL's first record is written once (a redelivered task's second record is counted as a
duplicate); bodies come from the object store when the output format carries them (WARC).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from jetcrawl.contract.messages import ResultHead
from jetcrawl.contract.topology import RESULTS_PREFIX, RESULTS_STREAM
from jetcrawl.local.summary import Summary
from jetcrawl.ops.export import Sink
from jetcrawl.plumbing.backoff import wait_set
from jetcrawl.plumbing.bodies import BodyNotFound, BodyStore
from jetcrawl.plumbing.pull import Cut, pull

log = logging.getLogger(__name__)

COLLECT_BATCH = 512
COLLECT_WAIT_S = 0.25
COLLECT_PAUSE_S = 0.2


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
        if msgs and self._sink is not None:
            self._sink.flush()  # on disk within a batch of being counted
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
        self.summary.count(head)
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
