"""robots.txt against a real local site: rules, status handling, caching, sharing one fetch."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest

from jetcrawl.contract.settings import Settings
from jetcrawl.worker.fetcher import Fetcher
from jetcrawl.worker.robots import (
    FOUND_TTL_S,
    MAX_ROBOTS_BYTES,
    UNAVAILABLE_TTL_S,
    Robots,
    RobotsVerdict,
    product_token,
)
from tests.support.badsite import BadSite

SETTINGS = Settings(
    connect_timeout_s=2.0, read_timeout_s=2.0, total_timeout_s=10.0, allow_nets=("127.0.0.0/8",)
)
ROBOTS = """\
User-agent: *
Disallow: /

User-agent: otherbot
Allow: /

User-agent: jetcrawl
Disallow: /private
Allow: /private/ok
Crawl-delay: 2.5
"""


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def badsite() -> AsyncIterator[BadSite]:
    async with BadSite() as site:
        yield site


@pytest.fixture
async def fetcher() -> AsyncIterator[Fetcher]:
    async with Fetcher(SETTINGS) as f:
        yield f


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def robots(fetcher: Fetcher, clock: Clock) -> Robots:
    return Robots(SETTINGS, fetcher, clock)


def serve(site: BadSite, text: str, status: int = 200) -> None:
    site.add("/robots.txt", text, status=status, content_type="text/plain")


def test_product_token() -> None:
    assert product_token(SETTINGS.user_agent) == "jetcrawl"
    assert product_token("MyBot") == "MyBot"
    assert product_token("Other Bot/2.0") == "Other"


async def test_our_group_decides_and_crawl_delay_is_read(badsite: BadSite, robots: Robots) -> None:
    serve(badsite, ROBOTS)
    assert await robots.check(badsite.url("/public")) == RobotsVerdict(True, "allowed", 2.5)
    assert await robots.check(badsite.url("/private/x")) == RobotsVerdict(False, "disallowed", 2.5)
    assert (await robots.check(badsite.url("/private/ok/y"))).allowed
    assert (await robots.check(badsite.url("/robots.txt"))).allowed
    assert badsite.hits["/robots.txt"] == 1  # one fetch for the origin


async def test_another_product_token_gets_its_own_group(badsite: BadSite, fetcher: Fetcher) -> None:
    serve(badsite, ROBOTS)
    other = Robots(SETTINGS.replace(user_agent="otherbot/2.0 (+https://x)"), fetcher)
    assert await other.check(badsite.url("/private/x")) == RobotsVerdict(True, "allowed", None)
    nobody = Robots(SETTINGS.replace(user_agent="nobody/1.0"), fetcher)
    assert await nobody.check(badsite.url("/public")) == RobotsVerdict(False, "disallowed", None)


async def test_a_jobs_own_user_agent_is_judged_by_its_own_token(
    badsite: BadSite, robots: Robots
) -> None:
    serve(badsite, ROBOTS)
    job_agent = "otherbot/2.0 (+https://x)"  # a job's fetch policy sends this one
    assert await robots.check(badsite.url("/private/x"), job_agent) == RobotsVerdict(
        True, "allowed", None
    )
    assert not (await robots.check(badsite.url("/private/x"))).allowed, "the worker's own"
    assert badsite.hits["/robots.txt"] == 1, "one file for every token"


async def test_a_byte_order_mark_does_not_hide_the_first_line(
    badsite: BadSite, robots: Robots
) -> None:
    serve(badsite, "\ufeffUser-agent: *\nDisallow: /x\n")
    assert not (await robots.check(badsite.url("/x"))).allowed


@pytest.mark.parametrize("status", [404, 403, 410])
async def test_a_4xx_robots_allows_everything(
    badsite: BadSite, robots: Robots, status: int
) -> None:
    serve(badsite, "User-agent: *\nDisallow: /\n", status=status)
    assert await robots.check(badsite.url("/any")) == RobotsVerdict(True, "no_robots", None)


async def test_a_missing_robots_is_cached_for_a_day(
    badsite: BadSite, robots: Robots, clock: Clock
) -> None:
    assert (await robots.check(badsite.url("/a"))).reason == "no_robots"
    clock.now += FOUND_TTL_S - 1
    assert (await robots.check(badsite.url("/b"))).reason == "no_robots"
    assert badsite.hits["/robots.txt"] == 1
    serve(badsite, "User-agent: *\nDisallow: /b\n")
    clock.now += 2
    assert (await robots.check(badsite.url("/b"))).reason == "disallowed"
    assert badsite.hits["/robots.txt"] == 2


@pytest.mark.parametrize("status", [500, 503, 429])
async def test_an_unreachable_robots_disallows_for_a_minute_then_is_fetched_again(
    badsite: BadSite, robots: Robots, clock: Clock, status: int
) -> None:
    serve(badsite, "", status=status)
    unavailable = RobotsVerdict(False, "unavailable", None, detail=f"HTTP {status}")
    assert await robots.check(badsite.url("/a")) == unavailable
    clock.now += UNAVAILABLE_TTL_S - 1
    assert await robots.check(badsite.url("/a")) == unavailable
    assert badsite.hits["/robots.txt"] == 1  # not hammered while it is down
    serve(badsite, "User-agent: *\nDisallow: /private\n")
    clock.now += 2
    assert await robots.check(badsite.url("/a")) == RobotsVerdict(True, "allowed", None)
    assert badsite.hits["/robots.txt"] == 2


async def test_a_network_failure_is_unavailable(robots: Robots) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    verdict = await robots.check(f"http://127.0.0.1:{port}/a")  # nothing listens there
    assert (verdict.allowed, verdict.reason) == (False, "unavailable")
    assert verdict.detail.startswith("refused: "), "says why"


async def test_the_last_rules_read_stay_while_robots_is_unreachable(
    badsite: BadSite, robots: Robots, clock: Clock
) -> None:
    serve(badsite, "User-agent: *\nDisallow: /x\n")
    assert (await robots.check(badsite.url("/y"))).allowed
    serve(badsite, "", status=503)
    clock.now += FOUND_TTL_S + 1
    assert (await robots.check(badsite.url("/y"))).reason == "allowed"
    assert (await robots.check(badsite.url("/x"))).reason == "disallowed"
    assert badsite.hits["/robots.txt"] == 2
    clock.now += UNAVAILABLE_TTL_S + 1  # and it is tried again soon
    await robots.check(badsite.url("/y"))
    assert badsite.hits["/robots.txt"] == 3


async def test_concurrent_checks_of_one_origin_share_one_fetch(
    badsite: BadSite, robots: Robots
) -> None:
    gate = asyncio.Event()
    badsite.add("/robots.txt", ROBOTS, content_type="text/plain", gate=gate)
    checks = asyncio.gather(*(robots.check(badsite.url(f"/p{n}")) for n in range(50)))
    await badsite.arrived.setdefault("/robots.txt", asyncio.Event()).wait()
    gate.set()
    verdicts = await checks
    assert {v.reason for v in verdicts} == {"allowed"}
    assert badsite.hits["/robots.txt"] == 1


async def test_a_cancelled_fetch_leaves_the_waiting_checks_an_answer(
    badsite: BadSite, robots: Robots
) -> None:
    gate = asyncio.Event()
    badsite.add("/robots.txt", ROBOTS, content_type="text/plain", gate=gate)
    first = asyncio.create_task(robots.check(badsite.url("/first")))
    await badsite.arrived.setdefault("/robots.txt", asyncio.Event()).wait()
    waiting = asyncio.create_task(robots.check(badsite.url("/second")))
    await asyncio.sleep(0)  # let it queue behind the fetch
    first.cancel()
    gate.set()
    assert (await waiting).reason == "allowed"
    assert first.cancelled()
    assert badsite.hits["/robots.txt"] == 2  # the waiter fetched in the cancelled one's place


async def test_redirects_are_followed(badsite: BadSite, robots: Robots) -> None:
    badsite.redirect("/robots.txt", "/moved/robots.txt", status=301)
    badsite.redirect("/moved/robots.txt", "/final.txt", status=302)
    badsite.add("/final.txt", "User-agent: *\nDisallow: /x\n", content_type="text/plain")
    assert (await robots.check(badsite.url("/x"))).reason == "disallowed"
    assert (await robots.check(badsite.url("/y"))).reason == "allowed"


async def test_a_redirect_loop_means_no_robots(badsite: BadSite, robots: Robots) -> None:
    badsite.redirect("/robots.txt", "/again.txt")
    badsite.redirect("/again.txt", "/robots.txt")
    assert await robots.check(badsite.url("/x")) == RobotsVerdict(True, "no_robots", None)


async def test_an_oversized_robots_is_read_up_to_500_kib(badsite: BadSite, robots: Robots) -> None:
    head = "User-agent: *\nDisallow: /before\n"
    padding = "# " + "x" * 97 + "\n"  # 100 bytes a line
    body = head + padding * (MAX_ROBOTS_BYTES // 100 - 2) + "Disallow: /late\n"
    assert len(body.encode()) < MAX_ROBOTS_BYTES  # /late is within the limit ...
    body += padding * 50 + "Disallow: /after\n"  # ... /after is not
    serve(badsite, body)
    assert (await robots.check(badsite.url("/before"))).reason == "disallowed"
    assert (await robots.check(badsite.url("/late"))).reason == "disallowed"
    assert (await robots.check(badsite.url("/after"))).reason == "allowed"


async def test_the_cache_keeps_the_most_recently_used_origins(
    fetcher: Fetcher, clock: Clock
) -> None:
    async with BadSite() as a, BadSite() as b, BadSite() as c:
        robots = Robots(SETTINGS, fetcher, clock, max_origins=2)
        for site in (a, b, a, c):  # c evicts b, the least recently used
            await robots.check(site.url("/x"))
        await robots.check(a.url("/y"))
        await robots.check(c.url("/y"))
        assert (a.hits["/robots.txt"], c.hits["/robots.txt"]) == (1, 1)
        await robots.check(b.url("/y"))
        assert b.hits["/robots.txt"] == 2
