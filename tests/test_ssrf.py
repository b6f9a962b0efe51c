"""The SSRF guard, on by default: IP literals, resolved names, redirect hops, our own servers."""

from __future__ import annotations

import ipaddress

import pytest

from jetcrawl.contract.settings import Settings
from jetcrawl.contract.urls import canonicalize
from jetcrawl.local.embedded import NatsServer
from jetcrawl.worker.errors import FetchError
from jetcrawl.worker.fetcher import Fetcher
from jetcrawl.worker.robots import Robots
from jetcrawl.worker.ssrf import AddressGuard, refusal
from tests.support.badsite import BadSite

HTML = b"<html><title>inside</title></html>"


def guarded(**changes: object) -> Settings:
    return Settings(connect_timeout_s=2.0, read_timeout_s=2.0, total_timeout_s=5.0).replace(
        **changes
    )


async def blocked(fetcher: Fetcher, url: str, follow_redirects: bool = True) -> FetchError:
    with pytest.raises(FetchError) as caught:
        await fetcher.fetch(url, follow_redirects=follow_redirects)
    return caught.value


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("fd00::1", "private"),
        ("169.254.169.254", "link_local"),
        ("fe80::1", "link_local"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("240.0.0.1", "reserved"),
        ("0.0.0.0", "unspecified"),
        ("100.64.0.1", "not_global"),
        ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped
        ("2002:7f00:1::1", "loopback"),  # 6to4 of 127.0.0.1 (issue 30)
        ("2002:a9fe:a9fe::1", "link_local"),  # 6to4 of 169.254.169.254, the metadata address
        ("2002:c0a8:1::1", "private"),  # 6to4 of 192.168.0.1
        ("2002:808:808::1", None),  # 6to4 of a public address
        ("64:ff9b::7f00:1", "loopback"),  # NAT64 of 127.0.0.1
        ("64:ff9b:1::a00:1", "not_global"),  # local-use NAT64 (RFC 8215)
        ("::127.0.0.1", "loopback"),  # IPv4-compatible
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "private"),  # Teredo
        ("93.184.215.14", None),
        ("2606:2800:21f:cb07:6820:80da:af6b:8b2c", None),
    ],
)
def test_what_is_refused_by_default(address: str, reason: str | None) -> None:
    assert refusal(ipaddress.ip_address(address)) == reason


def test_allow_nets_open_ranges_but_never_the_mesh_endpoints() -> None:
    guard = AddressGuard(["127.0.0.0/8", "10.0.0.0/8"])
    assert guard.check("127.0.0.5", 80) is None
    assert guard.check("10.9.9.9", 443) is None
    assert guard.check("192.168.0.1", 80) == "private"
    assert guard.check("2002:7f00:1::1", 80) is None, "6to4 of an allowed address"
    assert guard.check("2002:c0a8:1::1", 80) == "private", "6to4 of a refused one"


async def test_the_mesh_endpoints_are_refused_even_inside_allow_nets(
    nats_server: NatsServer,
) -> None:
    settings = guarded(nats_url=nats_server.url, allow_nets=("127.0.0.0/8",))
    async with Fetcher(settings) as fetcher:
        port = nats_server.url.rsplit(":", 1)[1]
        error = await blocked(fetcher, f"http://127.0.0.1:{port}/")
    assert (error.kind, error.transient) == ("blocked", False)
    assert "mesh_endpoint" in error.message


async def test_an_ip_literal_of_loopback_is_blocked_unless_allowed() -> None:
    async with BadSite() as site:
        site.add("/", HTML)
        async with Fetcher(guarded()) as fetcher:
            error = await blocked(fetcher, site.url("/"))
        assert (error.kind, error.transient) == ("blocked", False)
        assert "loopback" in error.message
        assert site.hits["/"] == 0, "no request reached the server"
        async with Fetcher(guarded(allow_nets=("127.0.0.0/8",))) as fetcher:
            assert (await fetcher.fetch(site.url("/"))).body == HTML  # the negative case


async def test_a_name_that_resolves_to_loopback_is_blocked_at_connect_time() -> None:
    async with BadSite() as site, Fetcher(guarded()) as fetcher:
        site.add("/", HTML)
        error = await blocked(fetcher, f"http://localhost:{site.port}/")
        assert error.kind == "blocked"
        assert site.hits["/"] == 0


async def test_a_redirect_hop_to_a_refused_address_is_blocked() -> None:
    allowed = guarded(allow_nets=("127.0.0.2/32",))
    async with BadSite(host="127.0.0.2") as outside, BadSite(host="127.0.0.3") as inside:
        inside.add("/secret", HTML)
        outside.redirect("/go", inside.url("/secret"), status=302)
        async with Fetcher(allowed) as fetcher:
            error = await blocked(fetcher, outside.url("/go"))
            assert (error.kind, error.url) == ("blocked", inside.url("/secret"))
            assert outside.hits["/go"] == 1, "the allowed hop was fetched"
            assert inside.hits["/secret"] == 0, "the refused one was not"
            # Unfollowed (the crawl's default), the target becomes a URL of its own that is
            # refused when its own task fetches it.
            got = await fetcher.fetch(outside.url("/go"), follow_redirects=False)
            assert got.location == inside.url("/secret")
            assert (await blocked(fetcher, inside.url("/secret"))).kind == "blocked"


async def test_robots_fetches_pass_the_same_guard() -> None:
    async with BadSite() as site, Fetcher(guarded()) as fetcher:
        site.add("/robots.txt", "User-agent: *\nDisallow: /\n", content_type="text/plain")
        verdict = await Robots(guarded(), fetcher).check(site.url("/page"))
        assert site.hits["/robots.txt"] == 0
        assert verdict.reason == "no_robots", "the page fetch itself will be blocked"


@pytest.mark.parametrize(
    "written", ["0x7f.0.0.2", "0177.0.0.2", "127.2", "2130706434", "0x7F000002"]
)
async def test_ipv4_in_hex_octal_or_short_form_is_judged_as_its_dotted_quad(written: str) -> None:
    """WHATWG reads these as 127.0.0.2: so does the canonicalizer, and the guard refuses it,
    as a link and as a redirect hop; allowed, the same link reaches the server."""
    async with BadSite(host="127.0.0.2") as site, BadSite(host="127.0.0.3") as outside:
        site.add("/", HTML)
        outside.redirect("/go", f"http://{written}:{site.port}/", status=302)
        url = canonicalize(f"http://{written}:{site.port}/")
        assert url == site.url("/")
        async with Fetcher(guarded(allow_nets=("127.0.0.3/32",))) as fetcher:
            assert (await blocked(fetcher, url)).kind == "blocked"
            assert (await blocked(fetcher, outside.url("/go"))).url == url
            assert site.hits["/"] == 0
        async with Fetcher(guarded(allow_nets=("127.0.0.0/8",))) as fetcher:
            assert (await fetcher.fetch(outside.url("/go"))).body == HTML  # the negative case
