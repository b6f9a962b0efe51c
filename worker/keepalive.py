"""In-progress acks for every task a worker holds, so that no held task outlives AckWait.

A task is held from its pull until it is acked, nak'ed or terminated: while its robots.txt is
read, while it waits for its host's turn (:mod:`jetcrawl.worker.politeness`), and while it is
fetched (``total_timeout_s`` may exceed AckWait). Every task held for a third of AckWait since its
delivery or its last in-progress ack gets another, so JetStream never redelivers a task the worker
still has, and the delivery count stays that of the attempt. A worker that dies stops sending them:
its tasks come back after AckWait, as before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from nats.aio.msg import Msg
from nats.errors import Error as NatsError

__all__ = ["KeepAlive"]

log = logging.getLogger(__name__)


class KeepAlive:
    def __init__(self, ack_wait_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._every_s = ack_wait_s / 3  # the longest a held task goes without an ack
        self._clock = clock
        self._held: dict[int, tuple[Msg, float]] = {}  # id(msg) -> (msg, last delivery or ack)
        self.sent = 0

    @property
    def held(self) -> int:
        return len(self._held)

    def hold(self, msg: Msg) -> None:
        """Keep ``msg`` alive from now (it was delivered just now) until ``release(msg)``."""
        self._held[id(msg)] = (msg, self._clock())

    def release(self, msg: Msg) -> None:
        del self._held[id(msg)]

    async def run(self) -> None:
        """Send the due in-progress acks, twice per interval, until cancelled."""
        while True:
            await asyncio.sleep(self._every_s / 2)
            now = self._clock()
            due = [
                (key, msg)
                for key, (msg, since) in self._held.items()
                if now - since >= self._every_s
            ]
            for key, msg in due:
                if key not in self._held:
                    continue  # finished while we were sending
                self._held[key] = (msg, now)
                try:
                    await msg.in_progress()
                except NatsError as e:  # disconnected: the task may come back after AckWait
                    log.debug("in-progress ack failed: %r", e)
                self.sent += 1
