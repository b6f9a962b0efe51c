"""One owned shard: a pull loop on its ``shard-<n>`` consumer.

It fetches only while the worker can hold more tasks, as many as it has room for (the worker's
``holding``: tasks in flight plus tasks waiting for their host, :mod:`jetcrawl.worker.politeness`),
and takes a place for each task before starting it. Each held task is kept alive with in-progress
acks (:mod:`jetcrawl.worker.keepalive`). Each message becomes a task in the puller's own TaskGroup,
so "drained" means the group has exited. Stopping is graceful by default — stop fetching, finish
what was fetched — which hands a shard over with no redelivery; ``abandon()`` (lease lost) stops
fetching and hands back what was not started, waiting tasks included.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js import JetStreamContext

from jetcrawl.plumbing.backoff import wait_set
from jetcrawl.plumbing.pull import Cut, end_requests, pull
from jetcrawl.worker.capacity import Capacity
from jetcrawl.worker.keepalive import KeepAlive
from jetcrawl.worker.outcome import Ownership

log = logging.getLogger(__name__)

# How long an idle shard's pull request waits for work. Each expiry costs a round of requests on
# every idle shard, paid in CPU by an idle worker and its nats-server; a stop or a handover ends the
# requests at once on one server and waits them out through a cluster (end_requests), so this also
# bounds a cluster handover.
PULL_WAIT_S = 2.0
MAX_BATCH = 64
RETRY_PAUSE_S = 0.5


class ShardPuller:
    def __init__(
        self,
        owner: Ownership,
        sub: JetStreamContext.PullSubscription,
        holding: Capacity,
        keepalive: KeepAlive,
        process: Callable[[Msg, Ownership, asyncio.Event], Awaitable[None]],
    ) -> None:
        self.owner = owner
        self._sub = sub
        self._holding = holding
        self._keepalive = keepalive
        self._process = process
        self._stopping = asyncio.Event()
        self._abandoned = asyncio.Event()
        self._cut = Cut()  # a pull waiting for work returns at once when the puller stops
        self.done = asyncio.Event()

    def stop(self) -> None:
        """Stop fetching; what was fetched is still crawled."""
        self._stopping.set()
        self._cut.set()
        self._holding.wake_all()  # a loop waiting for room sees it

    def abandon(self) -> None:
        """Stop fetching at once; fetched tasks not yet started are handed back."""
        self._abandoned.set()
        self._stopping.set()
        self._cut.set()
        self._holding.wake_all()

    async def run(self) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                while await self._holding.wait_free(unless=self._stopping):
                    await self._start(
                        tg, await self._pull(min(MAX_BATCH, self._holding.free_slots))
                    )
                await self._start(tg, await self._lingering())
        finally:
            try:
                await self._sub.unsubscribe()
            except NatsError as e:
                log.debug("unsubscribe of shard %d failed: %r", self.owner.shard, e)
            self.done.set()

    async def _start(self, tg: asyncio.TaskGroup, msgs: list[Msg]) -> None:
        for msg in msgs:
            if await self._holding.take(unless=self._abandoned):
                tg.create_task(self._run_one(msg))
            else:
                await msg.nak()  # lease lost: the next owner takes it at once

    async def _lingering(self) -> list[Msg]:
        """Tasks a pull request delivered after its fetch returned: take them before leaving.

        ``pull`` can return (with what it has, or cut short) before the server's pull request
        expires; what the request delivers later lands in this subscription's queue, where the
        next fetch would find it. A puller that is leaving has no next fetch: without this,
        those tasks would sit unacknowledged until AckWait, delaying a handover by that much.
        ``end_requests`` ends the requests at once on a single server; in a cluster it waits
        them out (at most ``PULL_WAIT_S``).
        """
        try:
            return await end_requests(self._sub, self._cut)
        except NatsError as e:  # the connection is gone: JetStream redelivers after AckWait
            log.warning("could not end the pull requests of shard %d: %r", self.owner.shard, e)
            return []

    async def _pull(self, batch: int) -> list[Msg]:
        try:
            return await pull(self._sub, max(1, batch), PULL_WAIT_S, self._cut)
        except TimeoutError:
            return []  # idle shard (nats-py raises a TimeoutError subclass too)
        except NatsError as e:
            log.warning("pull on shard %d failed: %r", self.owner.shard, e)
            await self._pause()
            return []

    async def _run_one(self, msg: Msg) -> None:
        self._keepalive.hold(msg)
        try:
            await self._process(msg, self.owner, self._abandoned)
        except NatsError as e:
            # The ack or nak did not reach the server: JetStream redelivers after AckWait.
            log.warning("task on shard %d left unacknowledged: %r", self.owner.shard, e)
        finally:
            self._keepalive.release(msg)
            self._holding.release()

    async def _pause(self) -> None:
        await wait_set(self._stopping, RETRY_PAUSE_S)
