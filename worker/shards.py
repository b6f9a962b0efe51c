"""One owned shard: a pull loop over its lanes' consumers (``tasks-<shard>-<level>-<job>``).

Which lane next, and how many, is the shard's :class:`~jetcrawl.worker.lanes.Schedule` (levels,
then jobs), given the lanes the board (:class:`~jetcrawl.worker.lanes.LaneBoard`) shows holding
tasks, less a paused job's and a job out of rate tokens. A lane's consumer is made when the
shard's owner first takes from it. With nothing to take, the loop waits on every running lane it
has taken from at once (new tasks of a running crawl mostly come there), until one gets a task or
the board shows another lane gaining tasks.

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
from dataclasses import dataclass, field

from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js import JetStreamContext

from jetcrawl.contract.control import PAUSED
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import lane_config, lane_consumer, shard_tasks_stream
from jetcrawl.plumbing.backoff import wait_set
from jetcrawl.plumbing.control import ControlWatch
from jetcrawl.plumbing.pull import Cut, Pulled, end_requests, pull
from jetcrawl.worker.capacity import Capacity
from jetcrawl.worker.keepalive import KeepAlive
from jetcrawl.worker.lanes import JobRates, Lane, LaneBoard, Schedule
from jetcrawl.worker.outcome import Ownership

log = logging.getLogger(__name__)

# How long an idle shard's pull request waits for work. Each expiry costs a round of requests on
# every idle shard, paid in CPU by an idle worker and its nats-server; a stop or a handover ends the
# requests at once on one server and waits them out through a cluster (end_requests), so this also
# bounds a cluster handover.
PULL_WAIT_S = 2.0
# A lane the board shows holding tasks is pulled with this wait: its tasks may all be in flight
# (delivered to the previous owner, or to us and not yet acked).
READY_WAIT_S = 0.05
# Tasks one pull asks for, at most (and at most the holding's free places). Large, so that a worker
# whose loop is busy still fills its waiting room within a few round trips: a slow host's tasks
# deep in the lane are then in hand, waiting for its turn, early in a crawl rather than late.
MAX_BATCH = 512
RETRY_PAUSE_S = 0.5


@dataclass(slots=True)
class _LaneSub:
    """This owner's consumer of one lane."""

    sub: JetStreamContext.PullSubscription | None = None
    cut: Cut = field(default_factory=Cut)  # set when the puller stops; spans every request
    held: int = 0  # tasks of the lane held here
    empty_at: int = -1  # the board's generation when a pull found it empty


@dataclass(frozen=True, slots=True)
class JobTerms:
    """What the worker knows of each job, as the puller asks: its weight and its rate here."""

    weight: Callable[[str], int]
    rate: Callable[[str], float | None]  # pages/s this worker may fetch of it; None: no cap


class ShardPuller:
    def __init__(
        self,
        owner: Ownership,
        js: JetStreamContext,
        settings: Settings,
        lanes: tuple[LaneBoard, ControlWatch, JobRates, JobTerms],
        holding: Capacity,
        keepalive: KeepAlive,
        process: Callable[[Msg, Ownership, asyncio.Event], Awaitable[None]],
    ) -> None:
        self.owner = owner
        self._js = js
        self._settings = settings
        self._board, self._control, self._rates, self._terms = lanes
        self._schedule = Schedule(settings.priority_weights, settings.priority_slack)
        self._subs: dict[Lane, _LaneSub] = {}
        self._holding = holding
        self._keepalive = keepalive
        self._process = process
        self._stopping = asyncio.Event()
        self._abandoned = asyncio.Event()
        self._idle_cuts: list[Cut] = []  # the idle waits in progress, cut by a wake
        self._woken = asyncio.Event()
        self.done = asyncio.Event()

    def stop(self) -> None:
        """Stop fetching; what was fetched is still crawled."""
        self._stopping.set()
        for lane in self._subs.values():
            lane.cut.set()
        self.wake()
        self._holding.wake_all()  # a loop waiting for room sees it

    def abandon(self) -> None:
        """Stop fetching at once; fetched tasks not yet started are handed back."""
        self._abandoned.set()
        self.stop()

    def wake(self) -> None:
        """Look at the lanes again now: one gained tasks, or a job's state changed."""
        self._woken.set()
        self._cut_idle()

    async def run(self) -> None:
        self._board.on_gain(self.owner.shard, self.wake)
        try:
            async with asyncio.TaskGroup() as tg:
                while await self._holding.wait_free(unless=self._stopping):
                    for lane, msgs in await self._next():
                        await self._start(tg, lane, msgs)
                for lane in list(self._subs):
                    await self._start(tg, lane, await self._lingering(lane))
        finally:
            self._board.on_gain(self.owner.shard, None)
            for own in self._subs.values():
                if own.sub is not None:
                    try:
                        await own.sub.unsubscribe()
                    except NatsError as e:
                        log.debug("unsubscribe on shard %d failed: %r", self.owner.shard, e)
            self.done.set()

    # ------------------------------------------------------------------ which lane

    def _ready(self) -> dict[Lane, int]:
        """Each lane that can give tasks now, and how many at most."""
        ready = {}
        generation = self._board.generation
        for lane, count in self._board.lanes(self.owner.shard).items():
            _, job = lane
            own = self._subs.get(lane)
            available = count - (own.held if own else 0)
            if available <= 0 or (own is not None and own.empty_at == generation):
                continue
            state = self._control.state(job)
            if state == PAUSED:
                continue
            rate = self._terms.rate(job) if self._control.runs(job) else None
            if rate is not None:
                available = min(available, self._rates.available(job, rate))
                if available <= 0:
                    continue
            ready[lane] = available
        return ready

    async def _next(self) -> list[tuple[Lane | None, list[Msg]]]:
        """The next tasks to start, by lane."""
        self._woken.clear()
        ready = self._ready()
        pick = self._schedule.next(
            ready, min(MAX_BATCH, self._holding.free_slots), self._terms.weight
        )
        if pick is None:
            return await self._idle()
        lane, n = pick
        own = self._subs.setdefault(lane, _LaneSub())
        msgs = await self._pull(lane, own, n, READY_WAIT_S, own.cut)
        if len(msgs) < n and (not msgs or msgs.drained):
            # Empty until the board's next poll. A short batch the server did not end (it
            # delivers late on a busy machine) is not: taking only the other jobs' lanes
            # meanwhile, in whole rooms, would break the shares of their weights.
            own.empty_at = self._board.generation
        self._took(lane, msgs, ready)
        return [(lane, msgs)]

    def _took(self, lane: Lane, msgs: list[Msg], ready: dict[Lane, int]) -> None:
        if not msgs:
            return
        self._schedule.took(lane, len(msgs), {level for level, _ in ready}, self._terms.weight)
        if self._control.runs(lane[1]) and self._terms.rate(lane[1]) is not None:
            self._rates.spend(lane[1], len(msgs))

    async def _idle(self) -> list[tuple[Lane | None, list[Msg]]]:
        """Nothing to take: wait on every running lane taken from before for its next task, at
        once, until one gets some or a wake (the board sees a lane gain, a job's state moves)."""
        lanes = [
            lane
            for lane, own in self._subs.items()
            if own.sub is not None
            and self._control.runs(lane[1])
            and self._terms.rate(lane[1]) is None
        ]
        if not lanes:
            await wait_set(self._woken, self._settings.lanes_poll_s)
            return []
        # one cut a subscription (a Cut holds its pull's deadline); a wake or a first arrival
        # cuts them all
        self._idle_cuts = cuts = [Cut() for _ in lanes]
        if self._woken.is_set() or self._stopping.is_set():
            self._cut_idle()
        room = min(MAX_BATCH, self._holding.free_slots)

        async def wait_on(lane: Lane, cut: Cut) -> tuple[Lane | None, list[Msg]]:
            own = self._subs[lane]
            try:
                msgs = await self._pull(lane, own, room, PULL_WAIT_S, cut)
            finally:
                own.cut.requests_end = max(own.cut.requests_end, cut.requests_end)
            if msgs:
                self._cut_idle()
                self._took(lane, msgs, {lane: len(msgs)})
            return lane, msgs

        try:
            return list(await asyncio.gather(*map(wait_on, lanes, cuts)))
        finally:
            self._idle_cuts = []

    def _cut_idle(self) -> None:
        for cut in self._idle_cuts:
            cut.set()

    # ------------------------------------------------------------------ pulling

    async def _pull(self, lane: Lane, own: _LaneSub, n: int, wait_s: float, cut: Cut) -> Pulled:
        try:
            if own.sub is None:
                own.sub = await self._subscribe(lane)
            return await pull(own.sub, max(1, n), wait_s, cut)
        except TimeoutError:
            return Pulled()  # idle lane (nats-py raises a TimeoutError subclass too)
        except NatsError as e:
            # The consumer may be gone (removed when idle): made again at the next pull.
            log.warning("pull on shard %d lane %s failed: %r", self.owner.shard, lane, e)
            own.sub = None
            await wait_set(self._stopping, RETRY_PAUSE_S)
            return Pulled()

    async def _subscribe(self, lane: Lane) -> JetStreamContext.PullSubscription:
        level, job = lane
        config = lane_config(self._settings, self.owner.shard, level, job)
        stream = shard_tasks_stream(self.owner.shard, self._settings)
        await self._js.add_consumer(stream, config)
        return await self._js.pull_subscribe_bind(
            durable=lane_consumer(self.owner.shard, level, job), stream=stream
        )

    async def _start(self, tg: asyncio.TaskGroup, lane: Lane | None, msgs: list[Msg]) -> None:
        own = self._subs.get(lane) if lane is not None else None
        for msg in msgs:
            if await self._holding.take(unless=self._abandoned):
                if own is not None:
                    own.held += 1
                tg.create_task(self._run_one(msg, own))
            else:
                await msg.nak()  # lease lost: the next owner takes it at once

    async def _lingering(self, lane: Lane) -> list[Msg]:
        """Tasks a pull request delivered after its fetch returned: take them before leaving.

        ``pull`` can return (with what it has, or cut short) before the server's pull request
        expires; what the request delivers later lands in this subscription's queue, where the
        next fetch would find it. A puller that is leaving has no next fetch: without this,
        those tasks would sit unacknowledged until AckWait, delaying a handover by that much.
        ``end_requests`` ends the requests at once on a single server; in a cluster it waits
        them out (at most ``PULL_WAIT_S``).
        """
        own = self._subs[lane]
        if own.sub is None:
            return []
        try:
            return await end_requests(own.sub, own.cut)
        except NatsError as e:  # the connection is gone: JetStream redelivers after AckWait
            log.warning("could not end the pull requests of shard %d: %r", self.owner.shard, e)
            return []

    async def _run_one(self, msg: Msg, own: _LaneSub | None) -> None:
        self._keepalive.hold(msg)
        try:
            await self._process(msg, self.owner, self._abandoned)
        except NatsError as e:
            # The ack or nak did not reach the server: JetStream redelivers after AckWait.
            log.warning("task on shard %d left unacknowledged: %r", self.owner.shard, e)
        finally:
            self._keepalive.release(msg)
            self._holding.release()
            if own is not None:
                own.held -= 1
