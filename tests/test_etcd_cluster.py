"""etcd with several endpoints and with TLS, against real etcd processes.

Failover: in a 3-member cluster, the member every worker's client uses (the first endpoint) is
killed with SIGKILL; workers that know every endpoint keep their leases through another member
and no shard changes hands, while a worker that knows only the killed member loses its lease (the
negative case). TLS: a member serving its clients over TLS is trusted only through the right CA,
and one that requires client certificates only with ours.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from jetcrawl.cli import build_parser
from jetcrawl.cli.settings import settings_from
from jetcrawl.contract.errors import SettingsError
from jetcrawl.contract.settings import Settings
from jetcrawl.local.embedded import EtcdCluster, EtcdServer, EtcdTls
from jetcrawl.registry import EtcdUnavailable, read_members
from jetcrawl.registry.etcd import Etcd
from tests.support.certs import Certs
from tests.support.streams import eventually
from tests.test_registry import RecordingOwner, converged, join

SHARDS = 16
LEASE_TTL_S = 3.0  # keepalives every second
CALL_DEADLINE_S = 1.0  # a call to a dead member gives up well within the lease


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[EtcdCluster]:
    async with EtcdCluster(tmp_path / "etcd", 3) as started:
        yield started


def settings_for(etcd_url: str) -> Settings:
    return Settings(
        etcd_url=etcd_url,
        cluster=f"test-{uuid.uuid4().hex[:8]}",
        lease_ttl_s=LEASE_TTL_S,
        etcd_timeout_s=CALL_DEADLINE_S,
        shards=SHARDS,
    )


async def test_workers_keep_their_leases_and_shards_when_their_member_is_killed(
    cluster: EtcdCluster, caplog: pytest.LogCaptureFixture
) -> None:
    settings = settings_for(cluster.urls)
    first, *others = cluster.members
    survivors = settings.replace(etcd_url=",".join(m.url for m in others))
    async with contextlib.AsyncExitStack() as stack:
        joined = [await join(stack, settings, worker) for worker in ("w1", "w2")]
        regs = [reg for reg, _ in joined]
        await converged(regs, ["w1", "w2"])
        before = [(reg.lease_id, reg.owned) for reg in regs]

        caplog.set_level(logging.WARNING, logger="jetcrawl.registry.etcd")
        await first.kill()

        # Twice the lease's TTL: without failover both leases would have expired by then.
        for reg, owner in joined:
            with pytest.raises(TimeoutError):
                await reg.wait_for(
                    lambda reg=reg, owner=owner: (
                        bool(owner.lease_lost_at) or reg.outage_s > LEASE_TTL_S
                    ),
                    timeout_s=2 * LEASE_TTL_S,
                )
        assert [(reg.lease_id, reg.owned) for reg in regs] == before
        assert all(not owner.lease_lost_at for _, owner in joined)
        assert list(await read_members(survivors)) == ["w1", "w2"]
        failovers = [r.getMessage() for r in caplog.records if "now using" in r.getMessage()]
        assert failovers, "the clients moved to another member"
        assert failovers[0].startswith(f"etcd at {first.url} failed"), failovers


async def test_a_worker_that_knows_only_the_killed_member_loses_its_lease(
    cluster: EtcdCluster,
) -> None:
    first, *others = cluster.members
    settings = settings_for(first.url)
    survivors = settings.replace(etcd_url=",".join(m.url for m in others))
    async with contextlib.AsyncExitStack() as stack:
        reg, _ = await join(stack, settings, "w1")
        await converged([reg], ["w1"])
        await first.kill()

        async def gone() -> bool:
            return "w1" not in await read_members(survivors)

        await eventually(gone, within_s=4 * LEASE_TTL_S)
        assert reg.outage_s > 0


async def test_a_call_tries_the_next_member_at_once_when_one_refuses(
    cluster: EtcdCluster,
) -> None:
    first, *_ = cluster.members
    await first.kill()
    async with Etcd(cluster.urls, CALL_DEADLINE_S) as etcd:
        # The first member refuses, the next answers (or, while the cluster elects a new
        # leader, says so and the one after answers): one call, within its deadline.
        listing = await etcd.get_prefix("/nothing/")
        assert listing.entries == ()
        assert etcd.url != first.url
    async with Etcd(first.url, CALL_DEADLINE_S) as alone:
        with pytest.raises(EtcdUnavailable, match=f"etcd get prefix at {first.url}: unavailable"):
            await alone.get_prefix("/nothing/")


# --- TLS


@pytest.fixture
async def tls_etcd(tmp_path: Path, certs: Certs) -> AsyncIterator[EtcdServer]:
    tls = EtcdTls(certs.server_cert, certs.server_key)
    async with EtcdServer(tmp_path / "etcd", tls=tls) as server:
        yield server


@pytest.fixture
async def mtls_etcd(tmp_path: Path, certs: Certs) -> AsyncIterator[EtcdServer]:
    tls = EtcdTls(certs.server_cert, certs.server_key, client_ca=certs.ca)
    async with EtcdServer(tmp_path / "etcd", tls=tls) as server:
        yield server


async def test_a_registry_works_over_tls_verified_against_the_ca(
    tls_etcd: EtcdServer, certs: Certs
) -> None:
    assert tls_etcd.url.startswith("https://")
    settings = settings_for(tls_etcd.url).replace(etcd_tls_ca_file=str(certs.ca))
    async with contextlib.AsyncExitStack() as stack:
        reg, _ = await join(stack, settings, "w1", RecordingOwner())
        await converged([reg], ["w1"])
        assert list(await read_members(settings)) == ["w1"]


@pytest.mark.parametrize("ca", ["other", "system"])
async def test_a_wrong_ca_is_named_as_a_failed_verification(
    tls_etcd: EtcdServer, certs: Certs, ca: str
) -> None:
    settings = settings_for(tls_etcd.url)
    if ca == "other":
        settings = settings.replace(etcd_tls_ca_file=str(certs.other_ca))
    with pytest.raises(EtcdUnavailable) as raised:
        await read_members(settings)
    assert str(raised.value) == (
        f"etcd get prefix at {tls_etcd.url}: unavailable: TLS: certificate verify failed: "
        "unable to get local issuer certificate"
    )


async def test_a_member_that_requires_client_certificates_takes_only_ours(
    mtls_etcd: EtcdServer, certs: Certs
) -> None:
    settings = settings_for(mtls_etcd.url).replace(etcd_tls_ca_file=str(certs.ca))
    with pytest.raises(EtcdUnavailable):
        await read_members(settings)
    with_cert = settings.replace(
        etcd_tls_cert_file=str(certs.client_cert), etcd_tls_key_file=str(certs.client_key)
    )
    assert await read_members(with_cert) == {}


async def test_tls_files_with_a_plain_http_endpoint_are_refused(certs: Certs) -> None:
    settings = settings_for("http://127.0.0.1:2379").replace(etcd_tls_ca_file=str(certs.ca))
    with pytest.raises(Exception, match="TLS files are set, so use https://"):
        Etcd.from_settings(settings)
    missing = settings_for("https://127.0.0.1:2379").replace(etcd_tls_ca_file="/nonexistent")
    with pytest.raises(SettingsError, match="setting etcd_tls_ca_file: cannot read /nonexistent"):
        Etcd.from_settings(missing)


def test_etcd_endpoints_and_tls_files_reach_the_settings_from_flags() -> None:
    argv = ["worker", "--etcd", "https://e1:2379", "--etcd", "https://e2:2379,https://e3:2379"]
    argv += ["--etcd-ca", "ca.pem", "--etcd-cert", "c.pem", "--etcd-key", "c.key"]
    argv += ["--nats", "tls://n:4222", "--nats-ca", "nca.pem"]
    settings = settings_from(build_parser().parse_args(argv))
    assert settings.etcd_url == "https://e1:2379,https://e2:2379,https://e3:2379"
    assert (settings.etcd_tls_ca_file, settings.etcd_tls_cert_file) == ("ca.pem", "c.pem")
    assert (settings.etcd_tls_key_file, settings.nats_tls_ca_file) == ("c.key", "nca.pem")
    with pytest.raises(SettingsError, match="setting etcd_tls_cert_file: set both or neither"):
        settings_from(build_parser().parse_args(["worker", "--etcd-key", "c.key"]))
