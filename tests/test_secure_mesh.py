"""A crawl with TLS everywhere: the real services as processes, NATS requiring TLS and a
password, etcd a 3-member cluster requiring client certificates. The member every worker uses
is killed mid-crawl: no lease is lost, no shard changes hands, and the crawl ends with the ledger
exact. Then the services' logs are searched for the keys and the password: never there."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from jetcrawl.local.embedded import EtcdCluster, EtcdTls, NatsServer
from tests.support.certs import Certs, nats_tls_args
from tests.support.mesh import Mesh
from tests.support.site import MultiHostSite
from tests.test_faults import WORKERS, finish, start_crawl

NATS_USER = "crawler"
NATS_PASSWORD = "pw-5ecret-4d2f9a"  # what must never appear in a log


@pytest.fixture
async def site() -> AsyncIterator[MultiHostSite]:
    async with MultiHostSite(seed=11, hosts=4, pages_per_host=120) as started:
        yield started


async def test_a_crawl_over_tls_survives_its_etcd_member_s_death_and_logs_no_secret(
    tmp_path: Path, certs: Certs, site: MultiHostSite
) -> None:
    nats_args = [*nats_tls_args(certs), "--user", NATS_USER, "--pass", NATS_PASSWORD]
    etcd_tls = EtcdTls(certs.server_cert, certs.server_key, client_ca=certs.ca)
    async with (
        NatsServer(tmp_path / "nats", args=nats_args) as nats_server,
        EtcdCluster(tmp_path / "etcd", 3, tls=etcd_tls) as etcd,
    ):
        assert all(member.url.startswith("https://") for member in etcd.members)
        dsn = f"nats://{NATS_USER}:{NATS_PASSWORD}@127.0.0.1:{nats_server.port}"
        async with Mesh(
            dsn,
            etcd.urls,
            tmp_path,
            nats_tls_ca_file=str(certs.ca),
            etcd_tls_ca_file=str(certs.ca),
            etcd_tls_cert_file=str(certs.client_cert),
            etcd_tls_key_file=str(certs.client_key),
        ) as mesh:
            await start_crawl(mesh, site)
            owners = await mesh.wait_ownership(set(WORKERS))
            await mesh.wait_results(len(site.reachable) // 5)
            await etcd.members[0].kill()  # the first endpoint: every worker's member

            await finish(mesh, site)
            assert await mesh.ownership() == owners, "no shard changed hands"

        logs = {name: service.log() for name, service in mesh.services.items()}
        for name, log in logs.items():
            assert f"etcd at {etcd.members[0].url} failed" in log or name == "dispatcher", log
            assert "lease" not in log or "is gone" not in log, f"{name} lost its lease:\n{log}"
            assert NATS_PASSWORD not in log, f"{name} logged the NATS password"
            for line in certs.key_material():
                assert line not in log, f"{name} logged private key material"
        assert f"nats://{NATS_USER}:***@" in logs["dispatcher"], "the URL is logged, masked"
