"""The multi-host test site serves what it claims, and its expected sets are what a crawl finds."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass, field
from urllib.parse import urljoin, urlsplit
from urllib.robotparser import RobotFileParser

import aiohttp
import pytest

from tests.support.site import TRACKING_PARAMS, MultiHostSite, canonical, extract_links
from tests.support.site.model import BINARY_EXTENSIONS


@dataclass
class Crawl:
    """What the reference crawl saw, as canonical URLs."""

    fetched: dict[str, int] = field(default_factory=dict)  # URL -> status
    disallowed: set[str] = field(default_factory=set)
    depths: dict[str, int] = field(default_factory=dict)
    pages: dict[str, str] = field(default_factory=dict)  # URL -> HTML

    @property
    def reachable(self) -> set[str]:
        return set(self.fetched) | self.disallowed


async def reference_crawl(
    session: aiohttp.ClientSession,
    seeds: list[str],
    *,
    scope: str = "any",
    obey_robots: bool = True,
    honour_base: bool = True,
    tracking: Collection[str] = TRACKING_PARAMS,
    skip_binaries: bool = True,
) -> Crawl:
    """A plain BFS crawler: robots.txt per host, no redirect following (Location is a link),
    the ``tracking`` parameters stripped, links to binaries skipped by extension (as Scrapy's
    LinkExtractor compares) unless ``skip_binaries`` is False."""
    crawl = Crawl()
    robots: dict[str, RobotFileParser] = {}
    queue = [canonical(seed, tracking) or seed for seed in seeds]
    crawl.depths = dict.fromkeys(queue, 0)
    while queue:
        url = queue.pop(0)
        host = urlsplit(url).netloc
        if host not in robots:
            async with session.get(f"http://{host}/robots.txt") as response:
                robots[host] = RobotFileParser()
                robots[host].parse((await response.text()).splitlines())
        if obey_robots and not robots[host].can_fetch("jetcrawl", url):
            crawl.disallowed.add(url)
            continue
        async with session.get(url, allow_redirects=False) as response:
            crawl.fetched[url] = response.status
            links: list[str] = []
            if response.status in (301, 302, 303, 307, 308):
                links = [urljoin(url, response.headers["Location"])]
            elif response.status == 200 and response.content_type == "text/html":
                page = await response.text()
                crawl.pages[url] = page
                if not honour_base:
                    page = re.sub(r"<base [^>]*>", "", page)
                links = extract_links(page, url)
        for link in links:
            target = canonical(link, tracking)
            if target is None or target in crawl.depths:
                continue
            if scope == "host" and urlsplit(target).netloc != host:
                continue
            if skip_binaries and urlsplit(target).path.lower().endswith(BINARY_EXTENSIONS):
                continue
            crawl.depths[target] = crawl.depths[url] + 1
            queue.append(target)
    return crawl


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


async def test_every_fetchable_url_answers_its_status(
    site: MultiHostSite, session: aiohttp.ClientSession
) -> None:
    everything = site.expected(skip_binaries=False)
    kinds = {url: site.kind(url) for url in everything.reachable}
    assert "resource" in kinds.values()
    for url, status in everything.fetchable.items():
        async with session.get(url, allow_redirects=False) as response:
            assert response.status == status, url
            if kinds[url] == "page":
                assert response.content_type == "text/html"
            elif kinds[url] == "resource":
                assert response.content_type in ("application/pdf", "image/png")
            elif kinds[url] == "redirect":
                assert urljoin(url, response.headers["Location"]) == site.redirects[url]
                assert site.statuses[site.redirects[url]] == 200
    for url in site.disallowed:  # they exist: only robots.txt keeps a crawler out
        async with session.get(url) as response:
            assert response.status == 200
    assert site.request_counts == Counter([*everything.fetchable, *everything.disallowed])


async def test_the_reference_crawl_finds_exactly_the_expected_sets(
    site: MultiHostSite, session: aiohttp.ClientSession
) -> None:
    crawl = await reference_crawl(session, site.seeds)
    assert crawl.fetched == site.statuses
    assert crawl.disallowed == site.disallowed
    assert crawl.reachable == site.reachable
    assert crawl.depths == dict(site.depths)
    assert_depth_is_order_independent(site, crawl)

    requested = site.request_counts
    assert max(requested.values()) == 1  # nothing twice
    assert set(requested) == set(site.fetchable) | {f"{b}/robots.txt" for b in site.base_urls}
    assert not any(urlsplit(url).path.startswith("/private/") for url in requested)
    assert not any(name in url for url in requested for name in TRACKING_PARAMS)


async def test_a_crawl_that_fetches_everything_finds_the_binaries_too(
    site: MultiHostSite, session: aiohttp.ClientSession
) -> None:
    crawl = await reference_crawl(session, site.seeds, skip_binaries=False)
    everything = site.expected(skip_binaries=False)
    assert crawl.fetched == everything.fetchable
    assert crawl.depths == everything.depths
    binaries = set(everything.fetchable) - site.fetchable
    assert binaries, "the default crawl leaves them out"
    assert all(site.kind(url) == "resource" for url in binaries)
    assert site.fetchable < set(everything.fetchable)


@pytest.mark.parametrize(
    ("seed", "hosts", "pages_per_host"), [(1, 1, 4), (2, 2, 10), (3, 4, 50), (4, 3, 30)]
)
async def test_other_seeds_and_sizes_hold_too(
    session: aiohttp.ClientSession, seed: int, hosts: int, pages_per_host: int
) -> None:
    async with MultiHostSite(seed, hosts, pages_per_host) as site:
        crawl = await reference_crawl(session, site.seeds)
        assert crawl.fetched == site.statuses
        assert crawl.disallowed == site.disallowed
        assert crawl.depths == dict(site.depths)
        assert max(site.request_counts.values()) == 1
        assert_depth_is_order_independent(site, crawl)


def assert_depth_is_order_independent(site: MultiHostSite, crawl: Crawl) -> None:
    """Every link from depth d goes to depth d + 1, to depth <= 1, or to the page itself; a
    redirect's target has its source's depth. So a crawler that keeps the first depth it sees
    for a URL still records the BFS depth, whatever order its workers take (binaries included:
    they lead nowhere, so skipping them moves no other URL's depth)."""
    depths = site.expected(skip_binaries=False).depths
    assert all(depths[url] == depth for url, depth in site.depths.items())
    for url, page in crawl.pages.items():
        for link in filter(None, map(canonical, extract_links(page, url))):
            assert link == url or depths[link] in (depths[url] + 1, 0, 1), (url, link)
    for source, target in site.redirects.items():
        assert depths[target] == depths[source]


async def test_every_trap_is_in_the_pages(
    site: MultiHostSite, session: aiohttp.ClientSession
) -> None:
    crawl = await reference_crawl(session, site.seeds)
    hrefs = [
        href
        for page in crawl.pages.values()
        for href in re.findall(r'<a href="([^"]*)"', page.replace("&amp;", "&"))
    ]
    kinds = Counter(map(site.kind, site.expected(skip_binaries=False).reachable))
    assert kinds["resource"] and kinds["missing"] and kinds["redirect"] and kinds["disallowed"]
    assert {site.statuses[url] for url in site.redirects} == {301, 302}
    assert any("#" in href for href in hrefs)
    assert any(href.startswith("#") or href == "" for href in hrefs)  # the page itself
    assert any(name in href for href in hrefs for name in TRACKING_PARAMS)
    assert any("?page=" in href for href in hrefs)  # an unsorted query
    assert any(href.startswith("//") for href in hrefs)
    assert any(href.startswith("../") for href in hrefs)
    assert any(re.fullmatch(r"\d+\.html(#.*)?", href) for href in hrefs)  # relative, under <base>
    assert any(href.startswith("mailto:") for href in hrefs)
    assert any(href.startswith("javascript:") for href in hrefs)
    assert all('<base href="/docs/">' in crawl.pages[f"{b}/"] for b in site.base_urls)
    assert any(repeats(extract_links(page, url)) for url, page in crawl.pages.items())


def repeats(links: list[str]) -> bool:
    canonical_links = [canonical(link) for link in links if canonical(link)]
    return len(set(canonical_links)) < len(canonical_links)


async def test_a_careless_crawler_finds_urls_outside_the_expected_sets(
    site: MultiHostSite, session: aiohttp.ClientSession
) -> None:
    ignoring_robots = await reference_crawl(session, site.seeds, obey_robots=False)
    extra = set(ignoring_robots.fetched) - site.fetchable
    assert extra and extra >= site.disallowed
    assert any("/hidden/" in url for url in extra)

    ignoring_base = await reference_crawl(session, site.seeds, honour_base=False)
    assert set(ignoring_base.fetched) - site.fetchable


async def test_depths_are_the_generated_levels(site: MultiHostSite) -> None:
    assert site.reachable_within(0) == frozenset(site.seeds)
    previous: frozenset[str] = frozenset()
    for depth in range(max(site.depths.values()) + 1):
        within = site.reachable_within(depth)
        assert previous < within
        previous = within
    assert previous == site.reachable
    for url, depth in site.depths.items():
        if site.kinds[url] == "page":
            assert site.page_level(url) == depth, url

    limited = site.expected(max_depth=2)
    assert limited.reachable == site.reachable_within(2)


async def test_a_depth_limited_crawl_matches_reachable_within(
    site: MultiHostSite, session: aiohttp.ClientSession
) -> None:
    crawl = await reference_crawl(session, site.seeds)
    for max_depth in (1, 3):
        found = {url for url, depth in crawl.depths.items() if depth <= max_depth}
        assert found == site.reachable_within(max_depth)


async def test_host_scope_stays_on_the_seed_host(
    site: MultiHostSite, session: aiohttp.ClientSession
) -> None:
    root = f"{site.base_urls[1]}/"
    on_host = site.reachable_from(root, scope="host")
    assert {urlsplit(url).netloc for url in on_host} == {site.hosts[1]}
    assert on_host < site.reachable_from(root, scope="any")
    crawl = await reference_crawl(session, [root], scope="host")
    assert crawl.reachable == on_host


async def test_the_same_seed_serves_the_same_site(
    site: MultiHostSite, session: aiohttp.ClientSession
) -> None:
    async with MultiHostSite(seed=site.seed) as twin, MultiHostSite(seed=site.seed + 1) as other:
        assert twin.hosts != site.hosts  # other ports ...
        assert shape(twin) == shape(site)  # ... same site
        assert await body(session, twin, twin.seeds[0]) == await body(session, site, site.seeds[0])
        assert shape(other) != shape(site)


def shape(site: MultiHostSite) -> dict[object, object]:
    return {
        site.locate(url): (kind, site.depths[url], site.statuses.get(url))
        for url, kind in site.kinds.items()
    }


async def body(session: aiohttp.ClientSession, site: MultiHostSite, url: str) -> str:
    async with session.get(url) as response:
        text = await response.text()
    for index, host in enumerate(site.hosts):
        text = text.replace(host, f"HOST{index}")
    return text


async def test_a_stopped_site_serves_again_on_the_same_ports(
    site: MultiHostSite, session: aiohttp.ClientSession
) -> None:
    hosts = site.hosts
    await site.stop()
    with pytest.raises(aiohttp.ClientConnectionError):
        async with session.get(site.seeds[0]):
            pass
    await site.start()
    assert site.hosts == hosts
    async with session.get(site.seeds[0]) as response:
        assert response.status == 200
