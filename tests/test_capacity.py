"""The worker's counting limit (worker/capacity.py): waiting for room, and giving up waiting."""

from __future__ import annotations

import asyncio

import pytest

from jetcrawl.worker.capacity import Capacity


async def settle() -> None:
    """Let every ready callback run (the waiters are woken by callbacks, not by time)."""
    for _ in range(10):
        await asyncio.sleep(0)


async def test_a_waiter_wakes_when_a_slot_frees_and_takes_it() -> None:
    capacity = Capacity(1)
    never = asyncio.Event()
    assert await capacity.take(never)
    waiting = asyncio.create_task(capacity.take(never))
    await settle()
    assert not waiting.done(), "no slot is free"
    capacity.release()
    assert await asyncio.wait_for(waiting, 5)
    assert capacity.in_flight == 1


async def test_every_waiter_looks_again_and_only_one_gets_the_slot() -> None:
    capacity = Capacity(1)
    never = asyncio.Event()
    assert capacity.try_take()
    waiting = [asyncio.create_task(capacity.take(never)) for _ in range(3)]
    await settle()
    capacity.release()
    await settle()
    assert [task.done() for task in waiting] == [True, False, False], "the others wait again"
    capacity.release()
    await settle()
    assert [task.done() for task in waiting] == [True, True, False]
    assert capacity.in_flight == 1
    waiting[2].cancel()


async def test_unless_set_and_woken_the_wait_ends_without_a_slot() -> None:
    capacity = Capacity(1)
    stop = asyncio.Event()
    assert capacity.try_take()
    waiting = asyncio.create_task(capacity.wait_free(stop))
    await settle()
    stop.set()
    capacity.wake_all()
    assert await asyncio.wait_for(waiting, 5) is False
    assert capacity.in_flight == 1
    assert await capacity.take(stop) is False, "set before: no wait at all"


async def test_a_cancelled_waiter_leaves_nothing_behind() -> None:
    capacity = Capacity(1)
    assert capacity.try_take()
    waiting = asyncio.create_task(capacity.wait_free(asyncio.Event()))
    await settle()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert capacity._waiters == []
