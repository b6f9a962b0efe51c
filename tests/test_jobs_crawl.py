"""Job specs applied in a crawl: link rules at admission, plugins on pages, items before the ack.

A dispatcher and a worker run in this process against a real nats-server and a local site; the
plugins are a real distribution with entry points (tests/support/plugins.py). A plugin that
raises or returns bad data costs its page's items only: a dead letter with the exception and
the page's fingerprint, the page recorded, the task acked, the worker on. A spec put mid-crawl
applies to the URLs admitted and the tasks fetched after the services have seen it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
from nats.js import JetStreamContext

from jetcrawl.contract.deadletters import DeadLetter
from jetcrawl.contract.errors import SpecError
from jetcrawl.contract.items import Item
from jetcrawl.contract.jobs import JobSpec
from jetcrawl.contract.messages import Result, seen_key
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import DEAD_STREAM, ITEMS_STREAM, RESULTS_STREAM, SEEDS
from jetcrawl.contract.urls import fingerprint
from jetcrawl.dispatcher import Dispatcher
from jetcrawl.local.embedded import NatsServer
from jetcrawl.plumbing.metrics import DispatcherMetrics, WorkerMetrics
from jetcrawl.plumbing.specs import SpecStore
from jetcrawl.plumbing.topology import ensure
from jetcrawl.worker import Worker
from tests.support import plugins
from tests.support.badsite import BadSite
from tests.support.streams import eventually, stored
from tests.test_good_citizen import drained

SHARDS = 4


@pytest.fixture
def installed_plugins(tmp_path: Path) -> Iterator[None]:
    where = tmp_path / "plugins"
    where.mkdir()
    plugins.install(where)
    try:
        yield
    finally:
        plugins.uninstall(where)


@pytest.fixture
async def shop() -> AsyncIterator[BadSite]:
    site = BadSite(host="127.0.0.7")

    def page(*links: str) -> str:
        return "<title>t</title>" + "".join(f"<a href='{link}'>x</a>" for link in links)

    site.add("/", page("/products/1", "/products/2", "/about", "/boom", "/bad", "/manual.pdf"))
    for path in ("/products/1", "/products/2", "/boom", "/bad", "/hidden", "/about", "/elsewhere"):
        site.add(path, page())
    site.add("/more", page("/about"))
    site.add("/manual.pdf", b"%PDF-1.4", content_type="application/pdf")
    async with site:
        yield site


SPEC: dict[str, Any] = {
    "name": "shop",
    "links": {"allow": ["/products/", "/boom$", "/bad$", "/hidden$", "/manual"]},
    "extensions": {"deny": ["pdf"]},
    "plugins": ["items", "raises", "bad"],
}


@asynccontextmanager
async def crawling(settings: Settings) -> AsyncIterator[tuple[Dispatcher, Worker]]:
    async with (
        Dispatcher(settings) as dispatcher,
        Worker(settings, "w1") as worker,
        asyncio.TaskGroup() as tg,
    ):
        tg.create_task(dispatcher.run())
        tg.create_task(worker.run())
        await worker.wait_running()
        for shard in range(settings.shards):
            await worker.on_acquired(shard, fence=1)
        try:
            yield dispatcher, worker
        finally:
            worker.stop()
            dispatcher.stop()


async def results(js: JetStreamContext) -> dict[str, Result]:
    out = {}
    for m in await stored(js, RESULTS_STREAM):
        result = Result.from_wire(m.data)
        assert result.url not in out, f"two results for {result.url}"
        out[result.url] = result
    return out


async def items(js: JetStreamContext) -> list[Item]:
    out = []
    for m in await stored(js, ITEMS_STREAM):
        item = Item.from_wire(m.data)
        assert m.headers["Nats-Msg-Id"] == item.msg_id
        assert m.subject == f"crawl.items.{item.job}"
        out.append(item)
    return out


async def extract_letters(js: JetStreamContext) -> dict[str, DeadLetter]:
    letters = [DeadLetter.from_wire(m.data) for m in await stored(js, DEAD_STREAM)]
    out = {}
    for letter in letters:
        assert letter.stage == "extract", letter
        out[orjson.loads(letter.original)["url"] + " " + letter.reason] = letter
    return out


async def test_a_spec_steers_the_crawl_and_its_plugins_make_items_or_dead_letters(
    nats_server: NatsServer, js: JetStreamContext, shop: BadSite, installed_plugins: None
) -> None:
    settings = Settings(
        nats_url=nats_server.url,
        shards=SHARDS,
        host_delay_s=0.0,
        allow_nets=("127.0.0.0/8",),
        links_linger_s=0.0,
    )
    await ensure(js, settings)
    specs = SpecStore(await js.key_value("crawl_specs"))
    assert (await specs.put(JobSpec.read(SPEC))).stored.version == 1

    async with crawling(settings) as (dispatcher, worker):
        await js.publish(SEEDS, orjson.dumps({"url": shop.url("/"), "job": "shop"}))
        await drained(js, SHARDS)
        crawled = await results(js)
        shop_pages = {shop.url(p) for p in ("/", "/products/1", "/products/2", "/boom", "/bad")}
        shop_pages.add(shop.url("/hidden"))  # only the items plugin links to it
        assert {u for u, r in crawled.items() if r.job == "shop"} == shop_pages
        assert {r.spec_version for r in crawled.values() if r.job == "shop"} == {1}
        # a plugin's link of another job is crawled under that job (no spec: no items)
        assert crawled[shop.url("/elsewhere")].job == "other"
        assert crawled[shop.url("/elsewhere")].spec_version == 0
        # the link rules refused /about at admission; the worker never sent /manual.pdf, which
        # the spec's extension filter refuses: neither was fetched
        assert dispatcher.stats.not_followed == 1 and worker.stats.links_skipped == 1
        assert shop.hits["/about"] == 0 and shop.hits["/manual.pdf"] == 0

        got = await items(js)
        assert sorted(i.key for i in got) == sorted(p.removeprefix(shop.origin) for p in shop_pages)
        assert {(i.job, i.source, i.spec_version) for i in got} == {("shop", "items", 1)}
        for item in got:
            assert item.fp == fingerprint(item.url)
            assert item.crawl_id == seen_key("shop", item.url, item.fp)
            assert item.data == {"path": item.key, "spec_version": 1}

        letters = await extract_letters(js)
        assert set(letters) == {
            f"{shop.url('/boom')} plugin_raised",
            f"{shop.url('/bad')} bad_output",
        }
        boom = letters[f"{shop.url('/boom')} plugin_raised"]
        assert "raises on" in boom.detail and "ValueError: boom on purpose" in boom.detail
        assert fingerprint(shop.url("/boom")) in boom.detail
        assert "returned dict, not an Output" in letters[f"{shop.url('/bad')} bad_output"].detail
        # the pages were still recorded and their tasks acked: the crawl drained
        assert crawled[shop.url("/boom")].outcome == "fetched"
        assert worker.stats.extract_failures == 2 and worker.stats.items == len(shop_pages)
        worker_metrics = WorkerMetrics("jetcrawl-worker", "0", "w1")
        worker_metrics.bind(worker)
        dispatcher_metrics = DispatcherMetrics("jetcrawl-dispatcher", "0", "d1")
        dispatcher_metrics.bind(dispatcher)
        sample = worker_metrics.registry.get_sample_value
        assert sample("jetcrawl_items_total") == len(shop_pages)
        assert sample("jetcrawl_extract_failures_total") == 2
        rejected = dispatcher_metrics.registry.get_sample_value(
            "jetcrawl_urls_rejected_total", {"reason": "not_followed"}
        )
        assert rejected == 1
        assert sample("jetcrawl_links_skipped_total") == 1

        # Version 2, mid-crawl: /about and /more followed, the items plugin and one built for
        # another plugin API (refused at load: a dead letter per page, the items still made).
        v2 = SPEC | {
            "links": {"allow": [*SPEC["links"]["allow"], "/about$", "/more$"]},
            "plugins": ["items", "future"],
        }
        assert (await specs.put(JobSpec.read(v2))).stored.version == 2
        async with asyncio.timeout(10):
            await dispatcher.specs.wait_version("shop", 2)  # type: ignore[union-attr]
            await worker.specs.wait_version("shop", 2)  # type: ignore[union-attr]
        await js.publish(SEEDS, orjson.dumps({"url": shop.url("/more"), "job": "shop"}))
        await drained(js, SHARDS)

    crawled = await results(js)
    assert crawled[shop.url("/more")].spec_version == 2
    assert crawled[shop.url("/about")].spec_version == 2
    assert crawled[shop.url("/products/1")].spec_version == 1, "crawled before: not again"
    later = [i for i in await items(js) if i.spec_version == 2]
    assert sorted(i.key for i in later) == ["/about", "/more"]
    letters = await extract_letters(js)
    for path in ("/more", "/about"):
        letter = letters[f"{shop.url(path)} plugin_unavailable"]
        assert "plugin 'future' refused" in letter.detail
        assert "is built for plugin API 2.x" in letter.detail
    assert len(letters) == 4


async def test_an_archiving_job_fetches_what_the_default_skips_and_reads_the_types_it_names(
    nats_server: NatsServer, js: JetStreamContext, shop: BadSite
) -> None:
    """The default crawl (no spec) skips /manual.pdf by its extension; a job that switches the
    default list off fetches it, and downloads its body only when its content_types name it."""
    settings = Settings(
        nats_url=nats_server.url,
        shards=SHARDS,
        host_delay_s=0.0,
        allow_nets=("127.0.0.0/8",),
        links_linger_s=0.0,
    )
    await ensure(js, settings)
    specs = SpecStore(await js.key_value("crawl_specs"))
    archive = {"name": "archive", "extensions": {"default": False}, "content_types": ["*/*"]}
    await specs.put(JobSpec.read(archive))
    await specs.put(JobSpec.read({"name": "pages", "extensions": {"default": False}}))
    pdf = shop.url("/manual.pdf")

    async with crawling(settings) as (dispatcher, worker):
        for job in ("default", "archive", "pages"):
            await js.publish(SEEDS, orjson.dumps({"url": shop.url("/"), "job": job}))
        await drained(js, SHARDS)
    by_job: dict[str, dict[str, Result]] = {}
    for m in await stored(js, RESULTS_STREAM):
        result = Result.from_wire(m.data)
        by_job.setdefault(result.job, {})[result.url] = result

    assert pdf not in by_job["default"], "the default skips it: the worker never sent it"
    assert worker.stats.links_skipped == 1 and dispatcher.stats.not_followed == 0
    assert set(by_job["default"]) | {pdf} == set(by_job["archive"]) == set(by_job["pages"])
    assert shop.hits["/manual.pdf"] == 2

    archived = by_job["archive"][pdf]
    assert (archived.outcome, archived.status, archived.content_type, archived.length) == (
        "fetched",
        200,
        "application/pdf",
        len(b"%PDF-1.4"),
    )
    assert archived.payload_digest is not None and archived.error is None

    skipped = by_job["pages"][pdf]
    assert (skipped.outcome, skipped.status, skipped.length, skipped.payload_digest) == (
        "skipped",
        200,
        0,
        None,
    )
    assert skipped.error is not None and skipped.error.kind == "unwanted_type"
    assert skipped.error.message == (
        "application/pdf is not a type job pages reads (text/html, application/xhtml+xml): "
        "body not downloaded"
    )
    metrics = WorkerMetrics("jetcrawl-worker", "0", "w1")
    metrics.bind(worker)
    assert metrics.registry.get_sample_value("jetcrawl_bodies_skipped_total") == 1
    assert metrics.registry.get_sample_value("jetcrawl_links_skipped_total") == 1


async def test_a_spec_that_recrawls_admits_its_urls_again_and_another_job_does_not(
    nats_server: NatsServer, js: JetStreamContext, shop: BadSite
) -> None:
    settings = Settings(
        nats_url=nats_server.url, shards=SHARDS, host_delay_s=0.0, allow_nets=("127.0.0.0/8",)
    )
    await ensure(js, settings)
    specs = SpecStore(await js.key_value("crawl_specs"))
    await specs.put(JobSpec.read({"name": "again", "recrawl_after_s": 1, "max_depth": 0}))
    await specs.put(JobSpec.read({"name": "once", "max_depth": 0}))
    url = shop.url("/products/1")

    async def crawls(job: str) -> list[Result]:
        return [
            r
            for r in (Result.from_wire(m.data) for m in await stored(js, RESULTS_STREAM))
            if r.job == job
        ]

    async with crawling(settings):

        async def seeded_twice() -> bool:
            for job in ("again", "once"):
                await js.publish(SEEDS, orjson.dumps({"url": url, "job": job}))
            return len(await crawls("again")) >= 2

        await eventually(seeded_twice, within_s=20)  # the mark of "again" lives 1 s
        await drained(js, SHARDS)
    again, once = await crawls("again"), await crawls("once")
    assert len(again) == 2 and len(once) == 1, "a job without re-crawl crawls a URL once"
    assert shop.hits["/products/1"] == 3


async def test_a_seed_carries_its_spec_inline_and_a_bad_one_is_a_dead_letter_with_its_path(
    nats_server: NatsServer, js: JetStreamContext, shop: BadSite
) -> None:
    settings = Settings(
        nats_url=nats_server.url, shards=SHARDS, host_delay_s=0.0, allow_nets=("127.0.0.0/8",)
    )
    await ensure(js, settings)
    seeds = [
        {"url": shop.url("/"), "spec": {"name": "inline", "links": {"allow": ["/products/"]}}},
        {"url": shop.url("/about"), "spec": {"name": "broken", "links": {"allow": ["("]}}},
        {"url": shop.url("/more"), "job": "other", "spec": {"name": "inline"}},
    ]
    async with crawling(settings):
        await js.publish(SEEDS, orjson.dumps(seeds))
        await drained(js, SHARDS)
    crawled = await results(js)
    assert set(crawled) == {shop.url(p) for p in ("/", "/products/1", "/products/2")}
    assert {(r.job, r.spec_version) for r in crawled.values()} == {("inline", 1)}
    stored_spec = await SpecStore(await js.key_value("crawl_specs")).get("inline")
    assert stored_spec.version == 1 and stored_spec.spec.doc == seeds[0]["spec"]

    letters = [DeadLetter.from_wire(m.data) for m in await stored(js, DEAD_STREAM)]
    assert sorted((d.stage, d.reason, d.detail.split(":")[0]) for d in letters) == [
        ("seeds", "bad_spec", "job"),
        ("seeds", "bad_spec", "spec.links.allow[0]"),
    ]


async def test_a_worker_refuses_an_unusable_plugin_when_it_starts(
    nats_server: NatsServer,
    js: JetStreamContext,
    installed_plugins: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = Settings(nats_url=nats_server.url, shards=SHARDS)
    await ensure(js, settings)
    specs = SpecStore(await js.key_value("crawl_specs"))
    await specs.put(JobSpec.read({"name": "shop", "plugins": ["items", "future"]}))
    await specs.put(JobSpec.read({"name": "fine", "plugins": ["items"]}))
    async with Worker(settings, "w1") as worker, asyncio.TaskGroup() as tg:
        assert "refused" not in caplog.text
        tg.create_task(worker.run())
        await worker.wait_running()  # before any task
        worker.stop()
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1 and "job shop version 1: plugin 'future' refused" in refusals[0]
    assert "plugin API 2.x" in refusals[0]


async def test_a_specs_fetch_section_is_the_policy_its_pages_are_fetched_under(
    nats_server: NatsServer, js: JetStreamContext, shop: BadSite
) -> None:
    # robots.txt speaks to the User-Agent token actually sent: the job's own, from its spec.
    shop.add(
        "/robots.txt", b"User-agent: shopbot\nDisallow: /products/2\n", content_type="text/plain"
    )
    settings = Settings(
        nats_url=nats_server.url, shards=SHARDS, host_delay_s=0.0, allow_nets=("127.0.0.0/8",)
    )
    await ensure(js, settings)
    specs = SpecStore(await js.key_value("crawl_specs"))
    own = {
        "name": "own",
        "max_depth": 0,
        "fetch": {"user_agent": "shopbot/1.0 (+https://x.example)"},
    }
    await specs.put(JobSpec.read(own))
    await specs.put(JobSpec.read({"name": "plain", "max_depth": 0}))
    url = shop.url("/products/2")

    async with crawling(settings):
        for job in ("own", "plain"):
            await js.publish(SEEDS, orjson.dumps({"url": url, "job": job}))
        await drained(js, SHARDS)
    by_job = {
        r.job: r for r in (Result.from_wire(m.data) for m in await stored(js, RESULTS_STREAM))
    }
    assert by_job["own"].outcome == "robots_disallowed"
    assert by_job["plain"].outcome == "fetched" and by_job["plain"].status == 200
    assert shop.hits["/products/2"] == 1, "only the job without a fetch section fetched it"


def test_a_bad_fetch_section_is_refused_at_its_path() -> None:
    with pytest.raises(SpecError) as refused:
        JobSpec.read({"name": "x", "fetch": {"render": "sometimes"}})
    assert refused.value.path == "fetch.render"
