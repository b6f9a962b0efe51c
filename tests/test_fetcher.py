"""The fetcher against real local HTTP servers that behave, and ones that misbehave."""

from __future__ import annotations

import asyncio
import gzip
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from jetcrawl.contract.filetypes import media_types
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.urls import LinkCanonicalizer, UrlRules
from jetcrawl.worker.errors import FetchError
from jetcrawl.worker.fetcher import ACCEPT_ENCODING, Fetcher, media_type
from jetcrawl.worker.parse import extract
from tests.support.badsite import STREAM_BYTES, BadSite, MiB, RawServer

HTML = b"<!doctype html><html><head><title>t</title></head><body><a href='/x'>x</a></body></html>"
# At most what the server side may have written before the client stopped reading, kernel socket
# buffers included (4 to 6 MiB seen on Linux): an eighth of the streams, a thirtieth of the bomb.
EARLY = 32 * MiB


def settings(**changes: Any) -> Settings:
    return Settings(
        connect_timeout_s=2.0,
        read_timeout_s=2.0,
        total_timeout_s=10.0,
        allow_nets=("127.0.0.0/8",),  # the local test servers; the SSRF guard is on by default
    ).replace(**changes)


@pytest.fixture
async def badsite() -> AsyncIterator[BadSite]:
    async with BadSite() as site:
        yield site


@pytest.fixture
async def fetcher() -> AsyncIterator[Fetcher]:
    async with Fetcher(settings()) as f:
        yield f


async def fetch_error(fetcher: Fetcher, url: str, follow_redirects: bool = True) -> FetchError:
    with pytest.raises(FetchError) as caught:
        await fetcher.fetch(url, follow_redirects=follow_redirects)
    return caught.value


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # closed: nothing listens there


# --- responses that are read


async def test_html_page_is_read(badsite: BadSite, fetcher: Fetcher) -> None:
    badsite.add("/page.html", HTML, headers={"ETag": '"v1"', "Server": "bad/1"})
    before = time.time()
    got = await fetcher.fetch(badsite.url("/page.html"))
    assert (got.url, got.final_url, got.redirects) == (
        badsite.url("/page.html"),
        badsite.url("/page.html"),
        (),
    )
    assert got.status == 200
    assert (got.content_type, got.charset, got.is_html) == ("text/html", "utf-8", True)
    assert (got.body, got.length) == (HTML, len(HTML))
    assert got.headers["etag"] == '"v1"'
    assert got.headers["server"] == "bad/1"
    assert got.headers["content-length"] == str(len(HTML))
    assert "date" not in got.headers  # only the few we keep
    assert before <= got.fetched_at <= time.time()
    assert got.elapsed_ms > 0


async def test_xhtml_and_gzip_bodies_are_read_decompressed(
    badsite: BadSite, fetcher: Fetcher
) -> None:
    badsite.add(
        "/z.xhtml",
        gzip.compress(HTML),
        content_type="application/xhtml+xml",
        headers={"Content-Encoding": "gzip"},
    )
    got = await fetcher.fetch(badsite.url("/z.xhtml"))
    assert got.is_html
    assert (got.body, got.length) == (HTML, len(HTML))
    assert got.headers["content-encoding"] == "gzip"


async def test_404_is_an_outcome_and_its_body_is_not_kept(
    badsite: BadSite, fetcher: Fetcher
) -> None:
    badsite.add("/gone.html", HTML, status=404)
    got = await fetcher.fetch(badsite.url("/gone.html"))
    assert (got.status, got.content_type, got.body, got.length) == (
        404,
        "text/html",
        b"",
        len(HTML),
    )


async def test_a_response_without_content_type_is_not_read(fetcher: Fetcher) -> None:
    response = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(HTML), HTML)
    async with RawServer(response) as server:  # aiohttp's server would add a type
        got = await fetcher.fetch(server.url())
    assert (got.status, got.content_type, got.charset) == (200, "", None)
    assert (got.body, got.length, got.skipped) == (b"", 0, True)
    assert got.headers["content-length"] == str(len(HTML))  # what the server said it was


@pytest.mark.parametrize(
    ("path", "content_type", "declared"),
    [("/big.pdf", "application/pdf", str(STREAM_BYTES)), ("/big.png", "image/png", None)],
)
async def test_non_html_is_released_unread(
    badsite: BadSite, fetcher: Fetcher, path: str, content_type: str, declared: str | None
) -> None:
    started = time.monotonic()
    got = await fetcher.fetch(badsite.url(path))
    assert time.monotonic() - started < 2.0
    assert (got.status, got.content_type, got.body, got.length, got.skipped) == (
        200,
        content_type,
        b"",
        0,  # nothing was downloaded ...
        True,
    )
    assert got.headers.get("content-length") == declared  # ... of what the server declared
    await asyncio.wait_for(badsite.finished(path).wait(), 5)
    assert badsite.written[path] < EARLY  # the server was cut off, far from the end


async def test_a_type_the_caller_reads_is_read(badsite: BadSite, fetcher: Fetcher) -> None:
    """The negative case: asked to read images, the fetcher reads the PNG (until the limit)."""
    with pytest.raises(FetchError) as caught:
        await fetcher.fetch(badsite.url("/big.png"), reads=media_types(("image/*",)))
    assert caught.value.kind == "too_large"
    badsite.add("/page.html", HTML)
    got = await fetcher.fetch(badsite.url("/page.html"), reads=media_types(("image/*",)))
    assert (got.status, got.body, got.skipped) == (200, b"", True), "HTML now is unwanted"


# --- redirects


async def test_redirect_chain_is_recorded_canonically(badsite: BadSite, fetcher: Fetcher) -> None:
    badsite.add("/page.html", HTML)
    badsite.redirect("/r1", "/r2", status=301)  # relative to the hop that answered
    badsite.redirect("/r2", badsite.url("/./page.html?utm_source=mail#top"), status=302)
    got = await fetcher.fetch(badsite.url("/r1"))
    assert got.redirects == (badsite.url("/r1"), badsite.url("/r2"))
    assert got.final_url == badsite.url("/page.html")
    assert got.url == badsite.url("/r1")
    assert (got.status, got.body) == (200, HTML)


async def test_unfollowed_redirect_is_the_answer_with_its_canonical_target(
    badsite: BadSite, fetcher: Fetcher
) -> None:
    badsite.add("/page.html", HTML)
    badsite.redirect("/r1", "./page.html?utm_source=mail#top", status=301)
    got = await fetcher.fetch(badsite.url("/r1"), follow_redirects=False)
    assert (got.status, got.redirects, got.body) == (301, (), b"")
    assert got.location == badsite.url("/page.html")
    assert got.final_url == badsite.url("/r1")
    assert "/page.html" not in badsite.hits, "the target is not fetched"
    badsite.redirect("/away", "javascript:alert(1)", status=302)
    error = await fetch_error(fetcher, badsite.url("/away"), follow_redirects=False)
    assert error.kind == "bad_redirect"


async def test_a_redirect_loop_is_too_many_redirects(badsite: BadSite, fetcher: Fetcher) -> None:
    badsite.redirect("/loop-a", "/loop-b")
    badsite.redirect("/loop-b", "/loop-a")
    error = await fetch_error(fetcher, badsite.url("/loop-a"))
    assert (error.kind, error.transient) == ("too_many_redirects", False)
    assert badsite.hits["/loop-a"] == 1  # caught at the loop, not after max_redirects hops


async def test_max_redirects_is_the_limit(badsite: BadSite) -> None:
    badsite.add("/hop4", HTML)
    for n in range(4):
        badsite.redirect(f"/hop{n}", f"/hop{n + 1}", status=307)
    async with Fetcher(settings(max_redirects=3)) as strict:
        error = await fetch_error(strict, badsite.url("/hop0"))
        assert error.kind == "too_many_redirects"
        got = await strict.fetch(badsite.url("/hop1"))  # three hops: fine
        assert (got.status, len(got.redirects)) == (200, 3)


@pytest.mark.parametrize(
    "location",
    [
        "javascript:alert(1)",
        "mailto:someone@example.com",
        "ftp://example.com/f",
        "http://user:pw@example.com/",
    ],
)
async def test_a_redirect_to_what_we_do_not_fetch_is_bad_redirect(
    badsite: BadSite, fetcher: Fetcher, location: str
) -> None:
    badsite.redirect("/away", location, status=302)
    error = await fetch_error(fetcher, badsite.url("/away"))
    assert (error.kind, error.transient) == ("bad_redirect", False)


async def test_a_3xx_without_location_is_the_final_response(
    badsite: BadSite, fetcher: Fetcher
) -> None:
    badsite.add("/not-modified", status=304, content_type="")
    got = await fetcher.fetch(badsite.url("/not-modified"))
    assert (got.status, got.redirects) == (304, ())


# --- bodies over the limit


async def test_a_body_at_the_limit_is_read_and_one_byte_more_is_too_large(
    badsite: BadSite,
) -> None:
    limit = 64 * 1024
    badsite.add("/fits.html", b"x" * limit)
    badsite.add("/over.html", b"x" * (limit + 1))
    async with Fetcher(settings(max_body_bytes=limit)) as small:
        assert (await small.fetch(badsite.url("/fits.html"))).length == limit
        error = await fetch_error(small, badsite.url("/over.html"))
        assert (error.kind, error.transient) == ("too_large", False)


async def test_a_streamed_body_over_the_limit_is_cut_off(badsite: BadSite) -> None:
    async with Fetcher(settings(max_body_bytes=MiB)) as small:
        error = await fetch_error(small, badsite.url("/huge.html"))
    assert error.kind == "too_large"
    await asyncio.wait_for(badsite.finished("/huge.html").wait(), 5)
    assert badsite.written["/huge.html"] < EARLY


async def test_a_gzip_bomb_is_stopped_early(badsite: BadSite) -> None:
    started = time.monotonic()
    async with Fetcher(settings(max_body_bytes=MiB)) as small:
        error = await fetch_error(small, badsite.url("/bomb.html"))
    assert error.kind == "too_large"
    # Inflating even what fits in the socket buffers (some GiB) would take minutes.
    assert time.monotonic() - started < 3.0
    await asyncio.wait_for(badsite.finished("/bomb.html").wait(), 5)
    assert badsite.written["/bomb.html"] < EARLY  # of about 1 GB compressed


async def test_a_brotli_bomb_is_stopped_early(badsite: BadSite) -> None:
    assert "br" in ACCEPT_ENCODING.split(", "), "Brotli installed: aiohttp decodes br"
    started = time.monotonic()
    async with Fetcher(settings(max_body_bytes=MiB)) as small:
        error = await fetch_error(small, badsite.url("/bomb.br"))
    assert error.kind == "too_large"
    assert time.monotonic() - started < 3.0
    await asyncio.wait_for(badsite.finished("/bomb.br").wait(), 5)
    assert badsite.written["/bomb.br"] < EARLY


# --- servers that do not answer well


async def test_a_slow_drip_is_cut_off_by_the_total_timeout(badsite: BadSite) -> None:
    # A byte every 50 ms never trips the 1 s read timeout; only the total deadline stops it.
    async with Fetcher(settings(read_timeout_s=1.0, total_timeout_s=0.8)) as f:
        started = time.monotonic()
        error = await fetch_error(f, badsite.url("/drip.html"))
        elapsed = time.monotonic() - started
    assert (error.kind, error.transient) == ("timeout", True)
    assert 0.7 < elapsed < 2.0
    await asyncio.wait_for(badsite.finished("/drip.html").wait(), 5)
    assert 5 < badsite.written["/drip.html"] < 40, "it was dripping, and it was cut off"


async def test_a_server_that_never_answers_times_out_at_the_read_timeout() -> None:
    async with RawServer(b"", hang=True) as server, Fetcher(settings(read_timeout_s=0.3)) as f:
        started = time.monotonic()
        error = await fetch_error(f, server.url())
        elapsed = time.monotonic() - started
    assert (error.kind, error.transient) == ("timeout", True)
    assert 0.25 < elapsed < 1.5


async def test_a_slow_answer_within_the_read_timeout_is_fine() -> None:
    response = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 2\r\n\r\nok"
    async with (
        RawServer(response, delay_s=0.1) as server,
        Fetcher(settings(read_timeout_s=0.3)) as f,
    ):
        assert (await f.fetch(server.url())).body == b"ok"


async def test_the_total_timeout_covers_the_redirect_chain(badsite: BadSite) -> None:
    gate = asyncio.Event()
    badsite.redirect("/slow-start", "/held")
    badsite.add("/held", HTML, gate=gate)
    try:
        async with Fetcher(settings(read_timeout_s=5.0, total_timeout_s=0.5)) as f:
            started = time.monotonic()
            error = await fetch_error(f, badsite.url("/slow-start"))
            assert time.monotonic() - started < 1.5
        assert error.kind == "timeout"
    finally:
        gate.set()


async def test_connection_refused_is_a_transient_refused_error(fetcher: Fetcher) -> None:
    error = await fetch_error(fetcher, f"http://127.0.0.1:{free_port()}/")
    assert (error.kind, error.transient) == ("refused", True)


async def test_a_failed_tls_handshake_is_a_tls_error_not_worth_a_retry(fetcher: Fetcher) -> None:
    async def plain_http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")  # no TLS
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(plain_http, "127.0.0.1", 0)
    async with server:
        port = server.sockets[0].getsockname()[1]
        error = await fetch_error(fetcher, f"https://127.0.0.1:{port}/")
    assert (error.kind, error.transient) == ("tls", False), error


async def test_an_unknown_host_is_a_dns_error(fetcher: Fetcher) -> None:
    error = await fetch_error(fetcher, "http://no-such-host.invalid/")
    assert (error.kind, error.transient) == ("dns", True)


@pytest.mark.parametrize(
    "response",
    [
        b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 1000\r\n\r\n<html>",
        b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"6\r\n<html>\r\n",
        b"",  # hung up before any response
    ],
    ids=["content-length", "chunked", "no-response"],
)
async def test_a_dropped_connection_is_a_transient_connect_error(
    fetcher: Fetcher, response: bytes
) -> None:
    async with RawServer(response) as server:
        error = await fetch_error(fetcher, server.url())
    assert (error.kind, error.transient) == ("connect", True)


async def test_a_response_that_is_not_http_is_a_protocol_error(fetcher: Fetcher) -> None:
    async with RawServer(b"\x00\x01\x02 hello\r\n\r\n") as server:
        error = await fetch_error(fetcher, server.url())
    assert (error.kind, error.transient) == ("protocol", False)


async def test_a_corrupt_compressed_body_is_a_decoding_error(
    badsite: BadSite, fetcher: Fetcher
) -> None:
    badsite.add("/corrupt.html", b"not gzip at all", headers={"Content-Encoding": "gzip"})
    error = await fetch_error(fetcher, badsite.url("/corrupt.html"))
    assert (error.kind, error.transient) == ("decoding", False)


# --- charsets: what the fetcher hands the parser decodes right


async def test_a_latin1_page_is_decoded_by_its_http_charset(
    badsite: BadSite, fetcher: Fetcher
) -> None:
    page = (
        "<title>Caf\u00e9 cr\u00e8me \u00e0 la fran\u00e7aise</title><a href='/\u00e9t\u00e9'>x</a>"
    )
    badsite.add(
        "/latin1.html", page.encode("latin-1"), content_type="text/html; charset=ISO-8859-1"
    )
    got = await fetcher.fetch(badsite.url("/latin1.html"))
    assert got.charset == "iso-8859-1"
    parsed = extract(got.body, got.final_url, got.charset, LinkCanonicalizer(UrlRules()))
    assert parsed.title == "Caf\u00e9 cr\u00e8me \u00e0 la fran\u00e7aise"
    assert parsed.links == (badsite.url("/%C3%A9t%C3%A9"),), "the href decoded, then UTF-8 encoded"


async def test_a_shift_jis_page_is_decoded_by_its_meta_charset(
    badsite: BadSite, fetcher: Fetcher
) -> None:
    title = "\u65e5\u672c\u8a9e\u306e\u30da\u30fc\u30b8"  # "a Japanese page"
    page = f"<html><head><meta charset='Shift_JIS'><title>{title}</title></head></html>"
    badsite.add("/sjis.html", page.encode("shift_jis"), content_type="text/html")  # no charset
    got = await fetcher.fetch(badsite.url("/sjis.html"))
    assert got.charset is None
    parsed = extract(got.body, got.final_url, got.charset, LinkCanonicalizer(UrlRules()))
    assert parsed.title == title


# --- the object


async def test_close_is_idempotent_and_final(badsite: BadSite) -> None:
    badsite.add("/page.html", HTML)
    fetcher = Fetcher(settings())
    assert (await fetcher.fetch(badsite.url("/page.html"))).status == 200  # opens lazily
    await fetcher.close()
    await fetcher.close()
    with pytest.raises(RuntimeError):
        await fetcher.fetch(badsite.url("/page.html"))


async def test_get_text_reads_any_type_up_to_max_bytes(badsite: BadSite) -> None:
    badsite.add("/robots.txt", "User-agent: *\nDisallow: /a\n", content_type="text/plain")
    badsite.redirect("/moved.txt", "/robots.txt")
    async with Fetcher(settings()) as f:
        assert await f.get_text(badsite.url("/robots.txt"), 1000) == (
            200,
            "User-agent: *\nDisallow: /a\n",
            (),
        )
        status, text, redirects = await f.get_text(badsite.url("/moved.txt"), 10)
        assert (status, text, redirects) == (200, "User-agent", (badsite.url("/moved.txt"),))
        assert await f.get_text(badsite.url("/missing.txt"), 1000) == (404, "", ())


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("text/html; charset=UTF-8", ("text/html", "utf-8")),
        ('Text/HTML ; Charset="ISO-8859-1" ; q=1', ("text/html", "iso-8859-1")),
        ("application/xhtml+xml", ("application/xhtml+xml", None)),
        ("text/html; charset=", ("text/html", None)),
        ("", ("", None)),
    ],
)
def test_media_type(header: str, expected: tuple[str, str | None]) -> None:
    assert media_type(header) == expected
