"""Dispatcher and workers as processes with etcd ownership: whole crawls, faults or not."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from jetcrawl.contract.topology import TASKS_STREAM
from jetcrawl.local.embedded import EtcdServer, NatsServer
from tests.support.mesh import Mesh
from tests.support.site import MultiHostSite
from tests.support.streams import eventually


@pytest.fixture
async def mesh(
    nats_server: NatsServer, etcd_server: EtcdServer, tmp_path: Path
) -> AsyncIterator[Mesh]:
    async with Mesh(nats_server.url, etcd_server.url, tmp_path) as started:
        yield started


@pytest.fixture
async def big_site() -> AsyncIterator[MultiHostSite]:
    """Big enough that a crawl at 4 tasks per worker is still running when we disturb it."""
    async with MultiHostSite(seed=7, hosts=5, pages_per_host=160) as site:
        yield site


async def redeliveries(mesh: Mesh) -> int:
    """Over every lane's consumer (those the server removed when idle had nothing pending)."""
    return sum(info.num_redelivered or 0 for info in await mesh.js.consumers_info(TASKS_STREAM))


def fetch_requests(site: MultiHostSite) -> Counter[str]:
    return Counter({u: n for u, n in site.request_counts.items() if not u.endswith("/robots.txt")})


async def test_three_workers_crawl_exactly_the_reachable_set_fetching_nothing_twice(
    mesh: Mesh, site: MultiHostSite
) -> None:
    await mesh.start("dispatcher", "dispatcher")
    await mesh.start_workers("w1", "w2", "w3")
    ownership = await mesh.wait_ownership({"w1", "w2", "w3"})
    assert sorted(Counter(ownership.values()).values()) == [5, 5, 6]

    await mesh.seed(site.seeds)
    await mesh.wait_drained()
    results = await mesh.results()
    urls = [r.url for r in results]
    assert len(urls) == len(set(urls)), "one result per URL"
    assert set(urls) == site.reachable
    assert max(fetch_requests(site).values()) == 1, "no URL fetched twice"
    assert all(r.attempt == 1 for r in results)
    assert all(r.trace_id is None for r in results), "tracing is off: no trace to name"
    for r in results:
        assert ownership[r.shard] == r.worker, "crawled by the shard's owner"
        assert r.fence > 0


async def test_a_worker_leaving_gracefully_hands_its_shards_over_with_zero_redeliveries(
    mesh: Mesh, big_site: MultiHostSite
) -> None:
    await mesh.start("dispatcher", "dispatcher")
    _, _, w3 = await mesh.start_workers("w1", "w2", "w3")
    await mesh.wait_ownership({"w1", "w2", "w3"})
    await mesh.seed(big_site.seeds)
    await mesh.wait_results(len(big_site.reachable) // 5)

    w3.signal(signal.SIGTERM)
    assert await w3.wait() == 0, w3.log()
    after = await mesh.ownership()
    assert "w3" not in after.values(), "w3 released its shards before exiting"
    await mesh.wait_ownership({"w1", "w2"})
    snap = await mesh.wait_drained()
    assert snap.dead == 0

    results = await mesh.results()
    assert sorted(r.url for r in results) == sorted(big_site.reachable)
    assert "w3" in {r.worker for r in results}, "w3 took part before leaving"
    assert await redeliveries(mesh) == 0
    assert all(r.attempt == 1 for r in results), "no task was delivered twice"
    assert max(fetch_requests(big_site).values()) == 1


async def test_kill_9_of_a_worker_its_shards_are_owned_again_and_the_crawl_completes(
    mesh: Mesh, big_site: MultiHostSite
) -> None:
    await mesh.start("dispatcher", "dispatcher")
    _, w2, _ = await mesh.start_workers("w1", "w2", "w3")
    before = await mesh.wait_ownership({"w1", "w2", "w3"})
    await mesh.seed(big_site.seeds)
    await mesh.wait_results(len(big_site.reachable) // 5)

    w2.signal(signal.SIGKILL)
    killed_at = time.monotonic()
    await w2.wait()
    await mesh.wait_ownership({"w1", "w3"}, within_s=mesh.settings.lease_ttl_s + 10)
    reowned_s = time.monotonic() - killed_at
    assert reowned_s <= mesh.settings.lease_ttl_s + 2, f"shards owned again after {reowned_s:.1f} s"

    await mesh.wait_drained()
    results = await mesh.results()
    urls = Counter(r.url for r in results)
    assert set(urls) == big_site.reachable, "the full set, nothing lost"
    assert max(urls.values()) == 1, "redelivered tasks add no second result"
    # Tasks w2 held when it died come back once more: at most what its pull loops may hold
    # (tasks in flight plus those waiting for their host, worker.politeness) plus one fetch
    # batch per owned shard in the air, each no larger than the free room when it was asked.
    w2_shards = {shard for shard, owner in before.items() if owner == "w2"}
    redelivered = sum(1 for r in results if r.attempt > 1 and r.shard in w2_shards)
    holding = mesh.settings.holding
    assert redelivered <= holding * (1 + len(w2_shards)), redelivered


async def test_a_stopped_worker_past_its_lease_notices_rejoins_and_corrupts_nothing(
    mesh: Mesh, big_site: MultiHostSite
) -> None:
    await mesh.start("dispatcher", "dispatcher")
    w1, _, _ = await mesh.start_workers("w1", "w2", "w3")
    await mesh.wait_ownership({"w1", "w2", "w3"})
    await mesh.seed(big_site.seeds)
    await mesh.wait_results(len(big_site.reachable) // 5)

    w1.signal(signal.SIGSTOP)
    try:
        await mesh.wait_ownership({"w2", "w3"}, within_s=mesh.settings.lease_ttl_s + 10)
    finally:
        w1.signal(signal.SIGCONT)

    async def noticed() -> bool:
        return "lost its lease" in w1.log()

    await eventually(noticed, within_s=10)
    await mesh.wait_ownership({"w1", "w2", "w3"}, within_s=20)
    await mesh.wait_drained()
    results = await mesh.results()
    urls = Counter(r.url for r in results)
    assert set(urls) == big_site.reachable
    assert max(urls.values()) == 1, "late results of the stale worker were dropped as duplicates"
    assert w1.proc.returncode is None, "it rejoined instead of dying"
    await asyncio.sleep(0)  # let the transport settle before teardown


async def test_a_fourth_worker_joining_moves_at_most_twice_the_minimum(mesh: Mesh) -> None:
    await mesh.start_workers("w1", "w2", "w3")
    before = await mesh.wait_ownership({"w1", "w2", "w3"})
    await mesh.start("worker", "w4")
    after = await mesh.wait_ownership({"w1", "w2", "w3", "w4"})
    assert sorted(Counter(after.values()).values()) == [4, 4, 4, 4]
    moved = sum(1 for shard in before if before[shard] != after[shard])
    assert 4 <= moved <= 8
