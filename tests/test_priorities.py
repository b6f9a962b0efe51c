"""Issue 27 on a real mesh: levels before FIFO order, jobs sharing a shard by weight, and a job
paused, its worker restarted, resumed, and cancelled."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest
from nats.js import JetStreamContext

from jetcrawl.contract.control import CANCELLED, PAUSED, RUNNING
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import SEEDS, TASKS_PREFIX, TASKS_STREAM, job_tasks
from jetcrawl.dispatcher import Dispatcher
from jetcrawl.local.embedded import NatsServer
from jetcrawl.plumbing.control import ControlStore
from jetcrawl.worker import Worker
from tests.support.badsite import BadSite
from tests.support.streams import eventually
from tests.test_good_citizen import (
    dead_letters,
    drained,
    page,
    redelivered,
    results,
    settings_for,
)

PAGES = 20


@asynccontextmanager
async def dispatching(settings: Settings) -> AsyncIterator[Dispatcher]:
    async with Dispatcher(settings) as dispatcher, asyncio.TaskGroup() as tg:
        tg.create_task(dispatcher.run())
        try:
            yield dispatcher
        finally:
            dispatcher.stop()


@asynccontextmanager
async def working(settings: Settings, worker_id: str = "w1") -> AsyncIterator[Worker]:
    """A worker that owns every shard, until the block ends (then it stops gracefully)."""
    async with Worker(settings, worker_id) as worker, asyncio.TaskGroup() as tg:
        tg.create_task(worker.run())
        await worker.wait_running()
        for shard in range(settings.shards):
            await worker.on_acquired(shard, fence=1)
        try:
            yield worker
        finally:
            worker.stop()


def site_with(host: str, *groups: tuple[str, int]) -> BadSite:
    site = BadSite(host=host)
    for prefix, count in groups:
        for n in range(count):
            site.add(f"/{prefix}{n}", page(title=f"{prefix}{n}"))
    return site


async def admitted(dispatcher: Dispatcher, count: int) -> None:
    async with asyncio.timeout(30):
        await dispatcher.wait_until(lambda s: s.admitted >= count)


def seeds(site: BadSite, prefix: str, count: int, **fields: Any) -> bytes:
    return orjson.dumps([{"url": site.url(f"/{prefix}{n}"), **fields} for n in range(count)])


async def test_every_level_0_task_of_a_slowed_host_is_fetched_before_any_level_1_task(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    # One host, one fetch at a time; the level-1 seeds are sent first, so FIFO would take them
    # first (the negative case below).
    settings = settings_for(nats_server, host_delay_s=0.02)
    async with (
        site_with("127.0.0.2", ("low", PAGES), ("high", PAGES)) as site,
        dispatching(settings) as dispatcher,
    ):
        await js.publish(SEEDS, seeds(site, "low", PAGES, priority=1))
        await js.publish(SEEDS, seeds(site, "high", PAGES, priority=0))
        await admitted(dispatcher, 2 * PAGES)
        subjects = (await js.stream_info(TASKS_STREAM, f"{TASKS_PREFIX}>")).state.subjects
        assert sorted(s.split(".")[3] for s in subjects or {}) == ["0", "1"]
        async with working(settings):
            await drained(js)
    fetched = site.paths()
    assert len(fetched) == 2 * PAGES
    assert {p.rstrip("0123456789") for p in fetched[:PAGES]} == {"/high"}, fetched


async def test_without_levels_the_same_tasks_come_first_in_first_out(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    settings = settings_for(nats_server, host_delay_s=0.02)
    async with (
        site_with("127.0.0.2", ("low", PAGES), ("high", PAGES)) as site,
        dispatching(settings) as dispatcher,
    ):
        await js.publish(SEEDS, seeds(site, "low", PAGES))
        await js.publish(SEEDS, seeds(site, "high", PAGES))
        await admitted(dispatcher, 2 * PAGES)
        async with working(settings):
            await drained(js)
    assert {p.rstrip("0123456789") for p in site.paths()[:PAGES]} == {"/low"}


async def test_two_jobs_on_one_shard_get_shares_within_ten_percent_of_their_weights(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    # Weights 3:1 on one host (one shard), both jobs queued before the worker starts; measured
    # over the first 100 fetches, when both still have tasks (150 each).
    settings = settings_for(nats_server)
    count = 150
    async with (
        site_with("127.0.0.2", ("big", count), ("small", count)) as site,
        dispatching(settings) as dispatcher,
    ):
        for job, weight in (("big", 3), ("small", 1)):
            spec = {"name": job, "priority": {"weight": weight}}
            first = {"url": site.url(f"/{job}0"), "spec": spec}
            rest = [{"url": site.url(f"/{job}{n}"), "job": job} for n in range(1, count)]
            await js.publish(SEEDS, orjson.dumps([first, *rest]))
        await admitted(dispatcher, 2 * count)
        async with working(settings):
            await drained(js, within_s=60)
    fetched = site.paths()
    assert len(fetched) == 2 * count
    share = sum(1 for p in fetched[:100] if p.startswith("/big")) / 100
    assert abs(share - 0.75) <= 0.075, share


async def test_a_paused_job_stops_within_two_seconds_survives_a_worker_restart_and_resumes(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    # 60 pages at 0.1 s apart; paused after a few, the worker restarted during the pause.
    # AckWait is past the host's schedule: no politeness hand-back, whose memory a restart loses.
    settings = settings_for(nats_server, host_delay_s=0.1, concurrency=8, ack_wait_s=10.0)
    held_at_most = settings.holding
    count = 60
    async with site_with("127.0.0.2", ("p", count)) as site, dispatching(settings):
        control = await ControlStore.open(js)
        await js.publish(SEEDS, seeds(site, "p", count, job="slow"))
        async with working(settings, "w1"):

            async def some_fetched() -> bool:
                return len(site.paths()) >= 5

            await eventually(some_fetched)
            await control.change("slow", PAUSED, "test")
            paused_at = time.monotonic()
            await asyncio.sleep(2.5)  # the pause's effect is what this test measures
        async with working(settings, "w2"):
            await asyncio.sleep(1.0)
            late = [t - paused_at for t, path in site.log if t > paused_at + 2.0]
            assert late == [], "fetched after the pause had reached the mesh"
            before = len(site.paths())
            assert before < count
            await control.change("slow", RUNNING, "test")
            await drained(js, within_s=60)
    crawled = await results(js)  # a second result of one URL fails here
    assert sorted(crawled) == sorted(site.url(f"/p{n}") for n in range(count))
    assert sorted(site.paths()) == sorted(f"/p{n}" for n in range(count)), "each fetched once"
    # Parked tasks spent no delivery; the restart handed back those w1 still held (one each).
    assert {r.attempt for r in crawled.values()} <= {1, 2}
    assert sum(r.attempt == 2 for r in crawled.values()) <= held_at_most
    assert await redelivered(js) <= held_at_most


async def test_a_cancelled_job_leaves_no_task_and_the_other_job_is_untouched(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    settings = settings_for(nats_server, host_delay_s=0.1)
    async with (
        site_with("127.0.0.2", ("gone", 60)) as gone,
        site_with("127.0.0.3", ("kept", 10)) as kept,
        dispatching(settings),
    ):
        control = await ControlStore.open(js)
        await js.publish(SEEDS, seeds(gone, "gone", 60, job="gone"))
        await js.publish(SEEDS, seeds(kept, "kept", 10, job="kept"))
        async with working(settings) as worker:

            async def started() -> bool:
                return len(gone.paths()) >= 3

            await eventually(started)
            record, changed = await control.change("gone", CANCELLED, "test")
            cancelled_at = time.monotonic()
            assert changed
            purged = await js.purge_stream(TASKS_STREAM, subject=job_tasks("gone"))
            assert purged
            await drained(js)
            settled = worker.stats.settled
    info = await js.stream_info(TASKS_STREAM, f"{TASKS_PREFIX}>")
    assert not info.state.subjects and info.state.messages == 0
    assert len(gone.paths()) < 60
    crawled = await results(js)
    assert {u for u in crawled if u.startswith(kept.origin)} == {
        kept.url(f"/kept{n}") for n in range(10)
    }
    again, changed = await control.change("gone", CANCELLED, "test")
    assert not changed and again.at == record.at, "the cancellation is recorded once"
    assert settled > 0, "the tasks it held were settled, not fetched"
    assert not [t for t, _ in gone.log if t > cancelled_at + 2.0], "fetched after the cancel"


@asynccontextmanager
async def owning(settings: Settings, worker_id: str, shards: range) -> AsyncIterator[Worker]:
    async with Worker(settings, worker_id) as worker, asyncio.TaskGroup() as tg:
        tg.create_task(worker.run())
        await worker.wait_running()
        for shard in shards:
            await worker.on_acquired(shard, fence=1)
        try:
            yield worker
        finally:
            worker.stop()


@pytest.mark.parametrize("cap", [5.0, None])
async def test_a_jobs_rate_cap_holds_across_two_workers(
    nats_server: NatsServer, js: JetStreamContext, cap: float | None
) -> None:
    # 4 hosts, no host delay, two workers owning half the shards each: only the cap paces them.
    settings = settings_for(nats_server)
    per_host = 10
    hosts = [f"127.0.0.{n}" for n in range(2, 6)]
    spec: dict[str, Any] = {"name": "capped"}
    if cap is not None:
        spec["max_pages_per_s"] = cap
    async with contextlib.AsyncExitStack() as stack:
        sites = [await stack.enter_async_context(site_with(h, ("c", per_host))) for h in hosts]
        dispatcher = await stack.enter_async_context(dispatching(settings))
        first, *rest = [
            {"url": site.url(f"/c{n}"), "job": "capped"} for site in sites for n in range(per_host)
        ]
        await js.publish(SEEDS, orjson.dumps([{"url": first["url"], "spec": spec}, *rest]))
        await admitted(dispatcher, len(hosts) * per_host)
        await stack.enter_async_context(owning(settings, "w1", range(0, 2)))
        await stack.enter_async_context(owning(settings, "w2", range(2, 4)))
        await drained(js, within_s=60)
    times = sorted(t for site in sites for t, path in site.log if path != "/robots.txt")
    assert len(times) == len(hosts) * per_host
    took_s = times[-1] - times[0]
    if cap is None:
        assert took_s < 40 / 5.0 / 2, "the negative case: uncapped, it is much faster"
        return
    # each worker may start with one token: 2 pages at once, the other 38 at 5 a second
    assert took_s >= (len(times) - 2) / cap * 0.9, took_s
    most_in_a_second = max(sum(1 for u in times if t <= u < t + 1.0) for t in times)
    assert most_in_a_second <= cap + 2, most_in_a_second


async def test_a_seed_whose_priority_is_out_of_range_is_a_dead_letter_saying_why(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    settings = settings_for(nats_server)
    async with dispatching(settings) as dispatcher:
        await js.publish(
            SEEDS,
            orjson.dumps(
                [{"url": "http://127.0.0.2/a", "priority": 7}, {"url": "http://127.0.0.2/b"}]
            ),
        )
        await admitted(dispatcher, 1)

        async def lettered() -> bool:
            return bool(await dead_letters(js))

        await eventually(lettered)
    [letter] = await dead_letters(js)
    assert (letter.stage, letter.reason) == ("seeds", "bad_priority")
    assert "0-3" in letter.detail and "7" in letter.detail
