"""compose's ``sink`` service as a local process: its command and environment, the ``sink`` NATS
user of nats/accounts.conf, a real PostgreSQL standing in for compose's ``postgres``. Its rights
cover what it does (no permission violation while it stores items and results) and nothing more
(what it is refused)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import pytest
from nats.errors import TimeoutError as NatsTimeoutError

from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import (
    ITEMS_STREAM,
    RESULTS_STREAM,
    SEEDS,
    TASKS_STREAM,
    result_subject,
)
from jetcrawl.sinks.pgschema import SCHEMA
from tests.support.postgres import PASSWORD, PostgresServer
from tests.support.sinks import make_item, publish_items, wait_settled
from tests.test_deploy import (
    DATABASE_PASSWORD,
    SERVICES,
    ComposeMesh,
    apply_topology,
    assert_no_violations,
    compose_nats,
    connect_as,
    dev_certs,
    passwords,
    refused,
)
from tests.test_sink_postgres import result

__all__ = ["dev_certs", "passwords"]  # the fixtures, from the compose tests


def test_compose_runs_the_postgres_sink_after_its_database_and_the_topology() -> None:
    sink = SERVICES["sink"]
    assert sink["command"] == ["sink", "postgres"]
    conditions = {dep: c["condition"] for dep, c in sink["depends_on"].items()}
    assert conditions == {
        "nats": "service_healthy",
        "postgres": "service_healthy",
        "topology": "service_completed_successfully",
    }
    assert "healthcheck" in SERVICES["postgres"]
    database = SERVICES["postgres"]["environment"]
    assert f"${{{DATABASE_PASSWORD}:-" in database[DATABASE_PASSWORD]


async def test_the_compose_sink_stores_with_only_its_own_rights(
    tmp_path: Path, passwords: dict[str, str], dev_certs: Path, postgres: PostgresServer
) -> None:
    conn = await asyncpg.connect(postgres.dsn())
    await conn.execute("CREATE DATABASE jetcrawl")  # compose's POSTGRES_DB
    await conn.close()
    async with compose_nats(tmp_path / "nats") as server:
        await apply_topology(server, Settings(nats_url=server.url))
        hosts = {
            "nats:4222": server.url.removeprefix("nats://"),
            "postgres:5432": postgres.address,
            # in the shared environment; a sink reaches neither
            "etcd:2379": "127.0.0.1:9",
            "jaeger:4318": "127.0.0.1:9",
        }
        mesh = ComposeMesh(tmp_path, hosts, {**passwords, DATABASE_PASSWORD: PASSWORD}, dev_certs)
        admin = await connect_as(server, "admin")
        js = admin.jetstream()
        try:
            await publish_items(js, [make_item(n, job=f"job{n % 2}") for n in range(40)])
            for n in range(6):
                await js.publish(result_subject(n % 4), result(n).to_wire())
            sink = await mesh.run("sink", "sink")
            await wait_settled(js, ITEMS_STREAM, "sink-postgres-all")
            await wait_settled(js, RESULTS_STREAM, "sink-postgres-all")
            assert_no_violations(server)
        finally:
            codes = await mesh.stop(10)
            await admin.close()
        assert codes == {"sink": 0}, sink.log_path.read_text()
        conn = await asyncpg.connect(postgres.dsn(database="jetcrawl"))
        try:
            assert await conn.fetchval(f"SELECT count(*) FROM {SCHEMA}.items") == 40
            assert await conn.fetchval(f"SELECT count(*) FROM {SCHEMA}.results") == 6
        finally:
            await conn.close()
        assert PASSWORD not in sink.log_path.read_text()

        errors: asyncio.Queue[str] = asyncio.Queue()
        user = await connect_as(server, "sink", errors)
        try:
            await user.publish(SEEDS, b"https://example.com/")
            await refused(errors, f'publish to "{SEEDS}"')
            await user.publish("crawl.dead.task", b"{}")
            await refused(errors, 'publish to "crawl.dead.task"')
            with pytest.raises(NatsTimeoutError):
                await user.jetstream(timeout=1).purge_stream(ITEMS_STREAM)
            await refused(errors, f'publish to "$JS.API.STREAM.PURGE.{ITEMS_STREAM}"')
            with pytest.raises(NatsTimeoutError):
                await user.jetstream(timeout=1).pull_subscribe(
                    "crawl.tasks.0", durable="sink-steal", stream=TASKS_STREAM
                )
            await refused(
                errors,
                f'publish to "$JS.API.CONSUMER.CREATE.{TASKS_STREAM}.sink-steal.crawl.tasks.0"',
            )
        finally:
            await user.close()
