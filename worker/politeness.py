"""Per-host politeness: a small ``Slot`` per host and one scheduling function, ``turn_at``.

A host's requests start at least ``delay_s`` apart — ``max(host_delay_s, min(Crawl-delay,
max_crawl_delay_s))`` — with at most ``host_concurrency`` in flight, and none while the host is
paused by a 429 or 503 ``Retry-After``. One host maps to one shard and one shard to one worker,
so the worker that owns the shard holds the host's slot for the whole mesh.

No head-of-line blocking. A task waits for its host's turn as a coroutine that holds no fetch slot
(``Capacity``): the worker's fetch slots go to whichever host is ready, and a slow host's tasks
wait beside the fast hosts' instead of in front of them. Waiting tasks are kept alive with
in-progress acks (:mod:`jetcrawl.worker.keepalive`), so they may wait longer than AckWait, and
waiting costs no JetStream delivery: it is never counted as an attempt. A host's waiting line goes
by priority level (0 first), then by arrival; a task lets at most ``priority_slack`` tasks of
lower levels go ahead of it, so a level waits behind the others but does not starve.

The waiting room is bounded: the pull loops hold at most ``concurrency`` tasks and a room of
seconds of the worker's pace (or ``buffer_max``, :mod:`jetcrawl.worker.capacity`), and stop
pulling when that is full. So that a slow host cannot fill it and block the fast hosts'
tasks queued behind its own in the shard, a full room makes room (``make_room``): the waiting
tasks whose turn is furthest away, and beyond the horizon (AckWait), are handed back to JetStream
with ``nak(delay)`` timed for their own turn on the host's schedule, moved only off a turn already
promised to another hand-back of that host. A waiter is chosen once, and while chosen ones are on
their way out they count as the room being made, so a burst of tasks entering a full holding
hands back no more, and no later, than one entry would. JetStream counts that nak
as a delivery, so the worker remembers each task's hand-backs (by stream and sequence) and subtracts
them from the delivery count to get the attempt number (:mod:`jetcrawl.worker.crawl`); the task
consumers' MaxDeliver leaves room for ``max_deferrals`` of them, and a task handed back that often
is not handed back again. The memory is the owner's: after a crash or a handover a task's earlier
hand-backs count as attempts (it gets fewer retries, never more).

A shard's politeness state does not travel with it; instead its new owner counts the handover as
a request to each of the shard's hosts (``handover``): the previous owner stopped fetching before
the shard became ours (it drained before releasing, or its lease deadline passed before etcd could
expire its lease, :mod:`jetcrawl.registry.registry`), so no host of the shard hears from two
workers less than its delay apart. It costs one host delay per shard moved, and needs no state
written while crawling.

Alternatives not taken: nak'ing every task whose host is not ready (each wait would burn an
attempt, and the retry budget and poison detection with it), and waiting without a bound (a
large slow site would pin max_ack_pending tasks per shard in memory and still block its shard).
"""

from __future__ import annotations

import asyncio
import bisect
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from jetcrawl.contract.settings import Settings
from jetcrawl.worker.capacity import Capacity

__all__ = ["Deferred", "Politeness", "Slot", "Turn", "turn_at"]

MAX_SLOTS = 10_000  # beyond this, slots of hosts that constrain nothing any more are dropped
ROOM_BATCH = 32  # hand-backs per make_room, at most
_EWMA = 0.2  # weight of the latest request in a slot's mean request time


class _Waiter:
    """A task waiting for its host's turn. Woken by a plain future, not an Event: a wait then
    costs no task (an ``asyncio.Event`` raced against a timeout costs two tasks and an
    ``asyncio.wait`` per wait, and most tasks wait at least once)."""

    __slots__ = ("_future", "_woken", "deferrable", "deferred_for", "level", "passed", "wants_slot")

    def __init__(self, deferrable: bool, level: int = 0) -> None:
        self.deferrable = deferrable
        self.level = level  # its task's priority level: a lower one goes first
        self.passed = 0  # waiters of lower levels that went ahead of it in its host's line
        self.deferred_for: float | None = None  # chosen to be handed back: nak with this delay
        self.wants_slot = False  # its turn has come and it waits for a fetch slot
        self._woken = False  # woken while not sleeping: the next sleep returns at once
        self._future: asyncio.Future[None] | None = None

    def wake(self) -> None:
        """Have it look again: now if it sleeps, else right after its next check."""
        self._woken = True
        if self._future is not None:
            _settle(self._future)

    async def sleep(self, at_most_s: float | None) -> None:
        """Until woken, or ``at_most_s`` has passed."""
        if not self._woken:
            loop = asyncio.get_running_loop()
            future = self._future = loop.create_future()
            timer = None if at_most_s is None else loop.call_later(at_most_s, _settle, future)
            try:
                await future
            finally:
                self._future = None
                if timer is not None:
                    timer.cancel()
        self._woken = False


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


@dataclass(slots=True)
class Slot:
    """One host's politeness state."""

    delay_s: float
    concurrency: int
    active: int = 0  # requests in flight
    last_start: float = -math.inf  # when the latest request started (monotonic clock)
    paused_until: float = -math.inf  # Retry-After
    mean_s: float = 0.0  # moving mean of request times, to project turns of slow servers
    promised: list[float] = field(default_factory=list)  # hand-backs' turns, ascending
    waiting: deque[_Waiter] = field(default_factory=deque)  # by level, then in arrival order

    def idle_at(self, now: float) -> bool:
        """Nothing waits or runs, and nothing the slot remembers constrains a next request."""
        return (
            not self.waiting
            and self.active == 0
            and self.last_start + self.delay_s <= now
            and self.paused_until <= now
            and (not self.promised or self.promised[-1] <= now)
        )

    def promise(self, at: float, now: float) -> float:
        """Book a hand-back's turn: ``at``, or the first turn after it that is at least a delay
        from every turn promised before (a promised task comes back and needs its own turn)."""
        del self.promised[: bisect.bisect_right(self.promised, now)]  # come back already
        i = bisect.bisect_right(self.promised, at - self.delay_s)
        while i < len(self.promised) and self.promised[i] < at + self.delay_s:
            at = self.promised[i] + self.delay_s
            i += 1
        self.promised.insert(i, at)
        return at


def turn_at(slot: Slot, now: float, ahead: int = 0) -> float:
    """When a request to ``slot``'s host may start, with ``ahead`` requests to go before it.

    The scheduling rule: not before ``delay_s`` after the previous start (spacing is start to
    start, as a server sees requests arrive), not while paused. With ``ahead > 0`` it is a
    projection: each request ahead takes a delay, or the host's mean request time shared by its
    connections when that is longer. Whether a connection is free is the caller's question.
    """
    step = max(slot.delay_s, slot.mean_s / slot.concurrency)
    return max(now, slot.paused_until, slot.last_start + slot.delay_s + ahead * step)


@dataclass(frozen=True, slots=True)
class Turn:
    """A granted request slot: give it back with ``Politeness.done``."""

    host: str
    started: float


@dataclass(frozen=True, slots=True)
class Deferred:
    """The waiting task was handed back: ``nak`` it with this delay."""

    delay_s: float


class Politeness:
    def __init__(
        self,
        settings: Settings,
        fetch_slots: Capacity,
        holding: Capacity,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # --- configuration
        self._host_delay_s = settings.host_delay_s
        self._host_concurrency = settings.host_concurrency
        self._max_crawl_delay_s = settings.max_crawl_delay_s
        self._max_pause_s = settings.max_retry_after_s
        self._horizon_s = settings.ack_wait_s
        self._overtakes = settings.priority_slack
        self._clock = clock
        # --- what waiting tasks need: a fetch slot, and room in the worker's holding
        self._fetch_slots = fetch_slots
        self._holding = holding
        # --- the slots, least recently used first; the hosts that have tasks waiting
        self._slots: OrderedDict[str, Slot] = OrderedDict()
        self._queued: dict[str, Slot] = {}
        # Tasks whose turn has come, in the order they asked for a fetch slot: a freed slot wakes
        # the first of them only (waking every host's head for each slot woke tasks to wait again).
        self._slot_waiters: deque[_Waiter] = deque()
        self._prune_above = MAX_SLOTS
        # When this worker came to own each shard (monotonic): a request by the previous owner.
        self._handed_over: dict[int, float] = {}
        # --- counts, for stats and tests
        self.waiting = 0
        self.deferred = 0  # waiting tasks handed back, ever
        self._leaving = 0  # chosen to be handed back, not yet out of turn()

    def delay_for(self, crawl_delay_s: float | None) -> float:
        """The host's delay: ours, raised by its robots.txt Crawl-delay up to the cap."""
        if crawl_delay_s is None:
            return self._host_delay_s
        return max(self._host_delay_s, min(crawl_delay_s, self._max_crawl_delay_s))

    def handover(self, shard: int) -> None:
        """``shard`` is ours from now: its hosts' first turns here come a delay from now."""
        self._handed_over[shard] = self._clock()

    def slot(self, host: str) -> Slot | None:
        return self._slots.get(host)

    async def turn(
        self,
        host: str,
        crawl_delay_s: float | None,
        *,
        deferrable: bool,
        unless: asyncio.Event,
        shard: int | None = None,
        level: int = 0,
    ) -> Turn | Deferred | None:
        """Wait for a turn to request ``host`` (of ``shard``): a ``Turn``, ``Deferred``, or None
        if ``unless``. The host's waiting line is kept by priority ``level``, then in order of
        arrival, and a task lets at most ``priority_slack`` of lower levels go ahead of it: a
        worker holds tasks of every level, and its holding, not its pulls, decides which of them
        a host serves first.

        A granted turn holds a fetch slot and one of the host's connections until ``done``.
        Whoever sets ``unless`` calls ``wake_all()`` so that a waiting task sees it.
        """
        slot = self._slot(host)
        slot.delay_s = self.delay_for(crawl_delay_s)
        if shard is not None:
            slot.last_start = max(slot.last_start, self._handed_over.get(shard, -math.inf))
        waiter = _Waiter(deferrable, level)
        _enqueue(slot.waiting, waiter, self._overtakes)
        self._queued[host] = slot
        self.waiting += 1
        try:
            if self._holding.free_slots <= 0:
                self.make_room()
            while True:
                if waiter.deferred_for is not None:
                    return Deferred(waiter.deferred_for)
                if unless.is_set():
                    return None
                at_most_s = None
                if slot.waiting[0] is waiter and slot.active < slot.concurrency:
                    now = self._clock()
                    at = turn_at(slot, now)
                    if at > now:
                        at_most_s = at - now
                    elif self._fetch_slots.try_take():
                        return self._grant(host, slot, now)
                    elif not waiter.wants_slot:
                        waiter.wants_slot = True
                        self._slot_waiters.append(waiter)
                self._pass_fetch_slot()  # a free one this task cannot use yet: to the next in line
                await waiter.sleep(at_most_s)
        finally:
            waiter.wants_slot = False
            if waiter.deferred_for is not None:
                self._leaving -= 1
            if waiter in slot.waiting:  # not granted: deferred, abandoned or cancelled
                slot.waiting.remove(waiter)
                self.waiting -= 1
                self._dequeued(host, slot)
                self._pass_fetch_slot()

    def done(self, turn: Turn, *, pause_s: float | None = None) -> None:
        """Give back a turn; ``pause_s`` (a Retry-After) pauses the host from now."""
        slot = self._slots[turn.host]
        now = self._clock()
        slot.active -= 1
        slot.mean_s = (1 - _EWMA) * slot.mean_s + _EWMA * (now - turn.started)
        self._fetch_slots.release()
        if pause_s is not None:
            self.pause(turn.host, pause_s)
        _wake_head(slot)
        self._pass_fetch_slot()

    def pause(self, host: str, seconds: float) -> None:
        """No request to ``host`` for ``seconds`` (capped by ``max_retry_after_s``)."""
        slot = self._slot(host)
        slot.paused_until = max(slot.paused_until, self._clock() + min(seconds, self._max_pause_s))
        _wake_head(slot)
        if self._holding.free_slots <= 0:
            self.make_room()

    def make_room(self) -> int:
        """Hand back the waiting tasks whose turn is furthest, beyond the horizon; how many.

        At most ``ROOM_BATCH`` are on their way out at once: those chosen by an earlier call
        that have not left yet are the room being made, and are never chosen again.
        """
        wanted = ROOM_BATCH - self._leaving
        if wanted <= 0:
            return 0
        now = self._clock()
        far: list[tuple[float, Slot, _Waiter]] = []
        for slot in self._queued.values():
            if turn_at(slot, now, len(slot.waiting) - 1) - now <= self._horizon_s:
                continue  # even its last waiter's turn is near: the common case, one check
            ahead = 0
            for waiter in slot.waiting:
                if waiter.deferred_for is not None:
                    continue  # leaving: no longer ahead of anyone
                at = turn_at(slot, now, ahead)
                if at - now > self._horizon_s and waiter.deferrable:
                    far.append((at, slot, waiter))
                ahead += 1
        far.sort(key=lambda entry: entry[0], reverse=True)
        chosen = sorted(far[:wanted], key=lambda entry: entry[0])
        for at, slot, waiter in chosen:
            waiter.deferred_for = slot.promise(at, now) - now
            waiter.wake()
        self._leaving += len(chosen)
        self.deferred += len(chosen)
        return len(chosen)

    @property
    def hosts_waiting(self) -> int:
        """Hosts with tasks waiting for their turn."""
        return len(self._queued)

    def hosts_paused(self) -> int:
        """Of those, the hosts a Retry-After pauses now."""
        now = self._clock()
        return sum(1 for slot in self._queued.values() if slot.paused_until > now)

    def handed_back(self) -> tuple[int, float | None]:
        """Hand-backs whose turn is still to come, and the furthest of those turns (clock time)."""
        now = self._clock()
        due = [t for slot in self._slots.values() for t in slot.promised if t > now]
        return len(due), max(due, default=None)

    def wake_all(self) -> None:
        """Have every waiting task look again (an ``unless`` event of some was set)."""
        for slot in self._queued.values():
            for waiter in slot.waiting:
                waiter.wake()

    # ------------------------------------------------------------------ internals

    def _slot(self, host: str) -> Slot:
        slot = self._slots.get(host)
        if slot is None:
            slot = self._slots[host] = Slot(self._host_delay_s, self._host_concurrency)
            if len(self._slots) > self._prune_above:
                self._prune()
        else:
            self._slots.move_to_end(host)
        return slot

    def _pass_fetch_slot(self) -> None:
        """If a fetch slot is free, wake the first task still waiting for one."""
        while self._slot_waiters and self._fetch_slots.free_slots > 0:
            waiter = self._slot_waiters.popleft()
            if waiter.wants_slot:
                waiter.wants_slot = False
                waiter.wake()
                return

    def _grant(self, host: str, slot: Slot, now: float) -> Turn:
        slot.waiting.popleft()  # turn() clears the waiter's wants_slot on its way out
        self.waiting -= 1
        slot.active += 1
        slot.last_start = now
        self._dequeued(host, slot)
        return Turn(host, now)

    def _dequeued(self, host: str, slot: Slot) -> None:
        if slot.waiting:
            slot.waiting[0].wake()  # the new head: its turn may have come
        else:
            self._queued.pop(host, None)

    def _prune(self) -> None:
        """Drop the slots that constrain nothing, least recently used first (amortized)."""
        now = self._clock()
        for host in [h for h, s in self._slots.items() if s.idle_at(now)]:
            if len(self._slots) <= MAX_SLOTS // 2:
                break
            del self._slots[host]
        self._prune_above = max(MAX_SLOTS, 2 * len(self._slots))


def _enqueue(line: deque[_Waiter], waiter: _Waiter, overtakes: int) -> None:
    """Put ``waiter`` behind every waiter of its level or a lower one, except those already
    overtaken ``overtakes`` times: a level waits, it does not starve."""
    if not line or line[-1].level <= waiter.level:
        line.append(waiter)  # the common case: one level on the host, or the lowest arrives
        return
    at = len(line)
    while at > 0 and line[at - 1].level > waiter.level and line[at - 1].passed < overtakes:
        at -= 1
        line[at].passed += 1
    line.insert(at, waiter)  # a head put behind finds out when it next looks, and waits


def _wake_head(slot: Slot) -> None:
    if slot.waiting:
        slot.waiting[0].wake()
