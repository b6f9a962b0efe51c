"""The worker's report in KV ``crawl_workers``: its waiting room, its hand-backs, its jobs.

Tasks handed back with ``nak(delay)`` (:mod:`jetcrawl.worker.politeness`) are unacked in JetStream
and held by no worker, so a crawl that waits on them looks stuck from the streams alone. The report
says how many are still due and when the last of them is, for ``jetcrawl status``; and each job's
pages, errors and rate here (:class:`JobTally`), for ``jetcrawl status --job`` without reading
every result.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from nats.errors import Error as NatsError
from nats.js.kv import KeyValue

from jetcrawl.contract.messages import JobActivity, WorkerReport

__all__ = ["JobTally", "Reporter"]

log = logging.getLogger(__name__)


class Reporter:
    def __init__(
        self, bucket: KeyValue, worker_id: str, every_s: float, read: Callable[[], WorkerReport]
    ) -> None:
        self._bucket = bucket
        self._key = worker_id
        self._every_s = every_s
        self._read = read

    async def report(self) -> None:
        """Write one report now (a failed write is logged: the next one may get through)."""
        try:
            await self._bucket.put(self._key, self._read().to_wire())
        except (TimeoutError, NatsError) as e:
            log.warning("worker report to KV crawl_workers failed: %r", e)

    async def run(self) -> None:
        """Report every ``every_s`` until cancelled."""
        while True:
            await self.report()
            await asyncio.sleep(self._every_s)


def wall_time(clock_time: float, clock: Callable[[], float] = time.monotonic) -> float:
    """A ``clock`` reading (monotonic) as unix time."""
    return time.time() + (clock_time - clock())


class JobTally:
    """Each job's results stored here, errors among them, and tasks settled (cancelled)."""

    ERRORS = frozenset({"failed", "blocked"})

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._counts: dict[str, list[int]] = {}  # job -> [pages, errors, settled]
        self._last: tuple[float, dict[str, int]] = (clock(), {})  # pages at the last reading

    def result(self, job: str, outcome: str) -> None:
        counts = self._counts.setdefault(job, [0, 0, 0])
        counts[0] += 1
        if outcome in self.ERRORS:
            counts[1] += 1

    def settled(self, job: str) -> None:
        self._counts.setdefault(job, [0, 0, 0])[2] += 1

    def read(self) -> dict[str, JobActivity]:
        """Each job's totals, and its pages per second since the previous reading."""
        now = self._clock()
        then, pages_then = self._last
        elapsed = max(now - then, 1e-9)
        out = {
            job: JobActivity(pages, errors, (pages - pages_then.get(job, 0)) / elapsed, settled)
            for job, (pages, errors, settled) in self._counts.items()
        }
        self._last = (now, {job: counts[0] for job, counts in self._counts.items()})
        return out
