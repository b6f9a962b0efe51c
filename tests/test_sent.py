"""The worker's memory of links it sent to the frontier (worker/sent.py), alone and in a crawl."""

from __future__ import annotations

from typing import Any

import pytest
from nats.js import JetStreamContext

from jetcrawl.contract.messages import Lineage
from jetcrawl.local.embedded import NatsServer
from jetcrawl.worker.crawl import CrawlStats
from jetcrawl.worker.sent import SentLinks
from tests.support.badsite import BadSite
from tests.test_good_citizen import crawling, drained, page, results, seed, settings_for

HOST = Lineage(job="j", scope="host", root="a.test", max_depth=5)
OTHER_JOB = Lineage(job="k", scope="host", root="a.test", max_depth=5)
A, B, C = "http://a.test/a", "http://a.test/b", "http://a.test/c"


def test_a_sent_link_is_left_out_at_its_depth_and_deeper_only() -> None:
    sent = SentLinks(100)
    assert sent.unsent(HOST, 2, (A, B)) == (A, B)
    sent.sent(HOST, 2, (A,))
    assert sent.unsent(HOST, 2, (A, B)) == (B,)
    assert sent.unsent(HOST, 3, (A, B)) == (B,)
    assert sent.unsent(HOST, 1, (A, B)) == (A, B), "shallower: the depth limit may let it in now"
    sent.sent(HOST, 1, (A,))
    assert sent.unsent(HOST, 1, (A, B)) == (B,)


def test_a_link_sent_for_another_lineage_is_sent_again() -> None:
    sent = SentLinks(100)
    sent.sent(HOST, 1, (A,))
    assert sent.unsent(OTHER_JOB, 1, (A,)) == (A,)
    equal = Lineage(job="j", scope="host", root="a.test", max_depth=5)  # as decoded from a task
    assert sent.unsent(equal, 1, (A,)) == ()


def test_the_oldest_links_are_forgotten_first() -> None:
    sent = SentLinks(2)
    sent.sent(HOST, 1, (A, B))
    sent.sent(HOST, 1, (C,))
    assert len(sent) == 2
    assert sent.unsent(HOST, 1, (A, B, C)) == (A,)
    sent.sent(HOST, 1, (B,))  # sent again: young again
    sent.sent(HOST, 1, (A,))
    assert sent.unsent(HOST, 1, (A, B, C)) == (C,)


def test_size_zero_remembers_nothing() -> None:
    sent = SentLinks(0)
    sent.sent(HOST, 1, (A,))
    assert sent.unsent(HOST, 1, (A,)) == (A,)


def test_with_recrawls_a_link_is_sent_again_once_its_seen_mark_may_have_expired() -> None:
    now = [100.0]
    sent = SentLinks(100, recrawl_after_s=60, clock=lambda: now[0])
    sent.sent(HOST, 1, (A,))
    now[0] = 159.0
    assert sent.unsent(HOST, 1, (A,)) == ()
    now[0] = 161.0
    assert sent.unsent(HOST, 1, (A,)) == (A,)


PATHS = ["/", *(f"/p{n}" for n in range(12))]


async def crawl_where_every_page_links_every_page(
    nats_server: NatsServer, js: JetStreamContext, **changes: Any
) -> CrawlStats:
    """Crawl a site whose every page links every page, check that every page was crawled and
    fetched once, and return the worker's stats."""
    async with BadSite(host="127.0.0.2") as site:
        for path in PATHS:
            site.add(path, page(*PATHS, title=path))
        async with crawling(settings_for(nats_server, **changes)) as worker:
            await seed(js, [site.url("/")])
            await drained(js)
            stats = worker.stats
        crawled = await results(js)
        assert set(crawled) == {site.url(path) for path in PATHS}
        assert all(hits == 1 for hits in site.hits.values())
    return stats


@pytest.mark.parametrize("memory", [0, 1000])
async def test_a_link_on_every_page_is_sent_once_and_the_crawl_is_the_same(
    nats_server: NatsServer, js: JetStreamContext, memory: int
) -> None:
    """Without the memory each page sends them all again (each page's links in a message of
    their own here: tests/test_discovered.py gathers them)."""
    stats = await crawl_where_every_page_links_every_page(
        nats_server, js, link_memory=memory, concurrency=1, links_linger_s=0
    )
    found = len(PATHS) * (len(PATHS) - 1)  # each page's links but itself
    assert stats.links_published + stats.links_sent_before == found
    if memory:
        # "/" sends the 12 others; a page sends "/" until one such message is acknowledged (the
        # next page may be parsed before that), and nothing more.
        assert len(PATHS) - 1 < stats.links_published <= 2 * len(PATHS)
    else:
        assert stats.links_sent_before == 0
