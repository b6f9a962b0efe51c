"""Politeness as a unit: the scheduling rule, turns per host, room under pressure; retry rules."""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import time
from datetime import UTC, datetime
from email.utils import format_datetime

import pytest

from jetcrawl.contract.settings import Settings
from jetcrawl.worker.capacity import Capacity
from jetcrawl.worker.politeness import Deferred, Politeness, Slot, Turn, turn_at
from jetcrawl.worker.retry import Backoff, retry_after_s, retry_delay, retryable


def never() -> asyncio.Event:
    """An event nothing sets (made per wait: an Event binds to the first loop that waits on it)."""
    return asyncio.Event()


def politeness(
    fetch_slots: int = 8, holding: int = 100, **changes: object
) -> tuple[Politeness, Capacity, Capacity]:
    settings = Settings(host_delay_s=0.0, ack_wait_s=2.0).replace(**changes)
    fetch, held = Capacity(fetch_slots), Capacity(holding)
    return Politeness(settings, fetch, held), fetch, held


async def turn(p: Politeness, host: str, crawl_delay: float | None = None) -> Turn:
    got = await p.turn(host, crawl_delay, deferrable=True, unless=never())
    assert isinstance(got, Turn)
    return got


# --- the scheduling function


def test_turns_are_spaced_start_to_start_and_wait_out_a_pause() -> None:
    slot = Slot(delay_s=2.0, concurrency=1)
    assert turn_at(slot, now=100.0) == 100.0, "a host never seen is ready"
    slot.last_start = 99.0
    assert turn_at(slot, now=100.0) == 101.0
    slot.paused_until = 105.0
    assert turn_at(slot, now=100.0) == 105.0
    slot.paused_until = -math.inf
    assert turn_at(slot, now=100.0, ahead=3) == 107.0, "three more turns of 2 s first"
    slot.mean_s = 8.0  # a server slower than the delay: its request time is the step
    assert turn_at(slot, now=100.0, ahead=3) == 125.0


def test_the_delay_is_ours_raised_by_crawl_delay_up_to_the_cap() -> None:
    p, _, _ = politeness(host_delay_s=1.0, max_crawl_delay_s=30.0)
    assert p.delay_for(None) == 1.0
    assert p.delay_for(0.2) == 1.0
    assert p.delay_for(5.0) == 5.0
    assert p.delay_for(3600.0) == 30.0


# --- turns


async def test_a_handed_over_shard_s_hosts_wait_a_delay_from_the_handover() -> None:
    p, _, _ = politeness(host_delay_s=0.3)
    p.handover(3)
    handed_over = time.monotonic()
    other = await p.turn("b.example", None, deferrable=True, unless=never(), shard=4)
    assert isinstance(other, Turn) and other.started - handed_over < 0.3, "another shard: at once"
    got = await p.turn("a.example", None, deferrable=True, unless=never(), shard=3)
    assert isinstance(got, Turn)
    assert got.started - handed_over >= 0.3, "the previous owner may have just asked it"


async def test_one_host_waits_its_delay_while_another_host_goes_at_once() -> None:
    p, fetch, _ = politeness(host_delay_s=0.3)
    first = await turn(p, "slow.example")
    p.done(first)
    started = time.monotonic()
    second = asyncio.create_task(turn(p, "slow.example"))
    other = await turn(p, "fast.example")  # not behind the slow host's waiting task
    assert time.monotonic() - started < 0.1
    assert not second.done()
    assert fetch.in_flight == 1, "the waiting task holds no fetch slot"
    p.done(other)
    p.done(await second)
    assert second.result().started - first.started >= 0.3


async def test_host_concurrency_bounds_requests_in_flight_per_host() -> None:
    p, _, _ = politeness(host_concurrency=2)
    a, b = await turn(p, "h"), await turn(p, "h")
    third = asyncio.create_task(turn(p, "h"))
    await asyncio.sleep(0.05)  # give it every chance to (wrongly) start
    assert not third.done()
    p.done(a)
    p.done(await asyncio.wait_for(third, 1))
    p.done(b)


async def served(p: Politeness, arrivals: tuple[tuple[str, int], ...]) -> list[str]:
    """The order one host serves ``arrivals`` (name, level) in, queued behind a running request
    (one connection) in the order given."""
    running = await turn(p, "h")
    order: list[str] = []

    async def queued(name: str, level: int) -> None:
        got = await p.turn("h", None, deferrable=True, unless=never(), level=level)
        assert isinstance(got, Turn)
        order.append(name)
        p.done(got)

    waiting = []
    for name, level in arrivals:
        waiting.append(asyncio.create_task(queued(name, level)))
        await asyncio.sleep(0)
    p.done(running)
    await asyncio.wait_for(asyncio.gather(*waiting), 1)
    return order


async def test_a_host_serves_its_waiting_tasks_by_level_then_in_arrival_order() -> None:
    # The head of the line (level 2) is put behind a level-0 arrival, and a level-1 one goes
    # between the levels it finds.
    arrivals = (("2a", 2), ("2b", 2), ("0a", 0), ("1a", 1), ("0b", 0), ("2c", 2))
    assert await served(politeness()[0], arrivals) == ["0a", "0b", "1a", "2a", "2b", "2c"]


async def test_a_waiting_task_is_overtaken_by_at_most_priority_slack_tasks() -> None:
    # 3a lets 1a and 0a go ahead, then no more: 0b and 0c wait behind it.
    arrivals = (("3a", 3), ("1a", 1), ("0a", 0), ("0b", 0), ("0c", 0))
    p = politeness(priority_slack=2)[0]
    assert await served(p, arrivals) == ["0a", "1a", "3a", "0b", "0c"]


async def test_a_waiting_task_takes_a_fetch_slot_only_for_its_turn() -> None:
    p, fetch, _ = politeness(fetch_slots=1)
    a = await turn(p, "a")
    waiting = asyncio.create_task(turn(p, "b"))
    await asyncio.sleep(0.05)
    assert not waiting.done() and fetch.in_flight == 1
    p.done(a)
    p.done(await asyncio.wait_for(waiting, 1))
    assert fetch.in_flight == 0


async def test_freed_fetch_slots_go_to_waiting_tasks_in_the_order_they_asked() -> None:
    p, fetch, _ = politeness(fetch_slots=1)
    running = await turn(p, "a")
    order: list[str] = []

    async def queued(host: str) -> Turn:
        got = await turn(p, host)
        order.append(host)
        return got

    waiting = []
    for host in ("b", "c", "d"):  # every host is ready; only the fetch slot is missing
        waiting.append(asyncio.create_task(queued(host)))
        await asyncio.sleep(0)
    for task in waiting:
        p.done(running)
        running = await asyncio.wait_for(task, 1)
        assert fetch.in_flight == 1
    p.done(running)
    assert order == ["b", "c", "d"]


async def test_a_task_woken_for_a_slot_it_cannot_use_passes_it_on() -> None:
    p, fetch, _ = politeness(fetch_slots=1)
    running = await turn(p, "a")
    first = asyncio.create_task(turn(p, "paused"))
    await asyncio.sleep(0)
    second = asyncio.create_task(turn(p, "other"))
    await asyncio.sleep(0)
    p.pause("paused", 5.0)  # the first in line may not go after all
    p.done(running)
    p.done(await asyncio.wait_for(second, 1))  # the slot went on to the next in line
    assert not first.done()
    first.cancel()
    assert fetch.in_flight == 0


async def test_a_retry_after_pauses_the_host_from_now() -> None:
    p, _, _ = politeness()
    first = await turn(p, "h")
    p.done(first, pause_s=0.4)
    second = await asyncio.wait_for(turn(p, "h"), 2)
    assert second.started - first.started >= 0.4
    p.done(second)


async def test_the_pause_is_capped() -> None:
    p, _, _ = politeness(max_retry_after_s=0.2)
    p.pause("h", 3600)
    started = time.monotonic()
    p.done(await asyncio.wait_for(turn(p, "h"), 2))
    assert 0.15 < time.monotonic() - started < 1.0


async def test_abandoning_ends_the_wait_with_nothing_taken() -> None:
    p, fetch, _ = politeness(host_delay_s=10.0)
    p.done(await turn(p, "h"))
    lost = asyncio.Event()
    waiting = asyncio.create_task(p.turn("h", None, deferrable=True, unless=lost))
    await asyncio.sleep(0.02)
    lost.set()
    p.wake_all()  # as the worker does on a lost lease
    assert await asyncio.wait_for(waiting, 1) is None
    assert (p.waiting, fetch.in_flight) == (0, 0)


async def test_a_cancelled_wait_leaves_the_queue_and_the_next_one_goes() -> None:
    p, _, _ = politeness(host_delay_s=0.2)
    p.done(await turn(p, "h"))
    cancelled = asyncio.create_task(turn(p, "h"))
    following = asyncio.create_task(turn(p, "h"))
    await asyncio.sleep(0.02)
    cancelled.cancel()
    p.done(await asyncio.wait_for(following, 1))
    assert p.waiting == 0


# --- room under pressure


async def test_a_full_holding_hands_back_the_furthest_turns_beyond_the_horizon() -> None:
    # AckWait 2 s is the horizon; with 1 s between turns, tasks 3 and later are beyond it.
    p, _, held = politeness(holding=8, host_delay_s=1.0)
    p.done(await turn(p, "slow"))
    for _ in range(7):
        held.try_take()
    waits = [
        asyncio.create_task(p.turn("slow", None, deferrable=True, unless=never())) for _ in range(6)
    ]
    keep = asyncio.create_task(p.turn("slow", None, deferrable=False, unless=never()))
    await asyncio.sleep(0.05)
    assert held.try_take() and held.free_slots == 0
    fast = await turn(p, "fast")  # arriving into a full holding makes room
    p.done(fast)
    await asyncio.sleep(0.05)
    handed_back = [w.result() for w in waits if w.done()]
    assert all(isinstance(d, Deferred) for d in handed_back)
    assert len(handed_back) == 4, "turns 3 to 6 are beyond the 2 s horizon; 1 and 2 stay"
    delays = sorted(d.delay_s for d in handed_back if isinstance(d, Deferred))
    assert all(b - a >= 0.99 for a, b in itertools.pairwise(delays)), delays
    assert delays[0] > 2.0
    assert not keep.done(), "a task out of hand-backs keeps its place"
    assert p.deferred == 4
    for w in [*waits, keep]:
        w.cancel()


# --- retry rules


@pytest.mark.parametrize(
    ("kind", "status", "worth_it"),
    [
        ("timeout", None, True),
        ("connect", None, True),
        ("dns", None, True),
        ("robots_unavailable", None, True),
        ("too_large", None, False),
        ("blocked", None, False),
        ("bad_redirect", None, False),
        (None, 500, True),
        (None, 503, True),
        (None, 408, True),
        (None, 429, True),
        (None, 404, False),
        (None, 403, False),
        (None, 200, False),
    ],
)
def test_what_is_worth_a_retry(kind: str | None, status: int | None, worth_it: bool) -> None:
    assert retryable(kind=kind, status=status) is worth_it
    backoff = Backoff(max_attempts=3)
    assert (retry_delay(1, backoff, kind=kind, status=status) is not None) is worth_it


def test_backoff_doubles_with_jitter_until_the_attempts_run_out() -> None:
    backoff = Backoff(max_attempts=5, base_s=1.0, max_s=4.0)
    rng = random.Random(1)
    for attempt, ceiling in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 4.0)]:
        delays = [retry_delay(attempt, backoff, kind="timeout", rng=rng) for _ in range(50)]
        assert all(d is not None and ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 1, "jittered"
    assert retry_delay(5, backoff, kind="timeout") is None, "the last attempt's failure is final"
    assert retry_delay(2, backoff, status=429, retry_after=30.0) == 30.0


def test_retry_after_in_seconds_or_as_an_http_date() -> None:
    now = 1_700_000_000.0
    assert retry_after_s("120", now, cap_s=600) == 120.0
    assert retry_after_s("86400", now, cap_s=600) == 600.0
    date = format_datetime(datetime.fromtimestamp(now + 90, UTC), usegmt=True)
    assert retry_after_s(date, now, cap_s=600) == pytest.approx(90.0)
    past = format_datetime(datetime.fromtimestamp(now - 90, UTC), usegmt=True)
    assert retry_after_s(past, now, cap_s=600) == 0.0
    assert retry_after_s("soon", now, cap_s=600) is None
    assert retry_after_s(None, now, cap_s=600) is None


class _Clock:
    """A clock the test moves: turns and hand-back delays become exact numbers."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _handed_back_with_a_burst(entering: int) -> list[float]:
    """80 tasks wait for one host (1 s apart, AckWait 30 s) in a full holding; ``entering``
    tasks of other hosts then enter ``turn()`` in one event-loop pass. The hand-back delays."""
    settings = Settings(host_delay_s=1.0, ack_wait_s=30.0)
    clock = _Clock()
    held = Capacity(80 + entering)
    p = Politeness(settings, Capacity(8), held, clock=clock)
    p.done(await turn(p, "slow"))  # the host's last request: now
    waits = [
        asyncio.create_task(p.turn("slow", None, deferrable=True, unless=never()))
        for _ in range(80)
    ]
    await asyncio.sleep(0)
    while held.try_take():  # then the holding fills up
        pass
    burst = [
        asyncio.create_task(p.turn(f"other{n}", None, deferrable=True, unless=never()))
        for n in range(entering)
    ]
    await asyncio.sleep(0)  # every entering task runs make_room in this one pass
    for _ in range(5):
        await asyncio.sleep(0)
    delays = sorted(w.result().delay_s for w in waits if w.done())  # type: ignore[union-attr]
    for task in [*waits, *burst]:
        task.cancel()
    await asyncio.gather(*waits, *burst, return_exceptions=True)
    return delays


@pytest.mark.parametrize("entering", [1, 64])
async def test_a_burst_into_a_full_holding_hands_each_waiter_back_once_at_its_turn(
    entering: int,
) -> None:
    # The 80th waiter's turn is 80 s away: the 32 furthest (turns 49..80) go back, each at
    # its own turn. A burst of entries picks no waiter twice and pushes no turn later (issue 31:
    # 64 entries used to hand the same waiters back with delays of 2,064-2,095 s).
    delays = await _handed_back_with_a_burst(entering)
    assert delays == [float(turn) for turn in range(49, 81)], delays


async def test_a_hand_back_in_a_later_pass_goes_at_its_own_turn_between_promised_ones() -> None:
    settings = Settings(host_delay_s=1.0, ack_wait_s=30.0)
    clock = _Clock()
    p = Politeness(settings, Capacity(8), Capacity(80), clock=clock)
    p.done(await turn(p, "slow"))
    waits = [
        asyncio.create_task(p.turn("slow", None, deferrable=True, unless=never()))
        for _ in range(80)
    ]
    await asyncio.sleep(0)
    assert p.make_room() == 32  # turns 49..80
    for _ in range(3):
        await asyncio.sleep(0)
    assert p.make_room() == 18, "the rest beyond the horizon: turns 31..48"
    for _ in range(3):
        await asyncio.sleep(0)
    delays = sorted(w.result().delay_s for w in waits if w.done())  # type: ignore[union-attr]
    assert delays == [float(turn) for turn in range(31, 81)], "one turn each, none pushed"
    assert p.make_room() == 0, "30 s of turns left: all within the horizon"
    for task in waits:
        task.cancel()
    await asyncio.gather(*waits, return_exceptions=True)


def test_no_retry_begins_past_the_urls_budget_in_time() -> None:
    backoff = Backoff(max_attempts=5, base_s=1.0, max_s=4.0, budget_s=10.0)
    rng = random.Random(2)
    assert retry_delay(1, backoff, kind="timeout", spent_s=0.0, rng=rng) is not None
    assert retry_delay(1, backoff, kind="timeout", spent_s=8.9, rng=rng) is not None
    assert retry_delay(1, backoff, kind="timeout", spent_s=9.6, rng=rng) is None, "0.5 s at least"
    assert retry_delay(2, Backoff(5), kind="timeout", spent_s=1e9, rng=rng) is not None, "none"
