"""Hostile servers, round 2 (issue 30): each answer ends in a clear record, and the worker lives.

Malformed HTTP is a ``protocol`` fetch error; a redirect to ``file:`` or ``data:`` is
``bad_redirect``; a robots.txt of many megabytes is read to its cap and its rules still hold; a
charset that lies decodes to U+FFFD; an IDN homograph is its own punycode host. (Deep nesting and
100,000 links on a page: tests/test_parse.py.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from jetcrawl.contract.settings import Settings
from jetcrawl.contract.urls import LinkCanonicalizer, UrlRules, canonicalize
from jetcrawl.worker.errors import FetchError
from jetcrawl.worker.fetcher import Fetcher
from jetcrawl.worker.parse import extract
from jetcrawl.worker.robots import MAX_ROBOTS_BYTES, Robots
from tests.support.badsite import BadSite, RawServer

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n"


@pytest.fixture
async def fetcher() -> AsyncIterator[Fetcher]:
    settings = Settings(
        allow_nets=("127.0.0.0/8",), connect_timeout_s=2, read_timeout_s=2, total_timeout_s=4
    )
    async with Fetcher(settings) as started:
        yield started


@pytest.mark.parametrize(
    "answer",
    [
        HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 1024 * 1024 + b"\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: y\r\n" % n for n in range(200_000)) + b"\r\n",
        b"HTTP/1.1 200 OK\r\nBad Header Line\r\nContent-Length: 2\r\n\r\nok",
        b"<html><a href='/x'>HTTP/0.9 has no status line</a></html>",
        b"HTTP/1.1 2000 WHAT\r\nContent-Length: 0\r\n\r\n",
    ],
    ids=["bad-chunking", "1MB-header", "endless-headers", "invalid-header", "http-0.9", "status"],
)
async def test_malformed_http_is_a_protocol_error(fetcher: Fetcher, answer: bytes) -> None:
    async with RawServer(answer) as server:
        with pytest.raises(FetchError) as caught:
            await fetcher.fetch(server.url("/"), follow_redirects=False)
    assert (caught.value.kind, caught.value.transient) == ("protocol", False), caught.value


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


def test_a_charset_that_lies_decodes_to_replacement_characters() -> None:
    html = "<title>caf\xe9</title>".encode("latin-1")  # said to be UTF-8: it is not
    page = extract(html, "http://a.test/", "utf-8", LinkCanonicalizer(UrlRules()))
    assert page.title == "caf\ufffd"


def test_an_idn_homograph_is_its_own_punycode_host() -> None:
    assert canonicalize("http://\u0430pple.com/") == "http://xn--pple-43d.com/"  # Cyrillic a
    assert canonicalize("http://apple.com/") == "http://apple.com/"
