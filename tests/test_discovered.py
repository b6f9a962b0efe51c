"""Pages' links gathered into crawl.discovered messages (worker/discovered.py), alone and in a
crawl, and the dispatcher reading a message of several pages."""

from __future__ import annotations

import asyncio
import time

import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import PubAck

from jetcrawl.contract.messages import Discovered, DiscoveredPages, Lineage, Task
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import DISCOVERED, FRONTIER_STREAM, TASKS_STREAM
from jetcrawl.contract.urls import fingerprint
from jetcrawl.dispatcher import Dispatcher
from jetcrawl.local.embedded import NatsServer
from jetcrawl.plumbing.bus import MSG_ID, Outbox, PublishFailed
from jetcrawl.plumbing.topology import ensure
from jetcrawl.worker.crawl import CrawlStats
from jetcrawl.worker.discovered import DiscoveredOutbox, merged
from tests.support.streams import stored
from tests.test_sent import PATHS, crawl_where_every_page_links_every_page

HOST = Lineage(job="j", scope="host", root="a.test", max_depth=5)
OTHER_JOB = Lineage(job="k", scope="host", root="a.test", max_depth=5)
A, B, C, D = (f"http://a.test/{name}" for name in "abcd")
LONG_LINGER_S = 30.0  # a test that sees it sent did not wait for it


def found(parent: str, depth: int, lineage: Lineage, *links: str) -> Discovered:
    return Discovered(parent, fingerprint(parent), depth, lineage, links)


# --- one message of several pages


def test_a_link_an_earlier_page_carries_is_left_out_of_a_later_one() -> None:
    first = found("http://a.test/1", 2, HOST, A, B)
    deeper = found("http://a.test/2", 3, HOST, B, C)
    assert merged(first, deeper).pages == (first, found("http://a.test/2", 3, HOST, C))


def test_a_link_is_kept_for_another_lineage_or_a_smaller_depth() -> None:
    first = found("http://a.test/1", 2, HOST, A)
    other_job = found("http://a.test/2", 2, OTHER_JOB, A)
    shallower = found("http://a.test/3", 1, HOST, A)
    equal = found("http://a.test/4", 1, Lineage("j", "host", "a.test", 5), A)  # as decoded
    assert merged(first, other_job, shallower, equal).pages == (first, other_job, shallower)


def test_one_page_is_the_message_of_one_page() -> None:
    alone = found("http://a.test/1", 1, HOST, A, B)
    assert merged(alone).to_wire() == alone.to_wire()
    assert DiscoveredPages.from_wire(alone.to_wire()).pages == (alone,)


# --- DiscoveredOutbox against a real server


async def _outbox(
    nc: NATS, js: JetStreamContext, linger_s: float, stats: CrawlStats | None = None, **kw: int
) -> DiscoveredOutbox:
    await ensure(js, Settings(nats_url="unused", shards=1))
    return DiscoveredOutbox(Outbox(nc), linger_s, stats or CrawlStats(), **kw)


async def test_pages_within_the_linger_share_one_message_and_its_ack(
    nc: NATS, js: JetStreamContext
) -> None:
    stats = CrawlStats()
    out = await _outbox(nc, js, linger_s=0.2, stats=stats)
    pages = [
        found("http://a.test/1", 1, HOST, A, B),
        found("http://a.test/2", 1, HOST, B, C),
        found("http://a.test/3", 2, OTHER_JOB, A),
    ]
    acks = await asyncio.gather(*(out.add(p, f"id-{n}") for n, p in enumerate(pages)))
    assert all(isinstance(ack, PubAck) for ack in acks)
    assert len({ack.seq for ack in acks if isinstance(ack, PubAck)}) == 1
    assert (stats.links_messages, stats.links_published, stats.links_sent_before) == (1, 4, 1)
    [message] = await stored(js, FRONTIER_STREAM)
    assert message.headers is not None
    assert message.headers[MSG_ID] == "links-" + fingerprint("id-0\nid-1\nid-2")
    assert DiscoveredPages.from_wire(message.data) == merged(*pages)


async def test_without_a_linger_each_page_goes_alone_with_its_own_id(
    nc: NATS, js: JetStreamContext
) -> None:
    out = await _outbox(nc, js, linger_s=0.0)
    pages = [found("http://a.test/1", 1, HOST, A), found("http://a.test/2", 1, HOST, A)]
    await asyncio.gather(*(out.add(p, f"id-{n}") for n, p in enumerate(pages)))
    messages = await stored(js, FRONTIER_STREAM)
    assert [m.headers[MSG_ID] for m in messages if m.headers] == ["links-id-0", "links-id-1"]
    assert [Discovered.from_wire(m.data) for m in messages] == pages


async def test_the_same_pages_again_are_dropped_and_a_page_with_others_is_not(
    nc: NATS, js: JetStreamContext
) -> None:
    """A publish tried again carries the same pages: the duplicate window drops it. A redelivered
    task's page comes with other pages: that message is new, or their links would be lost."""
    out = await _outbox(nc, js, linger_s=0.05)
    one, two, three = (found(f"http://a.test/{n}", 1, HOST, A, B) for n in (1, 2, 3))

    async def together(*pages: tuple[Discovered, str]) -> list[PubAck | PublishFailed]:
        return list(await asyncio.gather(*(out.add(p, crawl_id) for p, crawl_id in pages)))

    first = await together((one, "id-1"), (two, "id-2"))
    again = await together((two, "id-2"), (one, "id-1"))
    other = await together((one, "id-1"), (three, "id-3"))
    assert [isinstance(a, PubAck) and bool(a.duplicate) for a in first + again + other] == [
        False,
        False,
        True,
        True,
        False,
        False,
    ]
    assert len(await stored(js, FRONTIER_STREAM)) == 2


async def test_pages_over_the_size_budget_go_without_waiting_for_the_linger(
    nc: NATS, js: JetStreamContext
) -> None:
    out = await _outbox(nc, js, linger_s=LONG_LINGER_S, max_bytes=1024)
    links = tuple(f"http://a.test/{n:04}" for n in range(40))  # ~900 bytes a page
    started = time.monotonic()
    first = out.add(found("http://a.test/1", 1, HOST, *links), "id-1")
    second = out.add(found("http://a.test/2", 1, HOST, *links), "id-2")  # over: the first goes
    async with asyncio.timeout(LONG_LINGER_S / 2):
        ack = await first
    assert isinstance(ack, PubAck) and not second.done()
    assert time.monotonic() - started < LONG_LINGER_S / 2
    second.cancel()  # it would wait out the linger


async def test_a_failed_publish_fails_every_page_it_carried(nc: NATS, js: JetStreamContext) -> None:
    stats = CrawlStats()
    out = DiscoveredOutbox(Outbox(nc, timeout_s=2.0), 0.05, stats)  # no stream at all
    acks = await asyncio.gather(
        out.add(found("http://a.test/1", 1, HOST, A), "id-1"),
        out.add(found("http://a.test/2", 1, HOST, B), "id-2"),
    )
    assert all(isinstance(ack, PublishFailed) for ack in acks)
    assert stats.links_messages == 0


# --- the dispatcher reads every page of a message


async def test_the_dispatcher_admits_the_links_of_every_page_with_that_pages_lineage(
    nats_server: NatsServer, nc: NATS, js: JetStreamContext
) -> None:
    settings = Settings(nats_url=nats_server.url, shards=4, ack_wait_s=2.0)
    message = DiscoveredPages(
        (
            found("http://a.test/", 1, HOST, A, "http://elsewhere.test/"),  # one out of scope
            found("http://a.test/b", 3, OTHER_JOB, B),
            found("http://a.test/deep", 6, HOST, C),  # past max_depth 5
        )
    )
    async with Dispatcher(settings) as dispatcher, asyncio.TaskGroup() as tg:
        tg.create_task(dispatcher.run())
        await js.publish(DISCOVERED, message.to_wire())
        await js.publish(DISCOVERED, b'{"v": 1, "pages": [{"parent": 1}]}')
        async with asyncio.timeout(20):
            await dispatcher.wait_until(lambda s: s.messages >= 2)
        dispatcher.stop()
    assert (dispatcher.stats.out_of_scope, dispatcher.stats.too_deep) == (1, 1)
    assert dispatcher.stats.rejected == 1, "an unreadable page: the whole message"
    tasks = {t.url: t for t in (Task.from_wire(m.data) for m in await stored(js, TASKS_STREAM))}
    assert sorted(tasks) == [A, B]
    assert (tasks[A].parent, tasks[A].depth, tasks[A].lineage) == ("http://a.test/", 1, HOST)
    assert (tasks[B].parent, tasks[B].depth, tasks[B].lineage) == ("http://a.test/b", 3, OTHER_JOB)


# --- in a crawl


@pytest.mark.parametrize("linger_s", [0.0, 1.0])
async def test_a_crawl_gathers_pages_links_and_crawls_the_same(
    nats_server: NatsServer, js: JetStreamContext, linger_s: float
) -> None:
    """No page's links are left out as sent before: alone, each page sends a message; gathered,
    the twelve pages "/" links to finish well within one linger and share a message or two."""
    stats = await crawl_where_every_page_links_every_page(
        nats_server, js, link_memory=0, links_linger_s=linger_s
    )
    found = len(PATHS) * (len(PATHS) - 1)  # each page's links but itself
    assert stats.links_published + stats.links_sent_before == found
    if linger_s:
        assert 2 <= stats.links_messages <= 4
        # A message carries a link once: "/" sends the 12 others, and the twelve send the 13.
        assert stats.links_published <= len(PATHS) * stats.links_messages
    else:
        assert stats.links_messages == len(PATHS)
        assert stats.links_published == found
