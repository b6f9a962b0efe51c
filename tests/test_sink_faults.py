"""Sinks killed with -9 mid-batch, and restarted: every item stored once, none lost, none doubled
(real ``jetcrawl sink`` processes, real nats-server and PostgreSQL); and a sink that cannot reach
NATS at start fails fast."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg
import orjson
import pytest
from nats.js import JetStreamContext

from jetcrawl.contract.topology import ITEMS_STREAM
from jetcrawl.local.embedded import NatsServer, free_ports
from jetcrawl.sinks.pgschema import SCHEMA
from tests.support.faulty import EXIT_CODE
from tests.support.postgres import PASSWORD, PostgresServer
from tests.support.scrape import free_port, probe, scrape
from tests.support.sinks import (
    SinkProcess,
    items_stream,
    make_item,
    publish_items,
    wait_settled,
)
from tests.support.streams import eventually

BATCH = {"JETCRAWL_SINK_BATCH": "50"}
PG_CONSUMER = "sink-postgres-shop"
FILES_CONSUMER = "sink-files-shop"
JETCRAWL = (sys.executable, "-m", "jetcrawl")


async def table(dsn: str) -> dict[str, tuple[int, object]]:
    """key -> (stream_seq, written_at) of every stored item (none if the table is not there)."""
    conn = await asyncpg.connect(dsn)
    try:
        if await conn.fetchval(f"SELECT to_regclass('{SCHEMA}.items')") is None:
            return {}
        got = await conn.fetch(f"SELECT key, stream_seq, written_at FROM {SCHEMA}.items")
    finally:
        await conn.close()
    return {r["key"]: (r["stream_seq"], r["written_at"]) for r in got}


def rows_at_least(dsn: str, n: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return len(await table(dsn)) >= n

    return check


def pg_sink(nats: NatsServer, pg: PostgresServer, log: Path, fault: str | None = None):
    return SinkProcess(
        ["postgres", "--job", "shop", "--nats", nats.url],
        {**BATCH, "JETCRAWL_SINK_DSN": pg.dsn()},
        log,
        fault,
    )


async def test_kill_9_after_commit_before_ack_then_restart_doubles_nothing(
    nats_server: NatsServer, js: JetStreamContext, postgres: PostgresServer, tmp_path: Path
) -> None:
    await items_stream(js)
    await publish_items(js, [make_item(n) for n in range(300)])
    crashing = pg_sink(nats_server, postgres, tmp_path / "sink1.log", "sink.before_ack:2")
    await crashing.start()
    assert await crashing.wait() == EXIT_CODE, crashing.output()
    before = await table(postgres.dsn())
    info = await js.consumer_info(ITEMS_STREAM, PG_CONSUMER)
    # The fault hit mid-stream: two batches committed, only the first acked.
    assert len(before) == 100 and info.ack_floor.stream_seq == 50

    restarted = pg_sink(nats_server, postgres, tmp_path / "sink2.log")
    await restarted.start()
    try:
        await wait_settled(js, ITEMS_STREAM, PG_CONSUMER)
    finally:
        assert await restarted.stop() == 0, restarted.output()
    after = await table(postgres.dsn())
    assert sorted(after) == sorted(f"product-{n}" for n in range(300))
    assert all(after[key] == before[key] for key in before), "redelivered: changed nothing"
    assert PASSWORD not in crashing.output() + restarted.output()


async def test_kill_9_inside_a_transaction_then_restart_loses_nothing(
    nats_server: NatsServer, js: JetStreamContext, postgres: PostgresServer, tmp_path: Path
) -> None:
    await items_stream(js)
    await publish_items(js, [make_item(n) for n in range(300)])
    crashing = pg_sink(nats_server, postgres, tmp_path / "sink1.log", "sink.in_transaction:2")
    await crashing.start()
    assert await crashing.wait() == EXIT_CODE, crashing.output()
    assert len(await table(postgres.dsn())) == 50, "the second batch was rolled back"

    restarted = pg_sink(nats_server, postgres, tmp_path / "sink2.log")
    await restarted.start()
    try:
        await wait_settled(js, ITEMS_STREAM, PG_CONSUMER)
    finally:
        assert await restarted.stop() == 0, restarted.output()
    assert len(await table(postgres.dsn())) == 300


async def test_kill_9_from_outside_while_items_flow_and_postgres_restarts(
    nats_server: NatsServer, js: JetStreamContext, postgres: PostgresServer, tmp_path: Path
) -> None:
    """The sink SIGKILLed at whatever it was doing and PostgreSQL restarted, while a crawl
    keeps publishing: every unique key ends in exactly one row."""
    await items_stream(js)
    sink = pg_sink(nats_server, postgres, tmp_path / "sink1.log")
    await sink.start()
    published = 0

    for round_ in range(3):
        await publish_items(js, [make_item(n) for n in range(published, published + 200)])
        published += 200
        await eventually(rows_at_least(postgres.dsn(), published - 150))  # mid-stream
        if round_ == 0:
            await sink.kill()
            sink = pg_sink(nats_server, postgres, tmp_path / "sink2.log")
            await sink.start()
        elif round_ == 1:
            await postgres.stop()
            await publish_items(js, [make_item(n) for n in range(published, published + 100)])
            published += 100
            await postgres.start()
    await publish_items(js, [make_item(n) for n in range(published - 50, published)])  # copies
    try:
        await wait_settled(js, ITEMS_STREAM, PG_CONSUMER)
    finally:
        assert await sink.stop() == 0, sink.output()
    stored = await table(postgres.dsn())
    assert sorted(stored) == sorted(f"product-{n}" for n in range(published))


def file_sink(
    nats: NatsServer, out: Path, log: Path, fault: str | None = None, max_records: int = 40
) -> SinkProcess:
    return SinkProcess(
        ["files", "--dir", str(out), "--job", "shop", "--nats", nats.url],
        {
            **BATCH,
            "JETCRAWL_SINK_FILE_MAX_RECORDS": str(max_records),
            "JETCRAWL_SINK_FILE_MAX_AGE_S": "1",
        },
        log,
        fault,
    )


@pytest.mark.parametrize("max_records", [40, 10])  # one file, or five, in the crashing write
async def test_file_sink_kill_9_after_a_file_before_its_acks_then_restart(
    nats_server: NatsServer, js: JetStreamContext, tmp_path: Path, max_records: int
) -> None:
    out = tmp_path / "out"
    await items_stream(js)
    await publish_items(js, [make_item(n) for n in range(130)])
    crashing = file_sink(nats_server, out, tmp_path / "sink1.log", "sink.before_ack:1", max_records)
    await crashing.start()
    assert await crashing.wait() == EXIT_CODE, crashing.output()
    written = [f"items-shop-{n:06d}.jsonl" for n in range(1, 50 // max_records + 1)]
    assert [p.name for p in sorted(out.glob("items-*"))] == written
    assert (await js.consumer_info(ITEMS_STREAM, FILES_CONSUMER)).ack_floor.stream_seq == 0

    restarted = file_sink(nats_server, out, tmp_path / "sink2.log", max_records=max_records)
    await restarted.start()
    try:
        await wait_settled(js, ITEMS_STREAM, FILES_CONSUMER)
    finally:
        assert await restarted.stop() == 0, restarted.output()
    seqs = [
        orjson.loads(line)["stream_seq"]
        for path in sorted(out.glob("items-shop-*.jsonl"))
        for line in path.read_bytes().splitlines()
    ]
    assert sorted(seqs) == list(range(1, 131)), "each item once: none lost, none doubled"
    assert not list(out.glob(".*.part"))


def test_a_sink_that_cannot_reach_nats_fails_fast_in_one_line(tmp_path: Path) -> None:
    [port] = free_ports(1)
    url = f"nats://127.0.0.1:{port}"
    started = time.monotonic()
    done = subprocess.run(
        [
            *JETCRAWL,
            "sink",
            "files",
            "--dir",
            str(tmp_path),
            "--nats",
            url,
            "--connect-timeout",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert time.monotonic() - started < 15
    [line] = done.stderr.strip().splitlines()
    assert url in line and "connection refused" in line


def test_bad_sink_input_fails_in_one_line_before_anything_starts() -> None:
    for args, problem in [
        (["postgres", "--dsn", "mysql://u:pw@h/db"], "--dsn: not a postgresql:// URL"),
        (["postgres"], "--dsn: no database given"),
        (["files", "--dir", "/tmp", "--job", "no/slash"], "a job name matches"),
    ]:
        done = subprocess.run(
            [*JETCRAWL, "sink", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin"},
        )
        assert done.returncode == 2, done.stderr
        assert problem in done.stderr and "pw" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


async def test_the_sink_serves_metrics_and_is_not_ready_while_its_database_is_away(
    nats_server: NatsServer, js: JetStreamContext, postgres: PostgresServer, tmp_path: Path
) -> None:
    port = free_port()
    await items_stream(js)
    sink = pg_sink(nats_server, postgres, tmp_path / "sink.log")
    sink.args += ["--metrics-port", str(port)]
    await sink.start()
    try:
        await publish_items(js, [make_item(n) for n in range(30)])
        await wait_settled(js, ITEMS_STREAM, PG_CONSUMER)
        assert (await probe(port, "/healthz"))[0] == 200
        assert (await probe(port, "/readyz"))[0] == 200
        samples = await scrape(port)
        assert samples.get("jetcrawl_sink_records_stored_total") == 30
        assert samples.get("jetcrawl_sink_paused") == 0

        await postgres.stop()
        await publish_items(js, [make_item(n) for n in range(30, 40)])

        async def not_ready() -> bool:
            status, body = await probe(port, "/readyz")
            return status == 503 and "sink paused" in str(body)

        await eventually(not_ready)
        samples = await scrape(port)
        assert samples.get("jetcrawl_sink_paused") == 1
        assert samples.get("jetcrawl_sink_records_held") > 0
        assert (await probe(port, "/healthz"))[0] == 200, "alive all the same"
        await postgres.start()
        await wait_settled(js, ITEMS_STREAM, PG_CONSUMER)
        assert (await probe(port, "/readyz"))[0] == 200
        assert (await scrape(port)).get("jetcrawl_sink_pauses_total") == 1
    finally:
        assert await sink.stop() == 0, sink.output()
