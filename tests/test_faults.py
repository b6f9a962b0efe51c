"""Faults of the servers under a crawl, on a 3-node JetStream cluster with R3 streams.

Each scenario injects its fault into a running crawl (one dispatcher, three workers, processes),
lets the crawl finish, and checks the ledger (tests/support/ledger.py): every URL admitted to
``crawl_seen`` has exactly one result record, and the results are exactly the site's reachable
set. The issue asks for 20 s outages; ``OUTAGE_S`` is shorter to keep the default suite fast
(the soak, ``-m soak``, uses 20 s ones). An outage is a timed wait: that is the fault itself;
everything else waits on states.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from nats.errors import Error as NatsError
from nats.js.errors import Error as JetStreamError

from jetcrawl.contract.topology import SEEDS, TASKS_STREAM
from jetcrawl.local.drain import Snapshot, snapshot
from jetcrawl.local.embedded import EtcdServer, NatsCluster, NatsServer
from tests.support.ledger import Ledger, read_ledger
from tests.support.mesh import Mesh
from tests.support.site import MultiHostSite
from tests.support.streams import eventually, read_until

OUTAGE_S = 8.0
WORKERS = ("w1", "w2", "w3")
# While leaders are elected the cluster answers nothing, or "no responders", or times out.
UNAVAILABLE = (NatsError, JetStreamError, TimeoutError)
LEDGER_READ_WITHIN_S = 60.0
FENCED = "fenced, every shard stopped"  # a worker's log line when its lease deadline passed
RESUMED = "lease renewed: resuming"  # ... and when etcd renewed its lease after all


@pytest.fixture
async def mesh(
    nats_cluster: NatsCluster, etcd_server: EtcdServer, tmp_path: Path
) -> AsyncIterator[Mesh]:
    urls = ",".join(nats_cluster.urls)
    async with Mesh(urls, etcd_server.url, tmp_path, replicas=3) as started:
        yield started


@pytest.fixture
async def big_site() -> AsyncIterator[MultiHostSite]:
    """Big enough that the crawl is still running when we disturb it."""
    async with MultiHostSite(seed=7, hosts=5, pages_per_host=160) as site:
        yield site


async def start_crawl(mesh: Mesh, site: MultiHostSite, **faults: str) -> None:
    """The services, the workers of ``faults`` crashing on theirs (tests/support/faulty.py)."""
    await mesh.start("dispatcher", "dispatcher")
    for name in WORKERS:
        await mesh.start("worker", name, fault=faults.get(name))
    await mesh.wait_ownership(set(WORKERS))
    await mesh.seed(site.seeds)


def tolerant(check: Callable[[], Awaitable[bool]]) -> Callable[[], Awaitable[bool]]:
    """``check``, reading False while the cluster cannot answer."""

    async def tolerating() -> bool:
        try:
            return await check()
        except UNAVAILABLE:
            return False

    return tolerating


async def result_count(mesh: Mesh) -> int | None:
    try:
        return await mesh.result_count()
    except UNAVAILABLE:
        return None


async def wait_results_beyond(mesh: Mesh, count: int, within_s: float) -> None:
    async def grew() -> bool:
        now = await result_count(mesh)
        return now is not None and now > count

    await eventually(grew, within_s)


async def finish(
    mesh: Mesh, site: MultiHostSite, within_s: float = 60, exited: frozenset[str] = frozenset()
) -> Ledger:
    """Wait through elections for the crawl to drain; check and return the ledger.

    A service that dies meanwhile (other than those in ``exited``) fails the test at once.
    """
    previous: list[Snapshot | None] = [None]

    async def settled() -> bool:
        for service in mesh.services.values():
            if service.name not in exited and service.proc.returncode is not None:
                pytest.fail(f"{service.name} died:\n{service.log()[-4000:]}")
        current = await snapshot(mesh.js, mesh.settings.shards)
        done = current.settled_after(previous[0])
        previous[0] = current
        return done

    await eventually(tolerant(settled), within_s)
    # Settled streams do not mean every stream has its leader back (crawl_seen may still be
    # electing one after a quorum loss): read the ledger once the cluster answers.
    ledger = await read_until(
        lambda: read_ledger(mesh.js), within_s=LEDGER_READ_WITHIN_S, unavailable=UNAVAILABLE
    )
    print(ledger.summary())
    if ledger.lost:
        logs = {name: service.log() for name, service in mesh.services.items()}
        why = await mesh.tap.explain(mesh.js, ledger.lost, logs)
        pytest.fail(f"{ledger.summary()}\n{why}")
    assert not ledger.unexpected, ledger.summary()
    results = await mesh.results()
    assert {r.url for r in results} == site.reachable, ledger.summary()
    for service in mesh.services.values():
        if service.name not in exited:
            assert_reconnected(service.log())
    return ledger


def assert_reconnected(log: str) -> None:
    """A client that lost its server connected again (its last word is not a disconnect)."""
    lost = log.rfind("nats disconnected")
    assert lost < 0 or log.rfind("nats reconnected") > lost, log[-3000:]


async def stream_leader(mesh: Mesh, cluster: NatsCluster, stream: str) -> NatsServer:
    info = await read_until(
        lambda: mesh.js.stream_info(stream),
        lambda info: info.cluster is not None and bool(info.cluster.leader),
        unavailable=UNAVAILABLE,
    )
    assert info.cluster is not None
    [server] = [s for s in cluster.servers if s.server_name == info.cluster.leader]
    return server


async def test_killing_the_task_stream_leader_mid_crawl_loses_nothing(
    mesh: Mesh, nats_cluster: NatsCluster, big_site: MultiHostSite
) -> None:
    await start_crawl(mesh, big_site)
    await mesh.wait_results(len(big_site.reachable) // 5)
    leader = await stream_leader(mesh, nats_cluster, TASKS_STREAM)
    await leader.kill()
    killed = await result_count(mesh) or 0

    new_leader = await stream_leader(mesh, nats_cluster, TASKS_STREAM)
    assert new_leader is not leader
    await wait_results_beyond(mesh, killed + 20, within_s=60)  # crawling on two nodes
    await leader.start()
    ledger = await finish(mesh, big_site)
    assert ledger.duplicates == 0, ledger.summary()


async def test_losing_quorum_fails_publishes_then_the_crawl_finishes_with_nothing_lost(
    mesh: Mesh, nats_cluster: NatsCluster, big_site: MultiHostSite
) -> None:
    await start_crawl(mesh, big_site)
    await mesh.wait_results(len(big_site.reachable) // 5)
    down = nats_cluster.servers[:2]
    await asyncio.gather(*(s.kill() for s in down))
    lost_at = time.monotonic()

    with pytest.raises(UNAVAILABLE):  # explicit failure, not a silent drop
        await mesh.js.publish(SEEDS, "\n".join(big_site.seeds).encode(), timeout=2)
    await asyncio.sleep(max(0.0, OUTAGE_S - (time.monotonic() - lost_at)))  # the outage
    await asyncio.gather(*(s.start() for s in down))

    ledger = await finish(mesh, big_site)
    assert ledger.duplicates == 0, ledger.summary()
    for service in mesh.services.values():
        assert service.proc.returncode is None, f"{service.name} died:\n{service.log()[-3000:]}"


async def test_etcd_down_workers_fence_themselves_and_resume_their_own_shards_after(
    mesh: Mesh, etcd_server: EtcdServer, big_site: MultiHostSite
) -> None:
    await start_crawl(mesh, big_site)
    await mesh.wait_results(len(big_site.reachable) // 5)
    before = await mesh.ownership()
    await etcd_server.stop()
    stopped_at = time.monotonic()

    async def all_fenced() -> bool:  # nobody can prove its ownership: every worker stops
        return all(FENCED in mesh.services[name].log() for name in WORKERS)

    await eventually(all_fenced, within_s=mesh.settings.lease_ttl_s + 2)
    fenced = await mesh.result_count()
    await asyncio.sleep(max(0.0, OUTAGE_S - (time.monotonic() - stopped_at)))  # the outage
    # Fenced workers start no fetch: what was in flight at the fence is all that was added.
    assert await mesh.result_count() - fenced <= len(WORKERS) * mesh.settings.concurrency
    await etcd_server.start()

    assert await mesh.wait_ownership(set(WORKERS)) == before, "nobody lost shards meanwhile"

    async def all_resumed() -> bool:  # etcd renewed the leases when it came back
        return all(RESUMED in mesh.services[name].log() for name in WORKERS)

    await eventually(all_resumed, within_s=mesh.settings.lease_ttl_s + 5)
    await mesh.start("worker", "w4")
    after = await mesh.wait_ownership({*WORKERS, "w4"}, within_s=30)
    assert sorted(Counter(after.values()).values()) == [4, 4, 4, 4]
    ledger = await finish(mesh, big_site)
    assert ledger.duplicates == 0, ledger.summary()


async def test_a_worker_killed_between_its_result_and_its_ack_adds_no_second_record(
    mesh: Mesh, site: MultiHostSite
) -> None:
    await start_crawl(mesh, site, w3="worker.after_result")
    w3 = mesh.services["w3"]
    assert await w3.wait(within_s=30) == 137, w3.log()
    ledger = await finish(mesh, site, exited=frozenset({"w3"}))
    assert ledger.duplicates == 0, ledger.summary()

    results = await mesh.results()
    [crashed] = [r for r in results if r.worker == "w3"]  # its one record, kept
    assert crashed.attempt == 1
    if crashed.outcome == "fetched":
        assert site.request_counts[crashed.url] == 2, "the redelivered task was crawled again"
