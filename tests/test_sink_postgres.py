"""The PostgreSQL sink against a real nats-server and a real PostgreSQL: upserts, schema,
bad records, secrets, and an outage of the database while items keep coming."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import orjson
import pytest
from nats.js import JetStreamContext

from jetcrawl.contract.messages import Result
from jetcrawl.contract.settings import Secret, Settings
from jetcrawl.contract.topology import (
    DEAD_STREAM,
    ITEMS_STREAM,
    RESULTS_STREAM,
    item_subject,
    result_subject,
)
from jetcrawl.local.embedded import NatsServer
from jetcrawl.sinks.api import ITEMS, RESULTS
from jetcrawl.sinks.errors import SinkError
from jetcrawl.sinks.pgschema import MIGRATIONS, SCHEMA
from jetcrawl.sinks.postgres import PostgresSink, masked
from jetcrawl.sinks.service import SinkService, consumer_name
from tests.support.postgres import PASSWORD, PostgresServer
from tests.support.sinks import fast_settings, items_stream, make_item, publish_items, wait_settled
from tests.support.streams import eventually, stored

BOTH = frozenset({ITEMS, RESULTS})


@asynccontextmanager
async def running_sink(
    settings: Settings, dsn: str, job: str | None = "shop", kinds: frozenset[str] = BOTH
) -> AsyncIterator[SinkService]:
    service = SinkService(
        settings,
        PostgresSink(Secret(dsn), settings.sink_db_timeout_s),
        kinds,
        consumer_name("postgres", job),
        job,
    )
    task = asyncio.create_task(service.run())
    try:
        yield service
    finally:
        service.stop()
        await asyncio.wait_for(task, 30)


async def rows(dsn: str, query: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(dsn)
    try:
        return list(await conn.fetch(query))
    finally:
        await conn.close()


def result(n: int, job: str = "shop", *, fetched_at: float = 1_800_000_000.0) -> Result:
    return Result(
        url=f"http://shop.test/p/{n}",
        fp=f"{n:032x}",
        job=job,
        depth=1,
        parent=None,
        outcome="fetched",
        status=200,
        final_url=None,
        redirects=(),
        content_type="text/html",
        length=100,
        title=f"page {n}",
        outlinks=3,
        fetched_at=fetched_at,
        elapsed_ms=5.0,
        shard=0,
        fence=1,
        worker="w1",
    )


async def test_items_and_results_are_upserted_once_and_a_recrawl_replaces(
    nats_server: NatsServer, js: JetStreamContext, postgres: PostgresServer
) -> None:
    settings = fast_settings(nats_server.url)
    await items_stream(js)
    first = [make_item(n) for n in range(30)]
    await publish_items(js, first)
    await publish_items(js, first[:10], msg_ids=False)  # published again: a redelivery's copy
    recrawl = [make_item(n, crawl=2) for n in range(3)]  # page 0 crawled again
    stale = [make_item(n, crawl=0) for n in range(3, 6)]  # an older crawl of page 1, late
    await publish_items(js, [*recrawl, *stale])
    await publish_items(js, [make_item(n, job="other") for n in range(5)])
    for n in range(4):
        await js.publish(result_subject(n % 4), result(n).to_wire())
    await js.publish(result_subject(0), result(9, job="other").to_wire())

    async with running_sink(settings, postgres.dsn()):
        await wait_settled(js, ITEMS_STREAM, consumer_name("postgres", "shop"))
        await wait_settled(js, RESULTS_STREAM, consumer_name("postgres", "shop"))

    items = await rows(postgres.dsn(), f"SELECT * FROM {SCHEMA}.items ORDER BY key")
    assert len(items) == 30, "one row per (job, fp, key): no doubles, no other job"
    by_key = {r["key"]: r for r in items}
    assert {r["job"] for r in items} == {"shop"}
    for n in range(3):
        assert orjson.loads(by_key[f"product-{n}"]["data"])["crawl"] == 2, "a re-crawl replaces"
    for n in range(3, 6):
        assert orjson.loads(by_key[f"product-{n}"]["data"])["crawl"] == 1, "an older one does not"
    first_seq = {r["key"]: r["stream_seq"] for r in items}
    assert all(first_seq[f"product-{n}"] == n + 1 for n in range(3, 10)), "copies changed nothing"
    results = await rows(postgres.dsn(), f"SELECT job, fp, title FROM {SCHEMA}.results")
    assert sorted(r["title"] for r in results) == [f"page {n}" for n in range(4)]


async def test_the_schema_is_made_once_and_a_newer_one_is_refused(
    postgres: PostgresServer,
) -> None:
    for _ in range(2):
        sink = PostgresSink(Secret(postgres.dsn()), 5.0)
        await sink.open()
        await sink.close()
    versions = await rows(postgres.dsn(), f"SELECT version FROM {SCHEMA}.schema_version")
    assert [r["version"] for r in versions] == list(range(1, len(MIGRATIONS) + 1))

    conn = await asyncpg.connect(postgres.dsn())
    await conn.execute(f"INSERT INTO {SCHEMA}.schema_version (version) VALUES (99)")
    await conn.close()
    sink = PostgresSink(Secret(postgres.dsn()), 5.0)
    with pytest.raises(SinkError, match=r"version 99.*upgrade jetcrawl"):
        await sink.open()
    await sink.close()


async def test_a_user_that_may_not_create_the_schema_is_told_in_one_line(
    postgres: PostgresServer,
) -> None:
    conn = await asyncpg.connect(postgres.dsn())
    await conn.execute("CREATE ROLE reader LOGIN PASSWORD 'reader-pw'")
    await conn.execute("REVOKE CREATE ON DATABASE postgres FROM PUBLIC")
    await conn.close()
    dsn = postgres.dsn(password="reader-pw").replace("jetcrawl:", "reader:")
    sink = PostgresSink(Secret(dsn), 5.0)
    with pytest.raises(SinkError, match=f"cannot create or migrate schema {SCHEMA}: permission"):
        await sink.open()
    await sink.close()


async def test_a_wrong_password_fails_naming_the_server_and_never_the_password(
    postgres: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = "not-the-password-xyz"
    sink = PostgresSink(Secret(postgres.dsn(password=wrong)), 5.0)
    assert wrong not in repr(sink) and wrong not in sink.describe()
    with pytest.raises(SinkError) as refused:
        await sink.open()
    assert postgres.address in str(refused.value)
    assert "password authentication failed" in str(refused.value)
    assert wrong not in str(refused.value)
    assert wrong not in caplog.text


def test_masked_hides_the_password_wherever_a_dsn_carries_it() -> None:
    assert masked("postgresql://u:p%40ss@db:5432/x") == "postgresql://u:***@db:5432/x"
    assert masked("postgres://u@db/x?password=abc&sslmode=off") == (
        "postgres://u@db/x?password=***&sslmode=off"
    )
    assert masked("postgresql://db/x") == "postgresql://db/x"
    assert repr(Settings(sink_dsn=Secret("postgresql://u:p@h/d"))).count("p@h") == 0


async def test_bad_records_become_dead_letters_and_the_rest_is_stored(
    nats_server: NatsServer, js: JetStreamContext, postgres: PostgresServer
) -> None:
    settings = fast_settings(nats_server.url)
    await items_stream(js)
    good = [make_item(n) for n in range(6)]
    nul = make_item(6, data={"name": "a\u0000b"})  # JSON PostgreSQL cannot store (jsonb)
    await publish_items(js, [*good[:3], nul, *good[3:]])
    await js.publish(item_subject("shop"), b'{"v": 1, "job": "shop"}')  # no key: undecodable

    async with running_sink(settings, postgres.dsn(), kinds=frozenset({ITEMS})) as service:
        await wait_settled(js, ITEMS_STREAM, consumer_name("postgres", "shop"))
    assert service.stats.dead == 2
    keys = await rows(postgres.dsn(), f"SELECT key FROM {SCHEMA}.items ORDER BY key")
    assert [r["key"] for r in keys] == sorted(i.key for i in good)
    letters = [m.json() for m in await stored(js, DEAD_STREAM)]
    assert sorted(str(letter["reason"]) for letter in letters) == ["missing_field", "rejected"]
    assert {letter["stage"] for letter in letters} == {"sink"}


@pytest.mark.parametrize("outage", ["stop", "kill"])
async def test_a_database_outage_pauses_the_sink_and_loses_nothing(
    nats_server: NatsServer,
    js: JetStreamContext,
    postgres: PostgresServer,
    caplog: pytest.LogCaptureFixture,
    outage: str,
) -> None:
    """A fast shutdown, or a crash (kill -9, then crash recovery), while items keep coming."""
    caplog.set_level(logging.INFO, logger="jetcrawl.sinks")
    settings = fast_settings(nats_server.url)
    consumer = consumer_name("postgres", "shop")
    await items_stream(js)
    async with running_sink(settings, postgres.dsn(), kinds=frozenset({ITEMS})) as service:
        await publish_items(js, [make_item(n) for n in range(100)])
        await wait_settled(js, ITEMS_STREAM, consumer)

        await (postgres.stop() if outage == "stop" else postgres.kill())
        await publish_items(js, [make_item(n) for n in range(100, 200)])

        async def paused() -> bool:
            return service.stats.pauses == 1

        await eventually(paused)
        floor = (await js.consumer_info(ITEMS_STREAM, consumer)).ack_floor.stream_seq
        await publish_items(js, [make_item(n) for n in range(200, 300)])
        # The negative case: while the database is down, nothing is acked.
        info = await js.consumer_info(ITEMS_STREAM, consumer)
        assert info.ack_floor.stream_seq == floor == 100
        assert (info.num_ack_pending or 0) > 0

        await postgres.start()
        await wait_settled(js, ITEMS_STREAM, consumer)
    count = await rows(postgres.dsn(), f"SELECT count(*) AS n FROM {SCHEMA}.items")
    assert count[0]["n"] == 300
    assert service.stats.pauses == 1
    assert caplog.text.count("paused, nothing acked") == 1, "said once, not per retry"
    assert caplog.text.count("resumed after") == 1
    assert PASSWORD not in caplog.text


async def test_a_database_down_at_start_is_waited_for(
    nats_server: NatsServer,
    js: JetStreamContext,
    postgres: PostgresServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = fast_settings(nats_server.url)
    await postgres.stop()
    await items_stream(js)
    await publish_items(js, [make_item(n) for n in range(20)])
    async with running_sink(settings, postgres.dsn(), kinds=frozenset({ITEMS})):

        async def said() -> bool:
            return "cannot start yet" in caplog.text

        await eventually(said)
        info = await js.consumer_info(ITEMS_STREAM, consumer_name("postgres", "shop"))
        assert (info.num_ack_pending or 0) == 0, "nothing is taken before the database is there"
        await postgres.start()
        await wait_settled(js, ITEMS_STREAM, consumer_name("postgres", "shop"))
    count = await rows(postgres.dsn(), f"SELECT count(*) AS n FROM {SCHEMA}.items")
    assert count[0]["n"] == 20
    assert caplog.text.count("cannot start yet") == 1


async def test_a_sink_stopped_while_paused_hands_its_records_back_at_once(
    nats_server: NatsServer, js: JetStreamContext, postgres: PostgresServer
) -> None:
    # AckWait is long here: the records come back because the sink naks them, not by expiry.
    settings = fast_settings(nats_server.url).replace(ack_wait_s=60.0)
    consumer = consumer_name("postgres", "shop")
    await items_stream(js)
    await postgres.stop()
    async with running_sink(settings, postgres.dsn(), kinds=frozenset({ITEMS})) as service:
        await postgres.start()
        await publish_items(js, [make_item(n) for n in range(10)])
        await wait_settled(js, ITEMS_STREAM, consumer)
        await postgres.stop()
        await publish_items(js, [make_item(n) for n in range(10, 20)])

        async def paused() -> bool:
            return service.stats.pauses == 1

        await eventually(paused)
        assert (await js.consumer_info(ITEMS_STREAM, consumer)).num_ack_pending
    await postgres.start()
    started = time.monotonic()
    async with running_sink(settings, postgres.dsn(), kinds=frozenset({ITEMS})):
        await wait_settled(js, ITEMS_STREAM, consumer, within_s=settings.ack_wait_s)
    assert time.monotonic() - started < settings.ack_wait_s / 3, "not by AckWait's expiry"
    count = await rows(postgres.dsn(), f"SELECT count(*) AS n FROM {SCHEMA}.items")
    assert count[0]["n"] == 20


async def test_a_consumer_name_taken_with_another_filter_is_refused(
    nats_server: NatsServer, js: JetStreamContext, postgres: PostgresServer
) -> None:
    settings = fast_settings(nats_server.url)
    async with running_sink(settings, postgres.dsn(), job=None, kinds=frozenset({ITEMS})):
        await eventually(lambda: _exists(js, consumer_name("postgres", None)))
    service = SinkService(
        settings,
        PostgresSink(Secret(postgres.dsn()), 5.0),
        frozenset({ITEMS}),
        consumer_name("postgres", "all"),  # a job named "all": the same name
        "all",
    )
    with pytest.raises(SinkError, match=r"exists with filter 'crawl.items.\*'.*--consumer"):
        await service.run()


async def _exists(js: JetStreamContext, consumer: str) -> bool:
    try:
        await js.consumer_info(ITEMS_STREAM, consumer)
    except Exception:
        return False
    return True
