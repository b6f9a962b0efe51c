"""A dispatcher and a worker (in this process, owning every shard) against misbehaving sites.

Politeness measured at the server (request arrival times), Retry-After, the slow host that must
not hold up the fast ones, retries then success, retries running out, redirects through the
frontier, and the SSRF guard inside a crawl. Each site listens on its own loopback address, so
each is a host of its own for politeness.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

import orjson
from nats.errors import NoRespondersError
from nats.js import JetStreamContext
from nats.js.errors import BadRequestError, ServiceUnavailableError

from jetcrawl.contract.deadletters import DeadLetter
from jetcrawl.contract.messages import DEFAULT_JOB, DEFAULT_PRIORITY, Result, Task, WorkerReport
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import (
    DEAD_STREAM,
    RESULTS_STREAM,
    SEEDS,
    TASKS_STREAM,
    lane_consumer,
)
from jetcrawl.dispatcher import Dispatcher
from jetcrawl.local.drain import Snapshot, snapshot
from jetcrawl.local.embedded import NatsServer
from jetcrawl.ops.status import Status, read_reports
from jetcrawl.plumbing.bus import PublishFailed
from jetcrawl.plumbing.metrics import WorkerMetrics
from jetcrawl.plumbing.topology import ensure
from jetcrawl.worker import Worker
from jetcrawl.worker.crawl import PUBLISH_TRIES
from jetcrawl.worker.unpublished import unreachable
from tests.support.badsite import BadSite
from tests.support.streams import eventually, stored

SHARDS = 4


def settings_for(nats_server: NatsServer, **changes: Any) -> Settings:
    return Settings(
        nats_url=nats_server.url,
        shards=SHARDS,
        ack_wait_s=2.0,
        concurrency=4,
        host_delay_s=0.0,
        retry_base_delay_s=0.05,
        allow_nets=("127.0.0.0/8",),
        connect_timeout_s=2.0,
        read_timeout_s=2.0,
        total_timeout_s=5.0,
    ).replace(**changes)


@asynccontextmanager
async def crawling(
    settings: Settings, metrics: WorkerMetrics | None = None
) -> AsyncIterator[Worker]:
    """A dispatcher and a worker that owns every shard, until the block ends."""
    async with (
        Dispatcher(settings) as dispatcher,
        Worker(settings, "w1", metrics=metrics) as worker,
        asyncio.TaskGroup() as tg,
    ):
        tg.create_task(dispatcher.run())
        tg.create_task(worker.run())
        await worker.wait_running()
        for shard in range(settings.shards):
            await worker.on_acquired(shard, fence=1)
        try:
            yield worker
        finally:
            worker.stop()
            dispatcher.stop()


async def seed(js: JetStreamContext, urls: Iterable[str]) -> None:
    for url in urls:  # one message each: their tasks are published in this order
        await js.publish(SEEDS, orjson.dumps({"url": url, "scope": "any"}))


async def drained(js: JetStreamContext, shards: int = SHARDS, within_s: float = 30) -> Snapshot:
    previous: Snapshot | None = None
    current: Snapshot | None = None

    async def settled() -> bool:
        nonlocal previous, current
        previous, current = current, await snapshot(js, shards)
        return current.settled_after(previous)

    await eventually(settled, within_s)
    assert current is not None
    return current


async def results(js: JetStreamContext) -> dict[str, Result]:
    out: dict[str, Result] = {}
    for m in await stored(js, RESULTS_STREAM):
        result = Result.from_wire(m.data)
        assert result.url not in out, f"two results for {result.url}"
        out[result.url] = result
    return out


async def dead_letters(js: JetStreamContext) -> list[DeadLetter]:
    return [DeadLetter.from_wire(m.data) for m in await stored(js, DEAD_STREAM)]


async def redelivered(js: JetStreamContext) -> int:
    return sum(info.num_redelivered or 0 for info in await js.consumers_info(TASKS_STREAM))


def page(*links: str, title: str = "p") -> str:
    return f"<title>{title}</title>" + "".join(f"<a href='{link}'>x</a>" for link in links)


def site_of(host: str, pages: int, robots: str = "") -> BadSite:
    site = BadSite(host=host)
    site.add("/", page(*(f"/p{n}" for n in range(pages))))
    for n in range(pages):
        site.add(f"/p{n}", page(title=f"p{n}"))
    if robots:
        site.add("/robots.txt", robots, content_type="text/plain")
    return site


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


# --- politeness


async def test_crawl_delay_spaces_requests_and_waiting_past_ack_wait_is_no_attempt(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    # Crawl-delay 0.4 s and AckWait 1 s: the last of 6 pages waits about 2.4 s for its turn.
    settings = settings_for(nats_server, ack_wait_s=1.0)
    async with (
        site_of("127.0.0.2", 6, robots="User-agent: *\nCrawl-delay: 0.4\n") as polite,
        site_of("127.0.0.3", 6) as eager,  # the negative case: no Crawl-delay, no host delay
        crawling(settings) as worker,
    ):
        await seed(js, [polite.url("/"), eager.url("/")])
        await drained(js)
        assert worker.stats.deferred == 0, "no pressure: every task waited in the worker"
    spaced = gaps([t for t, path in polite.log if path != "/robots.txt"])
    assert len(spaced) == 6 and min(spaced) >= 0.36, spaced
    assert max(gaps([t for t, path in eager.log if path != "/robots.txt"])) < 0.36
    crawled = await results(js)
    assert len(crawled) == 14
    assert {r.attempt for r in crawled.values()} == {1}, "waiting is not an attempt"
    assert await redelivered(js) == 0, "kept alive past AckWait: JetStream never took one back"


async def test_crawl_delay_is_capped(nats_server: NatsServer, js: JetStreamContext) -> None:
    settings = settings_for(nats_server, max_crawl_delay_s=0.2)
    async with (
        site_of("127.0.0.2", 3, robots="User-agent: *\nCrawl-delay: 3600\n") as site,
        crawling(settings),
    ):
        await seed(js, [site.url("/")])
        await drained(js)
    spaced = gaps([t for t, path in site.log if path != "/robots.txt"])
    assert min(spaced) >= 0.18 and max(spaced) < 1.0, spaced


async def test_retry_after_pauses_the_whole_host(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    async with site_of("127.0.0.2", 4) as site, crawling(settings_for(nats_server)):
        site.add("/p0", status=429, headers={"Retry-After": "1"}, times=1)
        await seed(js, [site.url("/")])
        await drained(js)
    [refused_at] = [t for t, path in site.log if path == "/p0"][:1]
    after = [t - refused_at for t, path in site.log if t > refused_at]
    assert len(after) == 4, site.paths()  # p1, p2, p3 and p0 again
    assert min(after) >= 0.9, "no request to the host during its Retry-After"
    crawled = await results(js)
    assert (crawled[site.url("/p0")].status, crawled[site.url("/p0")].attempt) == (200, 2)


async def test_a_slow_host_does_not_hold_up_fast_hosts_in_its_shard(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    # One shard. The slow host (Crawl-delay 0.5 s) has 12 pages queued before the fast hosts'
    # 48 tasks, and the worker holds at most 4 + 4 tasks. A slow task waiting its turn holds no
    # fetch slot; when the holding is full, the slow tasks whose turn is beyond AckWait (1 s)
    # are handed back to JetStream for later, so the puller reaches the fast hosts' tasks.
    settings = settings_for(nats_server, shards=1, concurrency=4, buffer_max=4, ack_wait_s=1.0)
    async with (
        site_of("127.0.0.2", 12, robots="User-agent: *\nCrawl-delay: 0.5\n") as slow,
        site_of("127.0.0.3", 15) as fast1,
        site_of("127.0.0.4", 15) as fast2,
        site_of("127.0.0.5", 15) as fast3,
        crawling(settings) as worker,
    ):
        await seed(js, [slow.url("/")])
        await eventually(lambda: _has_result(js, slow.url("/")))  # its links are queued first
        await seed(js, [fast1.url("/"), fast2.url("/"), fast3.url("/")])
        await drained(js, shards=1)
        deferred = worker.stats.deferred
    crawled = await results(js)
    assert len(crawled) == 13 + 3 * 16
    slow_pages = sorted(t for t, path in slow.log if path.startswith("/p"))
    fast_done = max(t for site in (fast1, fast2, fast3) for t, _ in site.log)
    assert fast_done < slow_pages[2], "the fast hosts were done before the slow one's 3rd page"
    assert min(gaps(slow_pages)) >= 0.45, "and the slow host still got its Crawl-delay"
    assert deferred > 0, "the holding filled up and made room"
    assert {r.attempt for r in crawled.values()} == {1}, "hand-backs are not attempts"


async def test_the_waiting_room_follows_the_workers_pace(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    # No buffer_max: the worker holds its 4 fetches and AckWait/6 (2 s) of its pace, 16 to 256
    # tasks. A polite host (Crawl-delay 0.05 s, ~20 pages/s) gets a room of ~40, not its 80
    # pages; six fast hosts then a room far past the floor.
    settings = settings_for(nats_server, ack_wait_s=12.0, host_concurrency=4)
    polite = site_of("127.0.0.2", 80, robots="User-agent: *\nCrawl-delay: 0.05\n")
    fast = [site_of(f"127.0.0.{n + 3}", 60) for n in range(6)]
    async with contextlib.AsyncExitStack() as stack:
        for site in (polite, *fast):
            await stack.enter_async_context(site)
        worker = await stack.enter_async_context(crawling(settings))
        seen: list[tuple[int, int]] = []  # (held, room)

        async def watch() -> None:
            while True:
                seen.append((worker.held, worker.room))
                await asyncio.sleep(0.01)

        watching = asyncio.create_task(watch())
        await seed(js, [polite.url("/")])
        await drained(js)
        polite_seen, seen[:] = list(seen), []
        await seed(js, [site.url("/") for site in fast])
        await drained(js)
        watching.cancel()
    assert len(await results(js)) == 81 + 6 * 61
    assert max(held for held, _ in polite_seen) <= 4 + 60, "a few seconds of the polite pace"
    assert min(room for _, room in polite_seen) == 16, "the floor, before any pace"
    assert max(room for _, room in seen) >= 100, "the fast hosts' pace: a larger room"


async def test_a_worker_whose_holding_fills_still_drains_on_the_hosts_schedule(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    # One worker owns every shard and holds at most 4 + 40 tasks (AckWait 1 s). A slow host
    # (Crawl-delay 0.25 s) fills the holding with 40 waiting pages; then six fast hosts' pages
    # arrive in bursts. Each entry into the full holding makes room: the slow pages beyond the
    # horizon go back to JetStream, each due at its own turn. Issue 31: every entry of a burst
    # chose the same waiters again and pushed their turns a batch later each time, so they came
    # back minutes late. The slow host's schedule (its root, then 40 pages 0.25 s apart) is the
    # crawl's: it must drain within 1.5 times that.
    slow_pages, crawl_delay_s = 40, 0.25
    settings = settings_for(nats_server, concurrency=4, buffer_max=40, ack_wait_s=1.0)
    slow = site_of("127.0.0.2", slow_pages, robots=f"User-agent: *\nCrawl-delay: {crawl_delay_s}\n")
    fast = [site_of(f"127.0.0.{n + 3}", 15) for n in range(6)]
    async with contextlib.AsyncExitStack() as stack:
        for site in (slow, *fast):
            await stack.enter_async_context(site)
        worker = await stack.enter_async_context(crawling(settings))
        started = time.monotonic()
        await seed(js, [slow.url("/")])

        async def slow_pages_wait() -> bool:
            return worker.politeness.waiting >= slow_pages - 4

        await eventually(slow_pages_wait)
        await seed(js, [site.url("/") for site in fast])
        await drained(js, within_s=90)
        took_s = time.monotonic() - started
        deferred = worker.stats.deferred
    crawled = await results(js)
    assert len(crawled) == slow_pages + 1 + 6 * 16
    assert {r.attempt for r in crawled.values()} == {1}, "hand-backs are not attempts"
    assert deferred > 0, "the holding filled up and made room"
    slow_times = [t for t, path in slow.log if path != "/robots.txt"]
    assert min(gaps(slow_times)) >= crawl_delay_s * 0.95, "the slow host kept its Crawl-delay"
    schedule_s = slow_pages * crawl_delay_s
    assert took_s <= 1.5 * schedule_s, f"drained in {took_s:.1f} s; the schedule is {schedule_s} s"


async def test_hand_backs_still_due_show_in_the_metrics_and_in_status(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    # Crawl-delay 0.8 s, 6 pages, AckWait 1 s and room for 2 + 2 tasks: pages beyond the horizon
    # go back to JetStream. Their due times show in /metrics and in the worker's report that
    # `jetcrawl status` reads; when the crawl is done, none is due any more.
    settings = settings_for(
        nats_server, concurrency=2, buffer_max=2, ack_wait_s=1.0, report_interval_s=0.1
    )
    async with (
        site_of("127.0.0.2", 6, robots="User-agent: *\nCrawl-delay: 0.8\n") as slow,
        crawling(settings) as worker,
    ):
        metrics = WorkerMetrics("jetcrawl-worker", "0.1.0", "w1")
        metrics.bind(worker)
        await seed(js, [slow.url("/")])

        async def handed_back() -> bool:
            return worker.politeness.deferred > 0 and any(
                r.handbacks_due for r in await read_reports(js)
            )

        await eventually(handed_back)
        now = time.time()
        registry = metrics.registry
        due = registry.get_sample_value("jetcrawl_handbacks_due")
        furthest = registry.get_sample_value("jetcrawl_handback_furthest_due_timestamp_seconds")
        assert due is not None and due >= 1
        assert furthest is not None and now + 1.0 < furthest < now + 6 * 0.8 + 1
        assert registry.get_sample_value("jetcrawl_tasks_handed_back_total") >= due
        [report] = await read_reports(js)
        assert report.worker == "w1" and report.handbacks_due >= 1
        assert report.furthest_due_at is not None and report.furthest_due_at > now + 1.0
        line = _status_with(report).table()
        assert f"hand-backs    {report.handbacks_due} due, the last in" in line, line
        await drained(js, within_s=60)
        await worker.report_now()
        [after] = await read_reports(js)
    assert len(await results(js)) == 7
    assert after.handbacks_due == 0 and after.handed_back > 0
    assert "hand-backs    none due" in _status_with(after).table()


def _status_with(report: WorkerReport) -> Status:
    return Status(
        at=time.time(),
        cluster="default",
        workers=(),
        shards=(),
        frontier_pending=0,
        frontier_unacked=0,
        tasks_published=0,
        results=0,
        dead_letters=0,
        reports=(report,),
    )


async def test_a_revoked_shard_hands_its_waiting_tasks_back_at_the_drain_deadline(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    settings = settings_for(nats_server, shards=1, ack_wait_s=10.0, drain_deadline_s=0.5)
    async with (
        site_of("127.0.0.2", 3, robots="User-agent: *\nCrawl-delay: 5\n") as slow,
        crawling(settings) as worker,
    ):
        await seed(js, [slow.url("/")])

        async def waiting() -> bool:
            return worker.politeness.waiting == 3

        await eventually(waiting)
        await worker.on_revoke(0)  # they would wait 5 s and more: cancelled at 0.5 s
        next_owner = await js.pull_subscribe_bind(
            lane_consumer(0, DEFAULT_PRIORITY, DEFAULT_JOB), stream=TASKS_STREAM
        )
        taken = await next_owner.fetch(3, timeout=3)  # at once, not after AckWait (10 s)
        assert sorted(Task.from_wire(m.data).url for m in taken) == [
            slow.url(f"/p{n}") for n in range(3)
        ]
        assert {m.metadata.num_delivered for m in taken} == {2}
        assert slow.paths() == ["/"]


async def _has_result(js: JetStreamContext, url: str) -> bool:
    return any(r == url for r in await results(js))


# --- retries


async def test_a_flaky_page_is_retried_until_it_answers(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    async with site_of("127.0.0.2", 2) as site, crawling(settings_for(nats_server)):
        site.add("/p0", status=503, times=2)
        site.add("/p1", status=404)  # not worth a retry: recorded once
        await seed(js, [site.url("/")])
        await drained(js)
    crawled = await results(js)
    flaky, missing = crawled[site.url("/p0")], crawled[site.url("/p1")]
    assert (flaky.outcome, flaky.status, flaky.attempt) == ("fetched", 200, 3)
    assert site.hits["/p0"] == 3
    assert (missing.outcome, missing.status, missing.attempt) == ("fetched", 404, 1)
    assert site.hits["/p1"] == 1
    assert await dead_letters(js) == []


async def test_when_retries_run_out_the_failure_is_the_result_and_a_dead_letter(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    settings = settings_for(nats_server, task_max_deliver=3)
    async with site_of("127.0.0.2", 1) as site, crawling(settings):
        site.add("/p0", status=500)
        await seed(js, [site.url("/")])
        await drained(js)
    failed = (await results(js))[site.url("/p0")]
    assert (failed.outcome, failed.status, failed.attempt) == ("failed", 500, 3)
    assert failed.error is not None and failed.error.kind == "http_status"
    assert site.hits["/p0"] == 3
    [letter] = await dead_letters(js)
    assert (letter.stage, letter.reason) == ("fetch", "retries_exhausted")
    assert Task.from_wire(letter.original).url == site.url("/p0"), "the task, for a replay"


# --- storing the records


async def test_a_result_jetstream_could_not_store_is_published_again_in_place(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    """The results stream is gone for a moment: the page is fetched once and its result stored
    once; the task is not handed back, so it costs no attempt and no second request."""
    settings = settings_for(nats_server)
    async with site_of("127.0.0.2", 0) as site, crawling(settings) as worker:
        await js.delete_stream(RESULTS_STREAM)  # a result publish now gets no answer at all
        await seed(js, [site.url("/")])

        async def failed_once() -> bool:
            return worker.stats.publish_retries > 0

        await eventually(failed_once)
        await ensure(js, settings)  # back before the next try (PUBLISH_RETRY_DELAY_S later)
        await drained(js)
        assert worker.stats.retried == 0
    [result] = (await results(js)).values()
    assert (result.url, result.attempt) == (site.url("/"), 1)
    assert site.hits["/"] == 1
    assert await redelivered(js) == 0


async def test_a_result_that_still_cannot_be_stored_is_held_past_ack_wait_until_it_is(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    """No answer for longer than ``PUBLISH_TRIES`` and AckWait: the result is held (the task kept
    in progress) and stored once JetStream answers; the page is fetched once, the task not
    handed back."""
    settings = settings_for(nats_server)
    async with site_of("127.0.0.2", 0) as site, crawling(settings) as worker:
        await js.delete_stream(RESULTS_STREAM)
        await seed(js, [site.url("/")])

        async def holding() -> bool:
            return worker.stats.results_held > 0

        await eventually(holding)
        assert worker.stats.publish_retries >= PUBLISH_TRIES - 1
        await asyncio.sleep(settings.ack_wait_s)  # the outage goes on past AckWait
        await ensure(js, settings)
        await drained(js)
        assert worker.stats.retried == 0
    [result] = (await results(js)).values()
    assert result.attempt == 1
    assert site.hits["/"] == 1
    assert await redelivered(js) == 0


async def test_past_its_lease_deadline_a_worker_hands_a_task_back_instead_of_fetching(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    """The registry's ``holds_lease`` is asked at the host's turn: no fetch past the deadline
    (a worker paused past it starts none before its fence loop runs)."""
    asked: list[bool] = []

    def holds_lease() -> bool:  # past the deadline once, then renewed
        asked.append(len(asked) > 0)
        return asked[-1]

    async with site_of("127.0.0.2", 0) as site, crawling(settings_for(nats_server)) as worker:
        worker.fence_on(holds_lease)
        await seed(js, [site.url("/")])
        await drained(js)
    [result] = (await results(js)).values()
    assert asked[:2] == [False, True]
    assert site.hits["/"] == 1, "not fetched past the deadline"
    assert result.attempt == 2, "handed back at once: the next delivery fetched it"


def test_a_refused_publish_is_not_held_an_unanswered_one_is() -> None:
    refused = PublishFailed("crawl.results.0", BadRequestError(code=400, description="too big"))
    unanswered = PublishFailed("crawl.results.0", NoRespondersError())
    busy = PublishFailed("crawl.results.0", ServiceUnavailableError(code=503))
    assert (unreachable(refused), unreachable(unanswered), unreachable(busy)) == (
        False,
        True,
        True,
    )


# --- redirects and the SSRF guard inside a crawl


async def test_a_cross_host_redirect_goes_back_through_the_frontier(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    async with (
        BadSite(host="127.0.0.2") as here,
        BadSite(host="127.0.0.3") as there,
        crawling(settings_for(nats_server)) as worker,
    ):
        there.add("/robots.txt", "User-agent: *\nCrawl-delay: 0.1\n", content_type="text/plain")
        there.add("/landing", page(title="landing"))
        here.add("/", page("/moved", "/loop-a"))
        here.redirect("/moved", there.url("/landing"))
        here.redirect("/loop-a", "/loop-b")
        here.redirect("/loop-b", "/loop-a")
        await seed(js, [here.url("/")])
        await drained(js)
        assert worker.stats.failed == 0
    crawled = await results(js)
    moved, landing = crawled[here.url("/moved")], crawled[there.url("/landing")]
    assert (moved.status, moved.redirect_to) == (301, there.url("/landing"))
    assert (landing.status, landing.title, landing.parent) == (200, "landing", here.url("/moved"))
    assert landing.depth == moved.depth, "a redirect hop is not a link"
    assert there.hits["/robots.txt"] == 1, "the target host's own robots and politeness apply"
    # A loop ends at the seen set: each hop is one record, fetched once.
    assert crawled[here.url("/loop-a")].redirect_to == here.url("/loop-b")
    assert crawled[here.url("/loop-b")].redirect_to == here.url("/loop-a")
    assert (here.hits["/loop-a"], here.hits["/loop-b"]) == (1, 1)


async def test_a_link_to_a_refused_address_is_a_blocked_result_without_retries(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    settings = settings_for(nats_server, allow_nets=("127.0.0.2/32",))
    async with (
        BadSite(host="127.0.0.2") as public,
        BadSite(host="127.0.0.3") as internal,
        crawling(settings),
    ):
        internal.add("/admin", page(title="secret"))
        public.add("/", page(internal.url("/admin")))
        await seed(js, [public.url("/")])
        await drained(js)
    refused = (await results(js))[internal.url("/admin")]
    assert (refused.outcome, refused.attempt) == ("failed", 1)
    assert refused.error is not None and refused.error.kind == "blocked"
    assert internal.log == [], "not even its robots.txt was asked for"
    assert await dead_letters(js) == [], "recorded once, not dead-lettered"
