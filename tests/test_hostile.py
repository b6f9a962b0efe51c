"""Hostile servers, round 2 (issue 30): each answer ends in a clear record, and the worker lives.

Malformed HTTP is a ``protocol`` fetch error; a body cut short of its Content-Length is a
transient one, retried, then a failed record and a dead letter; a redirect to ``file:`` or
``data:`` is ``bad_redirect``; a robots.txt of many megabytes is read to its cap and its rules
still hold; a charset that lies decodes to U+FFFD; an IDN homograph is its own punycode host;
deep nesting is read to a depth (tests/test_parse.py); a page of 100,000 links keeps
``max_links_per_page`` of them. Then all of it at once through a real dispatcher and worker:
every hostile URL has its record, and the worker crawls on.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import orjson
import pytest
from nats.js import JetStreamContext

from jetcrawl.contract.deadletters import DeadLetter
from jetcrawl.contract.messages import Result
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import DEAD_STREAM, RESULTS_STREAM, SEEDS
from jetcrawl.contract.urls import LinkCanonicalizer, UrlRules, canonicalize
from jetcrawl.dispatcher import Dispatcher
from jetcrawl.local.drain import Snapshot, snapshot
from jetcrawl.local.embedded import NatsServer
from jetcrawl.worker import Worker
from jetcrawl.worker.errors import FetchError
from jetcrawl.worker.fetcher import Fetcher
from jetcrawl.worker.parse import extract
from jetcrawl.worker.robots import MAX_ROBOTS_BYTES, Robots
from tests.support.badsite import BadSite, RawServer
from tests.support.streams import eventually, stored

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n"
NO_ROBOTS = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
MALFORMED = {
    "bad-chunking": HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
    "1MB-header": b"HTTP/1.1 200 OK\r\nX-Big: "
    + b"a" * 1024 * 1024
    + b"\r\nContent-Length: 2\r\n\r\nok",
    "endless-headers": b"HTTP/1.1 200 OK\r\n"
    + b"".join(b"X-%d: y\r\n" % n for n in range(200_000))
    + b"\r\n",
    "invalid-header": b"HTTP/1.1 200 OK\r\nBad Header Line\r\nContent-Length: 2\r\n\r\nok",
    "http-0.9": b"<html><a href='/x'>HTTP/0.9 has no status line</a></html>",
    "status": b"HTTP/1.1 2000 WHAT\r\nContent-Length: 0\r\n\r\n",
    "body-past-content-length": HEAD + b"Content-Length: 5\r\n\r\n<title>more</title>",
    "two-content-lengths": HEAD + b"Content-Length: 5\r\nContent-Length: 7\r\n\r\nhello",
    "content-length-and-chunked": HEAD
    + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
}
# The server hangs up before the Content-Length it announced: a dropped connection, retried.
TRUNCATED = HEAD + b"Content-Length: 100\r\n\r\n<title>cut</title>"


@pytest.fixture
async def fetcher() -> AsyncIterator[Fetcher]:
    settings = Settings(
        allow_nets=("127.0.0.0/8",), connect_timeout_s=2, read_timeout_s=2, total_timeout_s=4
    )
    async with Fetcher(settings) as started:
        yield started


@pytest.mark.parametrize("answer", MALFORMED.values(), ids=MALFORMED.keys())
async def test_malformed_http_is_a_protocol_error(fetcher: Fetcher, answer: bytes) -> None:
    async with RawServer(answer) as server:
        with pytest.raises(FetchError) as caught:
            await fetcher.fetch(server.url("/"), follow_redirects=False)
    assert (caught.value.kind, caught.value.transient) == ("protocol", False), caught.value


async def test_a_body_cut_short_of_its_content_length_is_a_transient_error(
    fetcher: Fetcher,
) -> None:
    async with RawServer(TRUNCATED) as server:
        with pytest.raises(FetchError) as caught:
            await fetcher.fetch(server.url("/"), follow_redirects=False)
    assert caught.value.transient and "not completed" in caught.value.message, caught.value


@pytest.mark.parametrize("target", ["file:///etc/passwd", "data:text/html,<a href=x>"])
@pytest.mark.parametrize("follow", [True, False])
async def test_a_redirect_out_of_http_is_a_bad_redirect(
    fetcher: Fetcher, target: str, follow: bool
) -> None:
    async with BadSite() as site:
        site.redirect("/away", target)
        with pytest.raises(FetchError) as caught:
            await fetcher.fetch(site.url("/away"), follow_redirects=follow)
    assert caught.value.kind == "bad_redirect" and "unsupported_scheme" in caught.value.message


async def test_a_robots_txt_of_megabytes_is_read_to_its_cap(fetcher: Fetcher) -> None:
    padding = "# pad\n" * (2 * MAX_ROBOTS_BYTES)
    async with BadSite() as site:
        robots_txt = "User-agent: *\nDisallow: /private\n" + padding
        site.add("/robots.txt", robots_txt, content_type="text/plain")
        robots = Robots(Settings(), fetcher)
        verdict = await robots.check(site.url("/private/x"))
        assert (verdict.allowed, verdict.reason) == (False, "disallowed")
        assert (await robots.check(site.url("/open"))).allowed


@pytest.mark.parametrize("host", ["a..b.test", f"{'a' * 64}.test", "..test"])
async def test_a_host_whatwg_takes_but_dns_cannot_spell_is_a_dns_error(
    fetcher: Fetcher, host: str
) -> None:
    """Empty and overlong labels are valid WHATWG hosts; the resolver refuses them at once."""
    url = canonicalize(f"http://{host}/")
    with pytest.raises(FetchError) as caught:
        await fetcher.fetch(url, follow_redirects=False)
    assert (caught.value.kind, caught.value.transient) == ("dns", False), caught.value


def test_a_charset_that_lies_decodes_to_replacement_characters() -> None:
    html = "<title>caf\xe9</title>".encode("latin-1")  # said to be UTF-8: it is not
    page = extract(html, "http://a.test/", "utf-8", LinkCanonicalizer(UrlRules()))
    assert page.title == "caf\ufffd"


def test_an_idn_homograph_is_its_own_punycode_host() -> None:
    assert canonicalize("http://\u0430pple.com/") == "http://xn--pple-43d.com/"  # Cyrillic a
    assert canonicalize("http://apple.com/") == "http://apple.com/"


# --- all at once, through a real dispatcher and worker ------------------------------------------

LINK_CAP = 50  # max_links_per_page, shrunk for the test


def _page(title: str, *links: str) -> str:
    return f"<title>{title}</title>" + "".join(f"<a href='{link}'>x</a>" for link in links)


async def _drained(js: JetStreamContext, shards: int) -> None:
    previous: Snapshot | None = None

    async def settled() -> bool:
        nonlocal previous
        current = await snapshot(js, shards)
        done = current.settled_after(previous)
        previous = current
        return done

    await eventually(settled, 60)


async def _results(js: JetStreamContext) -> dict[str, Result]:
    out: dict[str, Result] = {}
    for m in await stored(js, RESULTS_STREAM):
        result = Result.from_wire(m.data)
        assert result.url not in out, f"two results for {result.url}"
        out[result.url] = result
    return out


async def test_a_crawl_of_hostile_servers_records_each_and_the_worker_crawls_on(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    settings = Settings(
        nats_url=nats_server.url,
        shards=4,
        ack_wait_s=30.0,
        concurrency=8,
        host_delay_s=0.0,
        retry_base_delay_s=0.05,
        task_max_deliver=3,
        allow_nets=("127.0.0.0/8",),
        connect_timeout_s=2.0,
        read_timeout_s=2.0,
        total_timeout_s=5.0,
        max_links_per_page=LINK_CAP,
    )
    async with AsyncExitStack() as stack:
        raw = {
            name: await stack.enter_async_context(RawServer(answer, robots=NO_ROBOTS))
            for name, answer in {**MALFORMED, "truncated": TRUNCATED}.items()
        }
        site = await stack.enter_async_context(BadSite(host="127.0.0.2"))
        walled = await stack.enter_async_context(BadSite(host="127.0.0.3"))  # robots: Disallow /
        big_robots = await stack.enter_async_context(BadSite(host="127.0.0.4"))
        walled.add("/robots.txt", "User-agent: *\nDisallow: /\n", content_type="text/plain")
        robots_txt = "User-agent: *\nDisallow: /private\n" + "# pad\n" * (2 * 1024 * 1024)
        big_robots.add("/robots.txt", robots_txt, content_type="text/plain")  # 12 MB
        big_robots.add("/open", _page("open"))
        big_robots.add("/private/x", _page("private"))
        site.add("/lie", "<title>caf\xe9</title>".encode("latin-1"))  # said to be UTF-8
        site.add("/deep", b"<title>deep</title>" + b"<div>" * 100_000 + b"</div>" * 100_000)
        many = "".join(f"<a href='{walled.url(f'/l{n}')}'>l</a>" for n in range(100_000))
        site.add("/many", "<title>many</title>" + many)
        site.redirect("/to-file", "file:///etc/passwd")
        site.redirect("/to-data", "data:text/html,<a href=x>")
        site.add("/fine", _page("fine"))
        hostile = [server.url("/") for server in raw.values()] + [
            site.url(path) for path in ("/lie", "/deep", "/many", "/to-file", "/to-data")
        ]
        hostile += [big_robots.url("/open"), big_robots.url("/private/x")]
        site.add("/", _page("start", *hostile))

        async with (
            Dispatcher(settings) as dispatcher,
            Worker(settings, "w1") as worker,
            asyncio.TaskGroup() as tg,
        ):
            tg.create_task(dispatcher.run())
            worker_task = tg.create_task(worker.run())
            await worker.wait_running()
            for shard in range(settings.shards):
                await worker.on_acquired(shard, fence=1)
            seed = {"url": site.url("/"), "scope": "any", "max_depth": 2}
            await js.publish(SEEDS, orjson.dumps(seed))
            await _drained(js, settings.shards)
            # The worker lives: a page seeded after all that is crawled too.
            assert not worker_task.done()
            await js.publish(SEEDS, orjson.dumps({"url": site.url("/fine"), "scope": "host"}))
            await _drained(js, settings.shards)
            worker.stop()
            dispatcher.stop()

    crawled = await _results(js)
    for name, server in raw.items():
        record = crawled[server.url("/")]
        assert record.outcome == "failed" and record.error is not None, name
        if name == "truncated":
            assert (record.error.kind, record.attempt) == ("connect", 3), record.error
        else:  # not worth a retry (a redelivery under load may still count an attempt)
            assert record.error.kind == "protocol", (name, record.error)
    for path in ("/to-file", "/to-data"):
        record = crawled[site.url(path)]
        assert record.error is not None and record.error.kind == "bad_redirect", record
    assert crawled[site.url("/lie")].title == "caf\ufffd"
    assert crawled[site.url("/deep")].title == "deep"
    assert crawled[big_robots.url("/open")].status == 200
    assert crawled[big_robots.url("/private/x")].outcome == "robots_disallowed"
    assert crawled[site.url("/fine")].status == 200
    # What one page of 100,000 links costs is capped: its record counts LINK_CAP outlinks, and
    # exactly the first LINK_CAP of them reached the frontier (each a robots_disallowed record).
    assert crawled[site.url("/many")].outlinks == LINK_CAP
    walled_urls = {url for url in crawled if url.startswith(walled.origin)}
    assert walled_urls == {walled.url(f"/l{n}") for n in range(LINK_CAP)}
    assert walled.paths() == [], "robots.txt said no: only it was asked for"
    # Only the one URL whose failure was worth retries has a dead letter.
    letters = [DeadLetter.from_wire(m.data) for m in await stored(js, DEAD_STREAM)]
    assert [(d.stage, d.reason) for d in letters] == [("fetch", "retries_exhausted")]
