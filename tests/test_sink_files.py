"""The file sink against a real nats-server: rolling files, acks only once a file is renamed,
Parquet, one sink per directory, and a leftover temporary file cleared at start."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import ITEMS_STREAM
from jetcrawl.local.embedded import NatsServer
from jetcrawl.sinks.api import ITEMS
from jetcrawl.sinks.errors import SinkError
from jetcrawl.sinks.files import FileSink
from jetcrawl.sinks.service import SinkService, consumer_name
from tests.support.sinks import fast_settings, items_stream, make_item, publish_items, wait_settled
from tests.support.streams import eventually

CONSUMER = consumer_name("files", "shop")


def file_sink(directory: Path, fmt: str = "jsonl", max_records: int = 10, max_age_s: float = 60):
    return FileSink(
        directory,
        fmt,
        "shop",
        max_records=max_records,
        max_bytes=1 << 30,
        max_age_s=max_age_s,
        max_pending=1000,
    )


@asynccontextmanager
async def running(settings: Settings, sink: FileSink) -> AsyncIterator[SinkService]:
    service = SinkService(settings, sink, frozenset({ITEMS}), CONSUMER, "shop")
    task = asyncio.create_task(service.run())
    try:
        yield service
    finally:
        service.stop()
        await asyncio.wait_for(task, 30)


def jsonl_seqs(directory: Path) -> list[list[int]]:
    return [
        [orjson.loads(line)["stream_seq"] for line in path.read_bytes().splitlines()]
        for path in sorted(directory.glob("items-shop-*.jsonl"))
    ]


async def test_files_roll_by_count_and_records_are_acked_only_once_their_file_is_written(
    nats_server: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    settings = fast_settings(nats_server.url)
    out = tmp_path / "out"
    await items_stream(js)
    await publish_items(js, [make_item(n) for n in range(25)])
    async with running(settings, file_sink(out)):

        async def two_files() -> bool:
            try:
                info = await js.consumer_info(ITEMS_STREAM, CONSUMER)
            except NotFoundError:
                return False  # not made yet
            return info.ack_floor.stream_seq == 20 and (info.num_ack_pending or 0) == 5

        await eventually(two_files)
        # The negative case: the five records of the file still open are not acked.
        assert jsonl_seqs(out) == [list(range(1, 11)), list(range(11, 21))]
        assert not listed(out, ".*.part")
    # Stopped: the open file is written and its records acked.
    await wait_settled(js, ITEMS_STREAM, CONSUMER)
    assert jsonl_seqs(out) == [list(range(1, 11)), list(range(11, 21)), list(range(21, 26))]
    line = orjson.loads((out / "items-shop-000001.jsonl").read_bytes().splitlines()[0])
    assert line["key"] == "product-0" and line["data"]["name"] == "thing 0"


async def test_an_open_file_is_closed_by_age(
    nats_server: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    settings = fast_settings(nats_server.url)
    await items_stream(js)
    await publish_items(js, [make_item(n) for n in range(3)])
    async with running(settings, file_sink(tmp_path, max_records=100, max_age_s=0.5)):
        await wait_settled(js, ITEMS_STREAM, CONSUMER)
        assert jsonl_seqs(tmp_path) == [[1, 2, 3]]


async def test_parquet_files_hold_the_item_columns(
    nats_server: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    settings = fast_settings(nats_server.url)
    await items_stream(js)
    await publish_items(js, [make_item(n) for n in range(12)])
    async with running(settings, file_sink(tmp_path, "parquet", max_records=5)):
        await eventually(lambda: _count(tmp_path, "parquet", 2))
    await wait_settled(js, ITEMS_STREAM, CONSUMER)
    tables = [pq.read_table(p) for p in listed(tmp_path, "items-shop-*.parquet")]
    assert [t.num_rows for t in tables] == [5, 5, 2]
    first = tables[0].to_pylist()[0]
    assert first["key"] == "product-0" and first["stream_seq"] == 1
    assert orjson.loads(first["data"]) == {"name": "thing 0", "price": 0.0, "crawl": 1}
    assert first["fetched_at"].timestamp() == 1_800_000_001.0


async def _count(directory: Path, ext: str, n: int) -> bool:
    return len(listed(directory, f"items-shop-*.{ext}")) >= n


def listed(directory: Path, pattern: str) -> list[Path]:
    return sorted(directory.glob(pattern))


async def test_one_sink_per_directory_and_leftovers_are_cleared(tmp_path: Path) -> None:
    (tmp_path / ".items-shop-000003.jsonl.part").write_bytes(b'{"half": ')
    first = file_sink(tmp_path)
    await first.open()
    assert not listed(tmp_path, "*.part") and not listed(tmp_path, ".*.part")
    second = file_sink(tmp_path)
    with pytest.raises(SinkError, match="another file sink writes to this directory"):
        await second.open()
    await first.close()
    await second.open()  # the first one gone: its lock with it
    await second.close()


def test_an_unknown_format_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SinkError, match="unknown format 'csv'"):
        file_sink(tmp_path, "csv")
