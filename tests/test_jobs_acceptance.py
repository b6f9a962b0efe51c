"""Issue 25's acceptance: a crawl of the shop with its job spec yields exactly the golden items,
on the items stream, in PostgreSQL and in Parquet.

The spec (tests/support/shop/job.yaml) goes in with ``jetcrawl job put``; a dispatcher and a
worker (in this process, owning every shard) crawl the shop from its home page under it; the
example plugin package is installed in the venv as a user installs it. The items read back from
``CRAWL_ITEMS`` are the golden file's, no more, no fewer, and the pages the spec does not follow
were never requested; then ``jetcrawl sink postgres`` and ``jetcrawl sink files --format
parquet`` (real processes, a real PostgreSQL) store the same items, once each.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import pyarrow.parquet as pq
from nats.js import JetStreamContext

from jetcrawl.contract.items import Item
from jetcrawl.contract.messages import Result
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import DEAD_STREAM, ITEMS_STREAM, RESULTS_STREAM, SEEDS
from jetcrawl.local.embedded import NatsServer
from jetcrawl.plumbing.topology import ensure
from jetcrawl.sinks.service import consumer_name
from tests.support.postgres import PostgresServer
from tests.support.shop import JOB_SPEC, ShopSite, golden_lines, placed
from tests.support.sinks import SinkProcess, wait_settled
from tests.support.streams import stored
from tests.test_good_citizen import crawling, drained

SHARDS = 4


async def test_a_crawl_of_the_shop_with_its_job_spec_yields_exactly_the_golden_items(
    nats_server: NatsServer,
    js: JetStreamContext,
    example_plugin: None,
    postgres: PostgresServer,
    tmp_path: Path,
) -> None:
    settings = Settings(
        nats_url=nats_server.url, shards=SHARDS, host_delay_s=0.0, allow_nets=("127.0.0.0/8",)
    )
    await ensure(js, settings)
    put = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "jetcrawl", "job", "put", str(JOB_SPEC)),
        *("--nats", nats_server.url),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await put.communicate()
    assert (put.returncode, out) == (0, b"job shop: version 1 stored\n")

    async with ShopSite() as shop, crawling(settings):
        await js.publish(SEEDS, orjson.dumps({"url": shop.seed, "job": "shop"}))
        await drained(js, SHARDS, within_s=60)
        requested = list(shop.requests)
        base_url = shop.base_url

    items = []
    for m in await stored(js, ITEMS_STREAM):
        item = Item.from_wire(m.data)
        assert m.headers["Nats-Msg-Id"] == item.msg_id and m.subject == "crawl.items.shop"
        assert (item.job, item.spec_version) == ("shop", 1)
        items.append(item)
    lines = [{"url": i.url, "source": i.source, "key": i.key, "data": i.data} for i in items]
    assert placed(lines, base_url) == golden_lines()

    results = [Result.from_wire(m.data) for m in await stored(js, RESULTS_STREAM)]
    assert {(r.job, r.spec_version, r.outcome) for r in results} == {("shop", 1, "fetched")}
    assert len({r.url for r in results}) == len(results), "each page crawled once"
    assert not [p for p in requested if p.startswith(("/cart", "/account/", "/search"))]
    assert not [p for p in requested if "sort=" in p]
    assert (await js.stream_info(DEAD_STREAM)).state.messages == 0, "no page failed its job"

    # The same items through the sinks: PostgreSQL, and Parquet files.
    parquet_dir = tmp_path / "parquet"
    nats_flag = ("--nats", nats_server.url)
    sinks = [
        SinkProcess(
            ["postgres", "--job", "shop", *nats_flag],
            {"JETCRAWL_SINK_DSN": postgres.dsn()},
            tmp_path / "sink-postgres.log",
        ),
        SinkProcess(
            [
                "files",
                "--dir",
                str(parquet_dir),
                "--format",
                "parquet",
                "--job",
                "shop",
                *nats_flag,
            ],
            {"JETCRAWL_SINK_FILE_MAX_AGE_S": "1"},  # a file is closed, and acked, soon
            tmp_path / "sink-files.log",
        ),
    ]
    for sink in sinks:
        await sink.start()
    try:
        for name in ("postgres", "files"):
            await wait_settled(js, ITEMS_STREAM, consumer_name(name, "shop"), within_s=60)
    finally:
        for sink in sinks:
            assert await sink.stop() == 0, sink.output()

    conn = await asyncpg.connect(postgres.dsn())
    try:
        rows = await conn.fetch(
            "SELECT url, source, key, data, spec_version FROM jetcrawl.items WHERE job = 'shop'"
        )
    finally:
        await conn.close()
    assert {row["spec_version"] for row in rows} == {1}
    assert placed([_line(dict(row)) for row in rows], base_url) == golden_lines()

    tables = [pq.read_table(path) for path in sorted(parquet_dir.glob("items-shop-*.parquet"))]
    parquet_rows = [row for table in tables for row in table.to_pylist()]
    assert placed([_line(row) for row in parquet_rows], base_url) == golden_lines()


def _line(row: dict[str, Any]) -> dict[str, Any]:
    """A stored item as a golden line: its data is JSON text in both stores."""
    data = row["data"]
    return {
        "url": row["url"],
        "source": row["source"],
        "key": row["key"],
        "data": orjson.loads(data) if isinstance(data, str | bytes) else data,
    }
