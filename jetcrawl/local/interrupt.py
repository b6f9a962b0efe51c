"""Stopping a local crawl: Ctrl-C as events the crawl's loops check."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from jetcrawl.contract.errors import JetcrawlError

T = TypeVar("T")
ABANDONED_STEP_WAIT_S = 0.5  # how long an interrupted step may take to end
INTERRUPT_GRACE_S = 2.0  # after Ctrl-C, how long the services have to stop before they are killed


class Interrupted(JetcrawlError):
    """The user stopped the crawl (Ctrl-C); every service was stopped."""


class Interrupt:
    """Ctrl-C for a local crawl: the first asks for a clean stop, and hurries it ``grace_s``
    later (the services still running are killed); a second one hurries it at once.

    Signals set events that the crawl's loops check; nothing is cancelled, because on Python
    3.11 ``asyncio.wait_for`` (under nats-py's fetch and requests) can swallow a cancellation.
    """

    def __init__(self, grace_s: float = INTERRUPT_GRACE_S) -> None:
        self.requested = asyncio.Event()
        self.hurry = asyncio.Event()
        self._grace_s = grace_s

    def __call__(self) -> None:
        if self.requested.is_set():
            self.hurry.set()
            return
        self.requested.set()
        asyncio.get_running_loop().call_later(self._grace_s, self.hurry.set)

    async def unless_requested(self, step: Awaitable[T]) -> T:
        """``step``'s result, or ``Interrupted`` as soon as a stop is asked for (the step is
        cancelled): a crawl stops at once while it connects or waits for a server."""
        task = asyncio.ensure_future(step)
        stop = asyncio.ensure_future(self.requested.wait())
        try:
            await asyncio.wait([task, stop], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if not task.done():
            # Abandoned: cancelled, and not awaited for long, since under nats-py a cancellation
            # can be swallowed (Python 3.11's wait_for) and the step run on to its timeout.
            task.cancel()
            await asyncio.wait([task], timeout=ABANDONED_STEP_WAIT_S)
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: whatever it raised on its way out is moot
            raise Interrupted("interrupted while starting")
        return task.result()
