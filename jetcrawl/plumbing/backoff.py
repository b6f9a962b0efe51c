"""Waiting between tries: the one exponential backoff, and the one wait that an event cuts short.

Every retry loop takes its delay from :func:`backoff_s` (the first delay, doubled per try, capped,
optionally jittered), and every "sleep unless stopped" is :func:`wait_set`. ``wait_set`` waits
under ``asyncio.timeout``, not ``asyncio.wait_for``: on Python 3.11 ``wait_for`` can swallow a
cancellation that arrives as its timeout fires, and a service stops on events, not on luck.
"""

from __future__ import annotations

import asyncio
import math
import random

__all__ = ["backoff_s", "wait_set"]

_MAX_DOUBLINGS = 64  # far past any cap; keeps 2 ** n a float of sane size


def backoff_s(
    attempt: int,
    first_s: float,
    max_s: float = math.inf,
    *,
    jitter: float = 0.0,
    rng: random.Random | None = None,
) -> float:
    """The delay after try number ``attempt`` (1 for the first): ``first_s`` doubled per try, at
    most ``max_s``. With ``jitter`` (0 to 1) it is drawn uniformly from the top ``jitter`` part of
    that ceiling, so that clients failing together do not come back together."""
    ceiling = min(max_s, first_s * 2.0 ** min(max(attempt - 1, 0), _MAX_DOUBLINGS))
    if not jitter:
        return ceiling
    return ceiling * (1 - jitter) + (rng or random).random() * ceiling * jitter


async def wait_set(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait for ``event`` at most ``timeout_s``; whether it is set. As a pause a stop ends early:
    ``await wait_set(stopping, RETRY_DELAY_S)``. A cancellation always propagates."""
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return False
    return True
