"""The worker's report in KV ``crawl_workers``: its waiting room and its hand-backs.

Tasks handed back with ``nak(delay)`` (:mod:`jetcrawl.worker.politeness`) are unacked in JetStream
and held by no worker, so a crawl that waits on them looks stuck from the streams alone. The report
says how many are still due and when the last of them is, for ``jetcrawl status``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from nats.errors import Error as NatsError
from nats.js.kv import KeyValue

from jetcrawl.contract.messages import WorkerReport

__all__ = ["Reporter"]

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
