"""A counting limit shared by every shard's pull loop; the worker has two.

The holding (``concurrency + waiting_max``): a pull loop only asks JetStream for more tasks while a
place is free, sized to the free places, and takes one per task before starting it; the task gives
it back when acked or handed back. A loop that fetched while another filled the places holds its
few fetched tasks until places free up (at most one fetch batch per shard).

The fetch slots (``concurrency``): a task takes one for its host's turn only
(:mod:`jetcrawl.worker.politeness`, with ``try_take``; politeness passes a freed one to the next
task in line), so requests in flight never exceed ``concurrency`` while tasks waiting for their
host hold none.
"""

from __future__ import annotations

import asyncio


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
