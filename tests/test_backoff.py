"""The one backoff and the one "sleep unless stopped" (jetcrawl.plumbing.backoff)."""

from __future__ import annotations

import asyncio
import random

import pytest

from jetcrawl.plumbing.backoff import backoff_s, wait_set


def test_backoff_doubles_from_the_first_delay_up_to_the_cap() -> None:
    assert [backoff_s(n, 0.25, 5.0) for n in range(1, 8)] == [0.25, 0.5, 1, 2, 4, 5, 5]
    assert backoff_s(10_000, 1.0, 30.0) == 30.0  # no overflow however long it fails
    assert backoff_s(0, 1.0) == 1.0  # a count from 0 reads as the first try
    assert backoff_s(3, 1.0) == 4.0  # no cap


def test_jitter_draws_from_the_top_part_of_the_ceiling() -> None:
    rng = random.Random(7)
    delays = [backoff_s(3, 1.0, 60.0, jitter=0.5, rng=rng) for _ in range(200)]
    assert all(2.0 <= d <= 4.0 for d in delays)
    assert max(delays) - min(delays) > 1.5  # spread, not one value


async def test_wait_set_says_whether_the_event_came_in_time() -> None:
    event = asyncio.Event()
    assert await wait_set(event, 0.01) is False
    asyncio.get_running_loop().call_soon(event.set)
    assert await wait_set(event, 5.0) is True
    assert await wait_set(event, 0) is True  # set already: no wait at all


async def test_a_cancellation_that_meets_the_event_is_never_swallowed() -> None:
    """The event set and the waiter cancelled in the same turn of the loop: the cancellation
    must reach the caller (``asyncio.wait_for`` on 3.11 returns normally here)."""
    for timeout_s in (0.0, 5.0):
        event = asyncio.Event()
        waiter = asyncio.create_task(wait_set(event, timeout_s))
        await asyncio.sleep(0)  # waiting now
        event.set()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
