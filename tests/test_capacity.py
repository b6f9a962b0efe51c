"""The worker's counting limit (worker/capacity.py): waiting for room, and giving up waiting."""

from __future__ import annotations

import asyncio

import pytest

from jetcrawl.contract.settings import Settings
from jetcrawl.worker.capacity import Capacity, room_for


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


def test_the_waiting_room_is_seconds_of_the_pace_within_its_bounds() -> None:
    settings = Settings(concurrency=64, ack_wait_s=30.0)  # the room: 5 s of the pace
    assert room_for(settings, 0.0) == 4 * 64, "no pace yet: the floor"
    assert room_for(settings, 100.0) == 500
    assert room_for(settings, 10_000.0) == 64 * 64 == settings.waiting_max
    assert room_for(settings.replace(buffer_max=40), 10_000.0) == 40, "set: the user's"


async def test_a_resized_limit_holds_what_was_taken_and_wakes_waiters_when_it_grows() -> None:
    capacity, never = Capacity(2), asyncio.Event()
    assert await capacity.take(never) and await capacity.take(never)
    capacity.resize(1)
    assert capacity.free_slots == -1
    capacity.release()
    waiting = asyncio.create_task(capacity.take(never))
    await settle()
    assert not waiting.done(), "one taken, the limit one: nothing free"
    capacity.resize(3)
    assert await asyncio.wait_for(waiting, 5)
    assert (capacity.in_flight, capacity.free_slots) == (2, 1)
