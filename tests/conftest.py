"""Shared fixtures: real servers and a local website, one of each per test (parallel-safe).

nats_server   a started single NatsServer with JetStream (store under tmp_path)
nc, js        a nats-py client connected to nats_server, and its JetStream context
nats_cluster  a started 3-node NatsCluster with a JetStream meta leader
etcd_server   a started single-member EtcdServer
site          a started MultiHostSite (tests/support/site.py) with a fixed seed
example_plugin  the example plugin package installed in this venv (tests/support/exampleplugin.py)
certs         a test CA with server and client certificates as PEM files (tests/support/certs.py)
postgres      a started PostgreSQL server (tests/support/postgres.py), removed afterwards
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

import jetcrawl.registry.etcd  # noqa: F401  first, as tests import aetcd: it configures grpc (see there)
from jetcrawl.local.embedded import EtcdServer, NatsCluster, NatsServer
from tests.support.certs import Certs, make_certs
from tests.support.exampleplugin import ensure_installed
from tests.support.postgres import PostgresServer
from tests.support.site import MultiHostSite

SITE_SEED = 20240601


@pytest.fixture
async def nats_server(tmp_path: Path) -> AsyncIterator[NatsServer]:
    async with NatsServer(tmp_path / "nats") as server:
        yield server


@pytest.fixture
async def nc(nats_server: NatsServer) -> AsyncIterator[NATS]:
    client = await nats.connect(nats_server.url, connect_timeout=5)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
def js(nc: NATS) -> JetStreamContext:
    return nc.jetstream()


@pytest.fixture
async def nats_cluster(tmp_path: Path) -> AsyncIterator[NatsCluster]:
    async with NatsCluster(tmp_path / "cluster", 3) as cluster:
        yield cluster


@pytest.fixture
async def etcd_server(tmp_path: Path) -> AsyncIterator[EtcdServer]:
    async with EtcdServer(tmp_path / "etcd") as server:
        yield server


@pytest.fixture
async def site() -> AsyncIterator[MultiHostSite]:
    async with MultiHostSite(seed=SITE_SEED) as started:
        yield started


@pytest.fixture(scope="session")
def example_plugin() -> None:
    ensure_installed()


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    return make_certs(tmp_path / "certs")


@pytest.fixture
async def postgres(tmp_path: Path) -> AsyncIterator[PostgresServer]:
    server = PostgresServer(tmp_path / "postgres.log")
    try:
        async with server:
            yield server
    finally:
        server.remove()
