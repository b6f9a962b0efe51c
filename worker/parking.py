"""Tasks of a paused job that the worker had taken already: parked until the job runs again.

A job paused (KV ``crawl_control``) has its lanes left alone by every shard's puller; the tasks
taken before are parked at their next step (before robots.txt, or when their host's turn comes),
give their place in the holding back to other jobs' tasks, and are kept alive by in-progress acks
as every held task is. So a pause costs them no delivery, and no attempt. They go on when the job
resumes, are settled when it is cancelled, and are handed back (``nak``) when the worker lets
their shard go or stops.
"""

from __future__ import annotations

import asyncio
from typing import Final, Literal

from jetcrawl.plumbing.control import ControlWatch
from jetcrawl.worker.capacity import Capacity

__all__ = ["LEAVING", "Parking"]

LEAVING: Final = "leaving"
Unparked = Literal["running", "cancelled", "leaving"]


class Parking:
    def __init__(self, control: ControlWatch, holding: Capacity) -> None:
        self._control = control
        self._holding = holding
        self._leaving: dict[int, asyncio.Event] = {}  # shard -> set when it is let go
        self.parked = 0

    async def park(self, job: str, shard: int, abandoned: asyncio.Event) -> Unparked:
        """Until ``job`` runs or is cancelled (which), or its shard is let go (``LEAVING``)."""
        leaving = self._leaving.setdefault(shard, asyncio.Event())
        self._holding.release()
        self.parked += 1
        waits = [
            asyncio.ensure_future(self._control.wait_runs_or_cancelled(job)),
            asyncio.ensure_future(leaving.wait()),
            asyncio.ensure_future(abandoned.wait()),
        ]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
            self.parked -= 1
            self._holding.force_take()  # the puller gives it back when the task ends
        if leaving.is_set() or abandoned.is_set():
            return LEAVING
        state = self._control.state(job)
        return "cancelled" if state == "cancelled" else "running"

    def arrive(self, shard: int) -> None:
        """``shard`` is ours (again)."""
        self._leaving[shard] = asyncio.Event()

    def leave(self, shard: int | None = None) -> None:
        """Hand back the parked tasks of ``shard`` (None: of every shard)."""
        for s, event in self._leaving.items():
            if shard is None or s == shard:
                event.set()
