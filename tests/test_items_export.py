"""``jetcrawl results --items``: the latest item of each key, as JSON lines, CSV or Parquet."""

from __future__ import annotations

import csv
import io
import subprocess
import sys
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest
from nats.js import JetStreamContext

from jetcrawl.contract.errors import UsageError
from jetcrawl.local.embedded import NatsServer
from jetcrawl.ops.items import export_items, item_format_for
from tests.support.sinks import fast_settings, items_stream, make_item, publish_items


async def published(js: JetStreamContext) -> None:
    """Six items of job shop, three of them crawled again, and two of another job."""
    await items_stream(js)
    await publish_items(js, [make_item(n) for n in range(6)])
    await publish_items(js, [make_item(n, crawl=2) for n in range(3)])
    await publish_items(js, [make_item(n, job="other") for n in range(2)])
    await publish_items(js, [make_item(n, crawl=0) for n in range(3, 6)])  # older, late


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
async def test_the_export_holds_the_latest_item_of_each_key(
    nats_server: NatsServer, js: JetStreamContext, tmp_path: Path, fmt: str
) -> None:
    await published(js)
    out = tmp_path / f"items.{fmt}"
    written, read = await export_items(fast_settings(nats_server.url), "shop", out, None)
    assert (written, read) == (6, 12)
    if fmt == "jsonl":
        rows = [orjson.loads(line) for line in out.read_bytes().splitlines()]
        crawls = {r["key"]: r["data"]["crawl"] for r in rows}
    elif fmt == "csv":
        rows = list(csv.DictReader(io.StringIO(out.read_text())))
        assert list(rows[0])[-3:] == ["data.name", "data.price", "data.crawl"]
        crawls = {r["key"]: int(r["data.crawl"]) for r in rows}
    else:
        rows = pq.read_table(out).to_pylist()
        crawls = {r["key"]: orjson.loads(r["data"])["crawl"] for r in rows}
    assert crawls == {f"product-{n}": 2 if n < 3 else 1 for n in range(6)}
    assert {r["job"] for r in rows} == {"shop"}


async def test_every_job_without_job(
    nats_server: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    await published(js)
    written, _ = await export_items(
        fast_settings(nats_server.url), None, tmp_path / "all.jsonl", None
    )
    assert written == 8


def test_formats_follow_the_flag_then_the_file_name() -> None:
    assert item_format_for(Path("x.parquet"), None) == "parquet"
    assert item_format_for(Path("x.csv"), None) == "csv"
    assert item_format_for(Path("x.json"), None) == "jsonl"
    assert item_format_for(None, "csv") == "csv"
    with pytest.raises(UsageError, match="items are written as"):
        item_format_for(None, "warc")


def test_the_command_refuses_what_an_items_export_cannot_do(nats_server: NatsServer) -> None:
    for extra, problem in [
        (["--format", "parquet"], "--format parquet: needs --output FILE"),
        (["--format", "warc"], "items are written as"),
        (["--follow"], "no --since or --follow"),
    ]:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "jetcrawl",
                "results",
                "--items",
                "--nats",
                nats_server.url,
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, done.stderr
        assert problem in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
