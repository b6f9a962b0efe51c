"""Proxies (worker/proxies.py, worker/pages.py) and the fetch policy (contract/fetchpolicy.py):
rotation and benching unit by unit, then crawls through local forward proxies that record which
requests they carried."""

from __future__ import annotations

import logging

import pytest
from nats.js import JetStreamContext

from jetcrawl.contract.errors import SettingsError, SpecError
from jetcrawl.contract.fetchpolicy import FetchPolicy
from jetcrawl.contract.settings import Settings
from jetcrawl.local.embedded import NatsServer
from jetcrawl.worker.errors import FetchError
from jetcrawl.worker.fetcher import Fetcher
from jetcrawl.worker.proxies import ProxyPool, resolve
from tests.support.proxy import ForwardProxy, dead_proxy_url
from tests.support.socks import SocksProxy
from tests.test_good_citizen import crawling, drained, results, seed, settings_for, site_of
from tests.test_softblock import CLOUDFLARE

# --- the policy


@pytest.mark.parametrize(
    ("doc", "path", "problem"),
    [
        ({"render": "sometimes"}, "fetch.render", "must be one of never, auto, always"),
        ({"rendre": "auto"}, "fetch.rendre", "unknown field"),
        ({"proxies": "http://p:1"}, "fetch.proxies", "must be a list"),
        ({"proxies": ["socks4://p:1080"]}, "fetch.proxies[0]", "scheme must be one of"),
        ({"proxies": ["http://u:hunter2@p:1"]}, "fetch.proxies[0]", "${VARIABLE} reference"),
        ({"proxies": ["http://p:1/path"]}, "fetch.proxies[0]", "scheme://[user:password@]host"),
        ({"on_block": "proxy"}, "fetch.on_block", "needs a list of proxies"),
        ({"user_agent": ""}, "fetch.user_agent", "non-empty"),
        ([], "fetch", "must be an object"),
    ],
)
def test_a_bad_fetch_section_names_its_field(doc: object, path: str, problem: str) -> None:
    with pytest.raises(SpecError) as caught:
        FetchPolicy.from_doc(doc)
    assert caught.value.path == path and problem in caught.value.problem


def test_a_good_fetch_section_round_trips() -> None:
    doc = {
        "render": "auto",
        "user_agent": "acme-bot/2.0 (+https://acme.test/bot)",
        "proxies": ["http://crawler:${PROXY_PASSWORD}@proxy.acme.test:3128"],
        "proxy_rotation": "round_robin",
        "on_block": "proxy",
    }
    assert FetchPolicy.from_doc(doc).to_doc() == doc
    assert FetchPolicy.from_settings(Settings()) == FetchPolicy()


def test_settings_refuse_a_bad_policy_and_name_the_setting() -> None:
    with pytest.raises(SettingsError, match="setting proxies\\[0\\]: scheme"):
        Settings(proxies=("ftp://p:21",))


def test_the_default_user_agent_names_its_contact_url() -> None:
    assert Settings().user_agent == "jetcrawl/0.1 (+https://github.com/jetcrawl/jetcrawl)"
    assert Settings(contact_url="https://acme.test/bot").user_agent == (
        "jetcrawl/0.1 (+https://acme.test/bot)"
    )
    assert Settings(user_agent="own/1.0").user_agent == "own/1.0"
    with pytest.raises(SettingsError, match="contact_url"):
        Settings(contact_url="acme.test")


# --- the pool, on a clock of our own


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


PROXIES = ["http://a.test:1", "http://b.test:1", "http://c.test:1"]


def test_sticky_keeps_a_host_on_its_proxy_and_moves_only_the_benched_ones_hosts() -> None:
    pool = ProxyPool(PROXIES, "sticky", 10.0, env={})
    hosts = [f"h{n}.test" for n in range(60)]
    first = {h: pool.pick(h) for h in hosts}
    assert {h: pool.pick(h) for h in hosts} == first, "sticky"
    assert len({p.label for p in first.values() if p}) == 3, "spread over all three"
    benched = first[hosts[0]]
    assert benched is not None
    pool.failed(benched, "test")
    after = {h: pool.pick(h) for h in hosts}
    moved = {h for h in hosts if after[h] != first[h]}
    assert moved == {h for h in hosts if first[h] == benched}, "only the benched one's hosts"


def test_round_robin_takes_turns_and_skips_the_benched() -> None:
    clock = Clock()
    pool = ProxyPool(PROXIES, "round_robin", 10.0, env={}, clock=clock)
    labels = [p.label for p in (pool.pick("h.test") for _ in range(6)) if p]
    assert labels == PROXIES * 2
    a = pool.proxies[0]
    pool.failed(a, "test")
    assert a.label not in {p.label for p in (pool.pick("h.test") for _ in range(4)) if p}
    clock.now = 10.0  # the bench is over
    assert a.label in {p.label for p in (pool.pick("h.test") for _ in range(3)) if p}


def test_the_bench_doubles_with_each_failure_and_a_success_ends_it() -> None:
    clock = Clock()
    pool = ProxyPool(PROXIES[:1], "sticky", 10.0, env={}, clock=clock)
    proxy = pool.proxies[0]
    pool.failed(proxy, "test")
    assert pool.pick("h.test") is None and pool.soonest_back_s() == 10.0
    clock.now = 10.0
    assert pool.pick("h.test") == proxy
    pool.failed(proxy, "again")
    assert pool.soonest_back_s() == 20.0, "doubled"
    clock.now = 30.0
    pool.succeeded(proxy)
    pool.failed(proxy, "a new streak")
    assert pool.soonest_back_s() == 10.0


def test_credentials_come_from_the_environment_and_never_show() -> None:
    proxy = resolve("http://crawler:${PROXY_PW}@p.test:3128", env={"PROXY_PW": "s3cret"})
    assert proxy.url == "http://crawler:s3cret@p.test:3128"
    assert proxy.label == "http://p.test:3128"
    assert "s3cret" not in repr(proxy)
    with pytest.raises(SettingsError, match="environment variable PROXY_PW is not set"):
        resolve("http://crawler:${PROXY_PW}@p.test:3128", env={})


# --- crawls through local proxies


async def test_round_robin_spreads_a_crawl_over_the_proxies(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    async with ForwardProxy() as one, ForwardProxy() as two, site_of("127.0.0.2", 6) as site:
        settings = settings_for(
            nats_server, proxies=(one.url, two.url), proxy_rotation="round_robin"
        )
        async with crawling(settings):
            await seed(js, [site.url("/")])
            await drained(js)
    pages = {site.url("/")} | {site.url(f"/p{n}") for n in range(6)}
    assert set(await results(js)) == pages
    carried = one.log + two.log
    assert sorted(carried) == sorted(pages), "every page went through a proxy, once"
    assert abs(len(one.log) - len(two.log)) <= 1, (one.log, two.log)
    assert set(site.paths()) == {p.removeprefix(site.origin) for p in pages}


async def test_a_dead_proxy_is_benched_and_the_crawl_goes_on_through_the_live_one(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    dead = dead_proxy_url()
    async with ForwardProxy() as live, site_of("127.0.0.2", 6) as site:
        settings = settings_for(nats_server, proxies=(dead, live.url), proxy_rotation="round_robin")
        async with crawling(settings) as worker:
            await seed(js, [site.url("/")])
            await drained(js)
    crawled = await results(js)
    assert len(crawled) == 7 and all(r.outcome == "fetched" for r in crawled.values())
    assert sorted(live.log) == sorted(crawled), "the live proxy carried every page"
    retried = [r for r in crawled.values() if r.attempt > 1]
    assert len(retried) == 1, "one failure benched the dead proxy: no other task met it"
    assert worker.stats.retried == 1


async def test_proxy_credentials_are_sent_and_never_logged(
    nats_server: NatsServer,
    js: JetStreamContext,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("TEST_PROXY_PASSWORD", "wrong-pass-1")
    caplog.set_level(logging.DEBUG)
    async with (
        ForwardProxy(require_auth=("crawler", "right-pass-2")) as proxy,
        site_of("127.0.0.2", 0) as site,
    ):
        url = f"http://crawler:${{TEST_PROXY_PASSWORD}}@127.0.0.1:{proxy.port}"
        settings = settings_for(nats_server, proxies=(url,), task_max_deliver=1)
        async with crawling(settings):
            await seed(js, [site.url("/")])
            await drained(js)
        refused = (await results(js))[site.url("/")]
        assert refused.outcome == "failed" and refused.error is not None
        assert refused.error.kind == "proxy" and proxy.refused == 1
        monkeypatch.setenv("TEST_PROXY_PASSWORD", "right-pass-2")
        async with crawling(settings.replace(task_max_deliver=3)):
            await seed(js, [site.url("/?again")])
            await drained(js)
        assert proxy.log == [site.url("/?again")], "the right password from the environment"
    assert "wrong-pass-1" not in caplog.text and "right-pass-2" not in caplog.text
    assert f"127.0.0.1:{proxy.port}" in caplog.text, "the proxy is named, by its label"


async def test_the_ssrf_guard_holds_through_a_proxy(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    async with ForwardProxy() as proxy, site_of("127.0.0.2", 0) as site:
        settings = settings_for(
            nats_server, proxies=(proxy.url,), allow_nets=("127.0.0.2/32", "127.0.0.1/32")
        )
        async with crawling(settings):
            await seed(js, ["http://169.254.169.254/latest/meta-data/", site.url("/")])
            await drained(js)
    crawled = await results(js)
    metadata = crawled["http://169.254.169.254/latest/meta-data/"]
    assert metadata.outcome == "failed" and metadata.error is not None
    assert metadata.error.kind == "blocked" and "link_local" in metadata.error.message
    assert proxy.log == [site.url("/")], "the refused address never reached the proxy"


async def test_a_crawl_goes_through_a_socks5_proxy_which_is_given_checked_addresses_only(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    async with SocksProxy() as proxy, site_of("127.0.0.2", 3) as site:
        assert FetchPolicy.from_doc({"proxies": [proxy.url]}).proxies == (proxy.url,)
        # The proxy's own address is not put to the guard (the operator chose it): only the
        # site's is allowed, so localhost (a name) and the metadata address are refused.
        settings = settings_for(nats_server, proxies=(proxy.url,), allow_nets=("127.0.0.2/32",))
        refused = ["http://169.254.169.254/latest/meta-data/", f"http://localhost:{proxy.port}/"]
        async with crawling(settings):
            await seed(js, [*refused, site.url("/")])
            await drained(js)
    crawled = await results(js)
    pages = {site.url("/")} | {site.url(f"/p{n}") for n in range(3)}
    assert {u for u, r in crawled.items() if r.outcome == "fetched"} == pages
    assert set(site.paths()) == {p.removeprefix(site.origin) for p in pages}
    for url in refused:
        error = crawled[url].error
        assert crawled[url].outcome == "failed" and error is not None, crawled[url]
        assert error.kind == "blocked", error
    assert proxy.connects, "the pages went through the proxy"
    assert set(proxy.connects) == {("ip", "127.0.0.2", site.port)}, "checked addresses only"


async def test_the_socks5_connector_checks_every_hop_of_a_fetch_before_the_proxy_sees_it() -> None:
    # The worker puts a task's URL to the guard before a proxy gets it (above); the redirects a
    # fetch follows, and a name that resolves elsewhere by the time of the connection, are
    # checked where the SOCKS5 connection is made, and the proxy is given that checked address.
    site = site_of("127.0.0.2", 0)
    async with SocksProxy() as proxy, site:
        site.add("/away", status=302, headers={"Location": f"http://localhost:{proxy.port}/x"})
        async with Fetcher(Settings(allow_nets=("127.0.0.2/32",))) as fetcher:
            fetched = await fetcher.fetch(site.url("/"), proxy=proxy.url)
            assert fetched.status == 200
            with pytest.raises(FetchError) as refused:
                await fetcher.fetch(site.url("/away"), proxy=proxy.url, follow_redirects=True)
    assert refused.value.kind == "blocked" and "loopback" in refused.value.message
    assert set(proxy.connects) == {("ip", "127.0.0.2", site.port)}, "never localhost"


async def test_a_dead_socks5_proxy_is_benched_like_an_http_one(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    dead = dead_proxy_url().replace("http://", "socks5://")
    async with SocksProxy() as live, site_of("127.0.0.2", 2) as site:
        settings = settings_for(nats_server, proxies=(dead, live.url), proxy_rotation="round_robin")
        async with crawling(settings) as worker:
            await seed(js, [site.url("/")])
            await drained(js)
    crawled = await results(js)
    assert len(crawled) == 3 and all(r.outcome == "fetched" for r in crawled.values())
    assert worker.stats.retried == 1, "one failure benched the dead proxy"


async def test_on_block_proxy_benches_the_walled_proxy_and_fetches_through_the_next(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    async with (
        ForwardProxy(wall=CLOUDFLARE) as walled,
        ForwardProxy() as clean,
        site_of("127.0.0.2", 4) as site,
    ):
        settings = settings_for(
            nats_server,
            proxies=(walled.url, clean.url),
            proxy_rotation="round_robin",
            on_block="proxy",
        )
        async with crawling(settings) as worker:
            await seed(js, [site.url("/")])
            await drained(js)
    crawled = await results(js)
    assert len(crawled) == 5 and {r.outcome for r in crawled.values()} == {"fetched"}
    assert walled.log == [site.url("/")], "benched after its first wall"
    assert sorted(clean.log) == sorted(crawled), "the clean proxy fetched every page"
    assert worker.stats.retried == 0, "escalated in place: no attempt spent"
