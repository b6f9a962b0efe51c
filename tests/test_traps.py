"""Spider-trap guards at the frontier: URLs per host per job, and repeated path segments."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from nats.js import JetStreamContext

from jetcrawl.contract.messages import Discovered, Lineage, Task
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import (
    DEAD_STREAM,
    DISCOVERED,
    DISPATCH_CONSUMER,
    FRONTIER_STREAM,
    SEEDS,
    TASKS_STREAM,
)
from jetcrawl.contract.urls import host_of, most_repeated_segment
from jetcrawl.dispatcher import Dispatcher
from jetcrawl.local.embedded import NatsServer
from tests.support.streams import eventually, stored

LINEAGE = Lineage(job="default", scope="any", root="", max_depth=10)


def settings_for(nats_server: NatsServer, **changes: object) -> Settings:
    return Settings(nats_url=nats_server.url, shards=4, ack_wait_s=2.0).replace(**changes)


@asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[Dispatcher]:
    async with Dispatcher(settings) as dispatcher, asyncio.TaskGroup() as tg:
        tg.create_task(dispatcher.run())
        try:
            yield dispatcher
        finally:
            dispatcher.stop()


async def frontier_drained(js: JetStreamContext) -> None:
    async def drained() -> bool:
        info = await js.consumer_info(FRONTIER_STREAM, DISPATCH_CONSUMER)
        return info.num_pending == 0 and info.num_ack_pending == 0

    await eventually(drained)


async def tasks(js: JetStreamContext) -> list[Task]:
    return [Task.from_wire(m.data) for m in await stored(js, TASKS_STREAM)]


@pytest.mark.parametrize(
    ("url", "count"),
    [
        ("https://a.example/", 0),
        ("https://a.example/2024/01/01/post", 2),
        ("https://a.example/a/b/a/b/a/b/a/b?a=a&a=a&a=a&a=a", 4),  # the query does not count
        ("https://a.example/x/x/x/x/x", 5),
    ],
)
def test_most_repeated_segment(url: str, count: int) -> None:
    assert most_repeated_segment(url) == count


async def test_links_that_repeat_a_segment_too_often_are_dropped_and_counted(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    links = (
        "https://a.example/a/b/a/b/a/b",  # 3 times: the limit, still fine
        "https://a.example/a/b/a/b/a/b/a/b",  # 4 times: a trap
        "https://a.example/cal/next/next/next/next",
        "https://a.example/2024/01/01/post",
    )
    async with running(settings_for(nats_server)) as dispatcher:
        parent = "https://a.example/"
        await js.publish(DISCOVERED, Discovered(parent, "fp", 1, LINEAGE, links).to_wire())
        async with asyncio.timeout(20):
            await dispatcher.wait_until(lambda stats: stats.messages == 1)
        assert (dispatcher.stats.traps, dispatcher.stats.admitted) == (2, 2)
    assert sorted(t.url for t in await tasks(js)) == sorted([links[0], links[3]])
    assert (await js.stream_info(DEAD_STREAM)).state.messages == 0, "counted, not dead-lettered"


async def test_urls_per_host_per_job_hold_across_dispatchers(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    settings = settings_for(nats_server, max_urls_per_host=10, dispatch_batch=4)
    hosts = [f"h{n}.example" for n in range(3)]
    links = [f"https://{h}/p{i}" for i in range(30) for h in hosts]
    async with running(settings) as one, running(settings) as two:
        for i in range(0, len(links), 5):
            page = Discovered("https://seed.example/", "fp", 1, LINEAGE, tuple(links[i : i + 5]))
            await js.publish(DISCOVERED, page.to_wire())
        await js.publish(SEEDS, b'{"url": "https://h0.example/other", "job": "other"}')
        await frontier_drained(js)
        assert one.stats.over_host_limit + two.stats.over_host_limit == 60
    admitted = await tasks(js)
    per_host = Counter(host_of(t.url) for t in admitted if t.lineage.job == "default")
    assert per_host == dict.fromkeys(hosts, 10), "exactly the limit, no overshoot"
    assert any(t.lineage.job == "other" for t in admitted), "the limit is per job"
