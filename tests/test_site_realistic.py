"""The realistic bench site serves what its model says, and the model's two crawls are exact.

The site is served as the bench serves it (``bench.siteserver`` processes); a plain reference
crawler (``tests.test_site.reference_crawl``) finds exactly the model's full crawl, and the same
crawler skipping links to binaries by extension finds exactly its ``skip_binaries`` crawl.
"""

from __future__ import annotations

import re
import socket
import statistics
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import pytest

from bench.siteserver import SiteServer
from tests.support.site.model import BINARY_EXTENSIONS, Site
from tests.support.site.realistic import (
    MAX_PAGE_BYTES,
    MIN_PAGE_BYTES,
    TRACKING_PARAMS,
    RealisticSpec,
    generate,
)
from tests.support.site.shapes import from_wire, to_wire
from tests.test_site import reference_crawl

SPEC = RealisticSpec(hosts=3, pages=300, slow_delay_ms=5, seed=7)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SiteServer, Site]]:
    with SiteServer(SPEC, 1, tmp_path_factory.mktemp("site")) as server:
        yield server, generate(SPEC)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


def seeds(server: SiteServer) -> list[str]:
    return [f"http://{authority}/" for authority in server.authorities]


async def test_the_reference_crawl_finds_exactly_the_full_crawl(
    served: tuple[SiteServer, Site], session: aiohttp.ClientSession
) -> None:
    server, site = served
    expected = site.expected(server.authorities)
    server.reset()
    crawl = await reference_crawl(
        session, seeds(server), tracking=TRACKING_PARAMS, skip_binaries=False
    )
    assert crawl.fetched == expected.fetchable
    assert crawl.disallowed == expected.disallowed
    assert set(crawl.pages) == expected.html_pages
    stats = server.stats()
    assert stats.refetches == 0 and stats.disallowed_hits == 0
    assert stats.html == len(expected.html_pages)
    assert stats.binaries == len(expected.fetchable) - len(expected.html_pages) - sum(
        1 for status in expected.fetchable.values() if status != 200
    )
    assert stats.binaries > 0


async def test_a_crawler_skipping_binaries_finds_exactly_the_skipping_crawl(
    served: tuple[SiteServer, Site], session: aiohttp.ClientSession
) -> None:
    server, site = served
    full = site.expected(server.authorities)
    skipping = site.expected(server.authorities, skip_binaries=True)
    crawl = await reference_crawl(session, seeds(server), tracking=TRACKING_PARAMS)
    assert crawl.fetched == skipping.fetchable  # the reference crawler skips them by default
    assert skipping.html_pages == full.html_pages  # no page hangs on a binary alone
    assert set(full.fetchable) - set(skipping.fetchable) == {
        url for url in full.fetchable if urlsplit(url).path.lower().endswith(BINARY_EXTENSIONS)
    }


async def test_binaries_come_with_their_types_and_sizes(
    served: tuple[SiteServer, Site], session: aiohttp.ClientSession
) -> None:
    server, site = served
    types: Counter[str] = Counter()
    for loc, entry in site.entries.items():
        if entry.kind != "file":
            continue
        async with session.get(site.url(loc, server.authorities)) as response:
            body = await response.read()
        assert response.status == 200
        assert response.content_type == entry.content_type
        assert response.content_length == len(body) == len(entry.body)
        types[entry.content_type] += 1
    assert {"image/jpeg", "application/pdf"} <= set(types) and len(types) >= 5


def test_the_model_has_the_web_s_traps() -> None:
    site = generate(RealisticSpec(hosts=4, pages=2000, seed=3))
    authorities = [f"127.0.0.{10 + h}:80" for h in range(4)]
    responses = site.responses(authorities)
    html = [body for (status, kind, body) in responses.values() if kind.startswith("text/html")]
    sizes = [len(body) for body in html if body.startswith(b"<!DOCTYPE")]
    assert min(sizes) >= MIN_PAGE_BYTES and max(sizes) <= MAX_PAGE_BYTES * 1.05
    assert 15_000 < statistics.median(sizes) < 30_000 and max(sizes) > 100_000
    binaries = [e for e in site.entries.values() if e.kind == "file"]
    assert 0.1 < len(binaries) / 2000 < 0.2
    assert max(len(e.body) for e in binaries) > 1_000_000
    # Redirect chains of two and three hops, each ending on a page.
    chains = Counter()
    for loc, entry in site.entries.items():
        if entry.kind == "redirect" and loc.key.count("/") == 2:
            hops = 0
            while entry.kind == "redirect":
                assert entry.redirect is not None
                entry, hops = site.entries[entry.redirect], hops + 1
            assert entry.kind == "page"
            chains[hops] += 1
    assert set(chains) == {2, 3}
    assert {e.status for e in site.entries.values() if e.kind == "redirect"} == {301, 302, 307, 308}
    hrefs = " ".join(body.decode() for body in html)
    for name in TRACKING_PARAMS:
        assert re.search(rf"[?&]{name}=", hrefs), name
    assert any(e.kind == "missing" for e in site.entries.values())
    assert site.delays_s == {3: 0.05}
    # Deterministic from its seed, and the spec survives the trip to the server processes.
    again = generate(RealisticSpec(hosts=4, pages=2000, seed=3))
    assert again.expected(authorities) == site.expected(authorities)
    assert from_wire(to_wire(SPEC)) == SPEC


def _ask(authority: str, raw: bytes) -> tuple[bytes, float]:
    host, port = authority.split(":")
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(raw)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks), time.monotonic() - started


def test_the_slow_host_answers_late_and_in_order(tmp_path: Path) -> None:
    spec = RealisticSpec(hosts=2, pages=40, slow_delay_ms=200, seed=1)
    with SiteServer(spec, 1, tmp_path) as server:
        slow, quick = server.authorities[1], server.authorities[0]
        table = generate(spec).responses(server.authorities)
        keys = [
            k
            for (h, k), (status, _, _) in table.items()
            if h == 1 and status == 200 and k != "/robots.txt"
        ][:3]
        raw = "".join(f"GET {k} HTTP/1.1\r\nHost: {slow}\r\n\r\n" for k in keys[:-1])
        raw += f"GET {keys[-1]} HTTP/1.1\r\nHost: {slow}\r\nConnection: close\r\n\r\n"
        answer, took = _ask(slow, raw.encode())
        assert took >= 0.2  # every answer waits its delay
        bodies = [table[1, k][2] for k in keys]
        at = [answer.index(body) for body in bodies]
        assert at == sorted(at)  # pipelined answers in request order
        # The other host has no delay: what it answers is there before the slow host's would be.
        answer, _ = _ask(quick, f"GET / HTTP/1.0\r\nHost: {quick}\r\n\r\n".encode())
        assert answer.startswith(b"HTTP/1.1 200")
        assert server.stats().requests == 4


def test_an_unknown_shape_is_refused_with_its_name() -> None:
    with pytest.raises(ValueError, match="unknown site shape 'web'"):
        from_wire('{"shape": "web", "hosts": 1}')
    with pytest.raises(ValueError, match="slow_delay_ms"):
        RealisticSpec(slow_delay_ms=-1)
