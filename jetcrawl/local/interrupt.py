"""Stopping a local crawl: Ctrl-C as events the crawl's loops check, and a sleep that ends early."""

from __future__ import annotations

import asyncio
import contextlib

from jetcrawl.contract.errors import JetcrawlError


class Interrupted(JetcrawlError):
    """The user stopped the crawl (Ctrl-C); every service was stopped."""


class Interrupt:
    """Ctrl-C for a local crawl: the first asks for a clean stop, a second one hurries it.

    Signals set events that the crawl's loops check; nothing is cancelled, because on Python
    3.11 ``asyncio.wait_for`` (under nats-py's fetch and requests) can swallow a cancellation.
    """

    def __init__(self) -> None:
        self.requested = asyncio.Event()
        self.hurry = asyncio.Event()

    def __call__(self) -> None:
        (self.hurry if self.requested.is_set() else self.requested).set()


async def pause(event: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds`` unless ``event`` is set first."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)
