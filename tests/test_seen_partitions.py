"""The seen set split into K buckets by shard range (``seen_partitions``): declared, checked,
spread over a cluster, and admitting exactly once under two dispatchers."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from jetcrawl.contract.errors import SeenPartitionsMismatch, SettingsError
from jetcrawl.contract.settings import MAX_SEEN_PARTITIONS, Settings
from jetcrawl.contract.topology import (
    SEEN_PARTITIONS_METADATA_KEY,
    SEEN_STREAM,
    Topology,
    seen_partition,
    seen_streams,
)
from jetcrawl.contract.urls import host_of, shard_of
from jetcrawl.dispatcher.seen import SeenSet, SeenSetUnavailable
from jetcrawl.local.embedded import EtcdServer, NatsCluster, NatsServer
from jetcrawl.plumbing.bus import Outbox, connect
from jetcrawl.plumbing.seenleaders import leaders
from jetcrawl.plumbing.topology import ensure
from tests.support.ledger import read_ledger
from tests.support.mesh import Mesh
from tests.support.site import MultiHostSite
from tests.support.streams import eventually, seen_keys

K = 3
SHARDS = 16


def test_one_partition_is_the_bucket_crawl_seen_as_before() -> None:
    streams = {s.name: s for s in Topology.from_settings(Settings(shards=SHARDS)).streams}
    assert SEEN_STREAM in streams
    assert not any(name.startswith(f"{SEEN_STREAM}_") for name in streams)
    assert streams[SEEN_STREAM].metadata is None


def test_k_partitions_are_k_buckets_over_contiguous_shard_ranges() -> None:
    settings = Settings(shards=SHARDS, seen_partitions=K)
    streams = {s.name: s for s in Topology.from_settings(settings).streams}
    assert SEEN_STREAM not in streams
    names = seen_streams(K)
    assert names == ["KV_crawl_seen_0", "KV_crawl_seen_1", "KV_crawl_seen_2"]
    for p, name in enumerate(names):
        stream = streams[name]
        assert stream.subjects == [f"$KV.crawl_seen_{p}.>"]
        assert stream.metadata == {SEEN_PARTITIONS_METADATA_KEY: str(K)}
        assert stream.allow_msg_ttl and stream.max_msgs_per_subject == 1
    owners = [seen_partition(shard, SHARDS, K) for shard in range(SHARDS)]
    assert owners == sorted(owners), "contiguous ranges"
    assert set(owners) == set(range(K)), "every partition holds shards"
    assert "of shards 0-5" in (streams[names[0]].description or "")


@pytest.mark.parametrize("k", [0, MAX_SEEN_PARTITIONS + 1])
def test_a_partition_count_out_of_range_is_refused_naming_the_setting(k: int) -> None:
    with pytest.raises(SettingsError, match="seen_partitions"):
        Settings(shards=64, seen_partitions=k)


def test_more_partitions_than_shards_is_refused() -> None:
    with pytest.raises(SettingsError, match=r"seen_partitions.*at most shards \(2\)"):
        Settings(shards=2, seen_partitions=3)


async def test_a_seen_set_made_with_another_partition_count_is_refused(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    one = Settings(nats_url=nats_server.url, shards=SHARDS)
    three = one.replace(seen_partitions=K)
    await ensure(js, one)
    with pytest.raises(SeenPartitionsMismatch, match="created with 1 partition") as e:
        await ensure(js, three)
    assert (e.value.existing, e.value.wanted) == (1, K)
    with pytest.raises(SeenPartitionsMismatch):  # also for a service that only checks
        await ensure(js, three.replace(create_topology=False))
    await js.delete_stream(SEEN_STREAM)
    await ensure(js, three)
    await ensure(js, three)  # in place: nothing to say
    with pytest.raises(SeenPartitionsMismatch, match="created with 3 partition"):
        await ensure(js, three.replace(seen_partitions=2))
    with pytest.raises(SeenPartitionsMismatch, match="created with 3 partition"):
        await ensure(js, one)


async def test_marks_go_to_their_partitions_bucket_and_are_read_back_from_it(
    nats_server: NatsServer, nc: NATS, js: JetStreamContext
) -> None:
    await ensure(js, Settings(nats_url=nats_server.url, shards=SHARDS, seen_partitions=K))
    seen = SeenSet(Outbox(nc), js, cache_size=10, partitions=K)
    where = {"fp0": 0, "fp2": 2}
    made = await seen.create([("fp0", 40), ("fp2", 42)], partition_of=where)
    assert [m.origin if m else None for m in made] == [40, 42]
    assert [await seen_keys_of(js, p) for p in range(K)] == [{"fp0"}, set(), {"fp2"}]
    # A create in its own partition is rejected; in another it would have been a second mark.
    again = SeenSet(Outbox(nc), js, cache_size=10, partitions=K)
    assert await again.create([("fp2", 43)], partition_of=where) == [None]
    assert (await again.read("fp2", partition=2)).origin == 42
    with pytest.raises(SeenSetUnavailable, match="KV_crawl_seen_1 has no mark fp2"):
        await again.read("fp2", partition=1)


async def seen_keys_of(js: JetStreamContext, partition: int) -> set[str]:
    name = seen_streams(K)[partition]
    info = await js.stream_info(name, subjects_filter=f"$KV.crawl_seen_{partition}.>")
    return {s.rsplit(".", 1)[1] for s in (info.state.subjects or {})}


@pytest.fixture
async def cluster_mesh(
    nats_cluster: NatsCluster, etcd_server: EtcdServer, tmp_path: Path
) -> AsyncIterator[Mesh]:
    urls = ",".join(nats_cluster.urls)
    async with Mesh(urls, etcd_server.url, tmp_path, replicas=3, seen_partitions=K) as started:
        yield started


async def test_a_crawl_over_three_partitions_on_a_cluster_admits_every_url_once(
    cluster_mesh: Mesh, nats_cluster: NatsCluster
) -> None:
    mesh = cluster_mesh
    async with MultiHostSite(seed=11, hosts=6, pages_per_host=40) as site:
        # Two dispatchers share the intake: a URL linked from pages both take is marked once.
        await mesh.start("dispatcher", "d1")
        await mesh.start("dispatcher", "d2")
        await mesh.start_workers("w1", "w2")
        nc = await connect(mesh.settings, "test-leaders")
        try:

            async def spread() -> bool:
                return sorted(map(str, await leaders(nc, K))) == [
                    "n1",
                    "n2",
                    "n3",
                ]  # None: electing

            await eventually(spread, within_s=30)  # the dispatchers moved the leaders apart
        finally:
            await nc.close()
        await mesh.wait_ownership({"w1", "w2"})
        await mesh.seed(site.seeds)
        await mesh.wait_drained()

        ledger = await read_ledger(mesh.js, K)
        print(ledger.summary())
        assert not ledger.lost and not ledger.unexpected, ledger.summary()
        assert ledger.duplicates == 0, ledger.summary()
        results = await mesh.results()
        assert {r.url for r in results} == site.reachable
        by_partition = [await seen_keys_of(mesh.js, p) for p in range(K)]
        assert sum(map(len, by_partition)) == len(await seen_keys(mesh.js, K)) == len(results)
        for r in results:
            p = seen_partition(shard_of(host_of(r.url), SHARDS), SHARDS, K)
            assert r.fp in by_partition[p], f"{r.url} is not in partition {p}"
        assert sum(1 for keys in by_partition if keys) >= 2, "the hosts span partitions"


async def test_a_dispatcher_started_with_another_partition_count_exits_2_in_one_line(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    await ensure(js, Settings(nats_url=nats_server.url))
    proc = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "jetcrawl", "dispatcher", "--nats", nats_server.url],
        env={**os.environ, "JETCRAWL_SEEN_PARTITIONS": "3", "JETCRAWL_SHARDS": "64"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode == 2, (out + err).decode()
    last = err.decode().strip().splitlines()[-1]
    assert "created with 1 partition(s)" in last and "seen_partitions=3" in last, err.decode()
