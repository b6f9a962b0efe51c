"""A counting limit shared by every shard's pull loop; the worker has two.

The holding (``concurrency`` plus a waiting room of at most ``waiting_max``): a pull loop only asks
JetStream for more tasks while a place is free, sized to the free places, and takes one per task
before starting it; the task gives it back when acked or handed back. A loop that fetched while
another filled the places holds its few fetched tasks until places free up (at most one fetch
batch per shard). The room follows the worker's pace (``room_for``): tasks held past a third of
AckWait cost an in-progress ack each, and past AckWait a hand-back, so a polite crawl, slow by
design, holds seconds of work rather than a minute of it.

The fetch slots (``concurrency``): a task takes one for its host's turn only
(:mod:`jetcrawl.worker.politeness`, with ``try_take``; politeness passes a freed one to the next
task in line), so requests in flight never exceed ``concurrency`` while tasks waiting for their
host hold none.
"""

from __future__ import annotations

import asyncio

from jetcrawl.contract.settings import Settings

# The waiting room holds about this share of AckWait's worth of tasks at the worker's pace: the
# mean task then waits well within the in-progress ack's interval (a third of AckWait).
ROOM_SHARE_OF_ACK_WAIT = 1 / 6
ROOM_FLOOR_PER_SLOT = 4  # the room's least size, per fetch slot: for a worker with no pace yet


def room_for(settings: Settings, pace_per_s: float) -> int:
    """The waiting room of a worker that finishes ``pace_per_s`` tasks a second: ``buffer_max``
    if set, else its tasks of ``ack_wait_s / 6`` seconds, within 4 and 64 x concurrency."""
    if settings.buffer_max:
        return settings.buffer_max
    paced = int(pace_per_s * settings.ack_wait_s * ROOM_SHARE_OF_ACK_WAIT)
    return max(ROOM_FLOOR_PER_SLOT * settings.concurrency, min(paced, settings.waiting_max))


class Capacity:
    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._used = 0
        # Waiting for a free slot: woken all at once when one frees (each looks again), or by
        # wake_all() when whoever set a waiter's ``unless`` event calls it. Plain futures: a
        # wait costs no task (pull loops wait here about once per task).
        self._waiters: list[asyncio.Future[None]] = []

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def in_flight(self) -> int:
        return self._used

    @property
    def free_slots(self) -> int:
        return self._limit - self._used

    async def wait_free(self, unless: asyncio.Event) -> bool:
        """Wait until a slot is free (True) or ``unless`` is set (False); who sets ``unless``
        calls ``wake_all()`` so that a waiter sees it."""
        while self._used >= self._limit:
            if unless.is_set():
                return False
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter.cancelled() and waiter in self._waiters:  # cancelled while waiting
                    self._waiters.remove(waiter)
        return not unless.is_set()

    async def take(self, unless: asyncio.Event) -> bool:
        """Take one slot, waiting for it; False (nothing taken) if ``unless`` is set first."""
        while self._used >= self._limit:
            if not await self.wait_free(unless):
                return False
        self._used += 1
        return True

    def try_take(self) -> bool:
        """Take one slot if one is free, without waiting."""
        if self._used >= self._limit:
            return False
        self._used += 1
        return True

    def force_take(self) -> None:
        """Take one slot even beyond the limit: a task parked without its place (a paused job's,
        :mod:`jetcrawl.worker.parking`) takes it back when it goes on; the loops see less room."""
        self._used += 1

    def resize(self, limit: int) -> None:
        """A new limit; below what is taken, nothing more is taken until enough are released."""
        grew, self._limit = limit > self._limit, limit
        if grew and self._waiters:
            self.wake_all()

    def release(self) -> None:
        self._used -= 1
        assert self._used >= 0, "released more slots than taken"
        if self._waiters:
            self.wake_all()

    def wake_all(self) -> None:
        """Wake every waiter to look again (a slot freed, or an ``unless`` event was set)."""
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
