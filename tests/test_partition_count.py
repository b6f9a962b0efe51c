"""The tasks and the seen set split into K streams each by shard range (``partitions``):
declared, checked, spread over a cluster, admitting exactly once under two dispatchers; the
readers of the task streams (backlog, purge, drain, poison tasks) read all K."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import StreamConfig

from jetcrawl.contract.deadletters import DeadLetter
from jetcrawl.contract.errors import PartitionCountMismatch, SettingsError
from jetcrawl.contract.messages import DEFAULT_JOB, DEFAULT_PRIORITY, Lineage, Task
from jetcrawl.contract.settings import MAX_PARTITIONS, Settings
from jetcrawl.contract.topology import (
    ADVISORIES_STREAM,
    DEAD_STREAM,
    PARTITIONS_METADATA_KEY,
    SEEN_STREAM,
    SHARDS_METADATA_KEY,
    TASKS_STREAM,
    Topology,
    lane_config,
    partition_shards,
    seen_streams,
    shard_partition,
    shard_tasks_stream,
    task_subject,
    tasks_streams,
)
from jetcrawl.contract.urls import fingerprint, host_of, shard_of
from jetcrawl.dispatcher.seen import SeenSet, SeenSetUnavailable
from jetcrawl.local.drain import snapshot
from jetcrawl.local.embedded import EtcdServer, NatsCluster, NatsServer
from jetcrawl.ops.jobstatus import check_known, read_backlog
from jetcrawl.plumbing.bus import Outbox, connect
from jetcrawl.plumbing.control import purge_tasks
from jetcrawl.plumbing.leaders import leaders, spread_leaders
from jetcrawl.plumbing.topology import ensure
from tests.support.ledger import read_ledger
from tests.support.mesh import Mesh
from tests.support.site import MultiHostSite
from tests.support.streams import eventually, read_until, seen_keys, stored

K = 3
SHARDS = 16


def declared(settings: Settings) -> dict[str | None, StreamConfig]:
    return {s.name: s for s in Topology.from_settings(settings).streams}


def test_one_partition_is_the_bucket_crawl_seen_and_the_stream_crawl_tasks_as_before() -> None:
    streams = declared(Settings(shards=SHARDS))
    assert SEEN_STREAM in streams
    assert not any(name.startswith(f"{SEEN_STREAM}_") for name in streams)
    assert streams[SEEN_STREAM].metadata is None
    assert streams[TASKS_STREAM].subjects == ["crawl.tasks.>"]
    assert PARTITIONS_METADATA_KEY not in (streams[TASKS_STREAM].metadata or {})
    assert not any(name.startswith(f"{TASKS_STREAM}_") for name in streams)


def test_k_partitions_are_k_buckets_over_contiguous_shard_ranges() -> None:
    streams = declared(Settings(shards=SHARDS, partitions=K))
    assert SEEN_STREAM not in streams
    names = seen_streams(K)
    assert names == ["KV_crawl_seen_0", "KV_crawl_seen_1", "KV_crawl_seen_2"]
    for p, name in enumerate(names):
        stream = streams[name]
        assert stream.subjects == [f"$KV.crawl_seen_{p}.>"]
        assert stream.metadata == {PARTITIONS_METADATA_KEY: str(K)}
        assert stream.allow_msg_ttl and stream.max_msgs_per_subject == 1
    owners = [shard_partition(shard, SHARDS, K) for shard in range(SHARDS)]
    assert owners == sorted(owners), "contiguous ranges"
    assert set(owners) == set(range(K)), "every partition holds shards"
    assert "of shards 0-5" in (streams[names[0]].description or "")


def test_k_partitions_are_k_task_streams_over_the_same_shard_ranges() -> None:
    settings = Settings(shards=SHARDS, partitions=K)
    streams = declared(settings)
    assert TASKS_STREAM not in streams
    names = tasks_streams(K)
    assert names == ["CRAWL_TASKS_0", "CRAWL_TASKS_1", "CRAWL_TASKS_2"]
    covered: list[int] = []
    for p, name in enumerate(names):
        stream = streams[name]
        mine = [s for s in range(SHARDS) if shard_partition(s, SHARDS, K) == p]
        assert list(partition_shards(p, K, SHARDS)) == mine
        assert stream.subjects == [f"crawl.tasks.{s}.>" for s in mine]
        assert stream.metadata is not None
        assert stream.metadata[PARTITIONS_METADATA_KEY] == str(K)
        assert stream.metadata[SHARDS_METADATA_KEY] == str(SHARDS)
        assert all(shard_tasks_stream(s, settings) == name for s in mine)
        covered += mine
    assert covered == list(range(SHARDS)), "every shard in one task stream"
    # A lane's consumer of any task stream that gives up on a task is heard by the collector.
    advisories = streams[ADVISORIES_STREAM].subjects or []
    for name in names:
        assert f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{name}.*" in advisories


@pytest.mark.parametrize("k", [0, MAX_PARTITIONS + 1])
def test_a_partition_count_out_of_range_is_refused_naming_the_setting(k: int) -> None:
    with pytest.raises(SettingsError, match="partitions"):
        Settings(shards=64, partitions=k)


def test_more_partitions_than_shards_is_refused() -> None:
    with pytest.raises(SettingsError, match=r"partitions.*at most shards \(2\)"):
        Settings(shards=2, partitions=3)


async def test_a_seen_set_made_with_another_partition_count_is_refused(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    one = Settings(nats_url=nats_server.url, shards=SHARDS)
    three = one.replace(partitions=K)
    await ensure(js, one)
    with pytest.raises(PartitionCountMismatch, match="created with 1 partition") as e:
        await ensure(js, three)
    assert (e.value.existing, e.value.wanted, e.value.stream) == (1, K, TASKS_STREAM)
    with pytest.raises(PartitionCountMismatch):  # also for a service that only checks
        await ensure(js, three.replace(create_topology=False))
    await js.delete_stream(TASKS_STREAM)
    with pytest.raises(PartitionCountMismatch, match=f"stream {SEEN_STREAM} was created"):
        await ensure(js, three)
    await js.delete_stream(SEEN_STREAM)
    await ensure(js, three)
    await ensure(js, three)  # in place: nothing to say
    with pytest.raises(PartitionCountMismatch, match="created with 3 partition"):
        await ensure(js, three.replace(partitions=2))
    with pytest.raises(PartitionCountMismatch, match="created with 3 partition"):
        await ensure(js, one)


async def test_marks_go_to_their_partitions_bucket_and_are_read_back_from_it(
    nats_server: NatsServer, nc: NATS, js: JetStreamContext
) -> None:
    await ensure(js, Settings(nats_url=nats_server.url, shards=SHARDS, partitions=K))
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
    async with Mesh(urls, etcd_server.url, tmp_path, replicas=3, partitions=K) as started:
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
                seen = await leaders(nc, seen_streams(K))
                tasks = await leaders(nc, tasks_streams(K))  # None: electing
                return sorted(map(str, seen)) == ["n1", "n2", "n3"] and tasks == seen

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
            p = shard_partition(shard_of(host_of(r.url), SHARDS), SHARDS, K)
            assert r.fp in by_partition[p], f"{r.url} is not in partition {p}"
        assert sum(1 for keys in by_partition if keys) >= 2, "the hosts span partitions"
        for p, name in enumerate(tasks_streams(K)):  # each partition's tasks went to its stream
            info = await mesh.js.stream_info(name)
            assert info.state.messages == 0
            assert info.state.last_seq == len(by_partition[p]), name


async def test_a_dispatcher_started_with_another_partition_count_exits_2_in_one_line(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    await ensure(js, Settings(nats_url=nats_server.url))
    proc = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "jetcrawl", "dispatcher", "--nats", nats_server.url],
        env={**os.environ, "JETCRAWL_PARTITIONS": "3", "JETCRAWL_SHARDS": "64"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode == 2, (out + err).decode()
    last = err.decode().strip().splitlines()[-1]
    assert "created with 1 partition(s)" in last and "partitions=3" in last, err.decode()


async def test_backlog_job_check_purge_and_drain_read_every_task_stream(
    nats_server: NatsServer, nc: NATS, js: JetStreamContext
) -> None:
    settings = Settings(nats_url=nats_server.url, shards=SHARDS, partitions=K)
    await ensure(js, settings)
    lineage = Lineage(job="a", scope="any", root="", max_depth=1)
    shards = [0, 7, 15]  # one in each partition
    for shard in shards:
        for n, job in enumerate(("a", "a", "b")):
            url = f"http://h{shard}.example/{n}"
            task = Task(url, fingerprint(url), 1, lineage)
            await js.publish(task_subject(shard, 2, job), task.to_wire())
    assert [(await js.stream_info(n)).state.messages for n in tasks_streams(K)] == [3, 3, 3]

    backlog = await read_backlog(js)
    assert backlog.total() == 9 and backlog.total("a") == 6
    assert backlog.by_shard("b") == dict.fromkeys(shards, 1)
    await check_known(js, "b")  # known by its queued tasks alone
    snap = await snapshot(js, SHARDS)
    assert snap.task_backlog == 9 and len(snap.last_seqs) == 3 + K

    assert await purge_tasks(nc, "a", timeout_s=5) == 6
    assert (await read_backlog(js)).lanes == {(s, 2, "b"): 1 for s in shards}


async def test_poison_tasks_at_one_sequence_of_two_task_streams_are_two_dead_letters(
    nats_server: NatsServer, etcd_server: EtcdServer, tmp_path: Path
) -> None:
    async with Mesh(
        nats_server.url, etcd_server.url, tmp_path, shards=SHARDS, partitions=K,
        task_max_deliver=1, max_deferrals=0, ack_wait_s=0.5,
    ) as mesh:  # fmt: skip
        await mesh.start("dispatcher", "d1")  # its poison collector
        js, lineage = mesh.js, Lineage(job=DEFAULT_JOB, scope="any", root="", max_depth=1)
        urls = {0: "http://a.example/poison", SHARDS - 1: "http://b.example/poison"}
        for shard, url in urls.items():  # sequence 1 of CRAWL_TASKS_0 and of CRAWL_TASKS_2
            task = Task(url, fingerprint(url), 1, lineage)
            await js.publish(task_subject(shard), task.to_wire())
            config = lane_config(mesh.settings, shard, DEFAULT_PRIORITY, DEFAULT_JOB)
            stream = shard_tasks_stream(shard, mesh.settings)
            await js.add_consumer(stream, config)
            sub = await js.pull_subscribe_bind(durable=config.durable_name or "", stream=stream)
            [msg] = await sub.fetch(1, timeout=5)  # never acked: its one delivery fails
            assert msg.metadata.sequence.stream == 1

            async def given_up(sub: JetStreamContext.PullSubscription = sub) -> bool:
                with contextlib.suppress(TimeoutError):  # a pull: JetStream looks again
                    await sub.fetch(1, timeout=0.2)
                return (await js.stream_info(ADVISORIES_STREAM)).state.last_seq > 0

            await eventually(given_up, within_s=30)

        async def dead_lettered() -> bool:
            return (await js.stream_info(DEAD_STREAM)).state.messages == 2

        await eventually(dead_lettered, within_s=30)
        letters = [DeadLetter.from_wire(m.data) for m in await stored(js, DEAD_STREAM)]
        assert {Task.from_wire(d.original).url for d in letters} == set(urls.values())
        assert all((d.stage, d.reason) == ("poison", "max_deliveries") for d in letters)
        for name in tasks_streams(K):
            assert (await js.stream_info(name)).state.messages == 0, f"{name}: deleted"


async def test_a_stream_that_cannot_elect_a_leader_reads_as_electing(
    nats_cluster: NatsCluster,
) -> None:
    # Two dispatchers starting together each ask for step-downs; between one's step-down and
    # the next election the other's stream info gets no answer, which must not end it.
    settings = Settings(nats_url=nats_cluster.urls[0], shards=SHARDS, partitions=K, replicas=3)
    nc = await connect(settings, "test-electing")
    try:
        await ensure(nc.jetstream(), settings)
        stream = tasks_streams(K)[0]
        led_by = (await leaders(nc, [stream]))[0]
        if led_by == "n1":  # our connection's node: move the leader off it, to lose it below
            await nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", b"", timeout=5)
            led_by = await read_until(
                lambda: leaders(nc, [stream]), lambda now: now[0] not in (None, "n1")
            )
        # The follower first, then the leader (killed: a stopped one hands its leadership on).
        for server in sorted(nats_cluster.servers[1:], key=lambda s: s.server_name == led_by):
            await server.kill()
        assert await leaders(nc, [stream]) == [None]
        await spread_leaders(nc, K)  # does not raise: the stream without a leader is passed by
    finally:
        await nc.close()


async def test_partition_tags_place_each_partitions_streams_on_its_servers(tmp_path: Path) -> None:
    tags = [["n1", "rack-a"], ["n2"], ["n3"]]
    async with NatsCluster(tmp_path / "cluster", 3, tags=tags) as cluster:
        settings = Settings(
            nats_url=",".join(cluster.urls),
            shards=SHARDS,
            partitions=K,
            replicas=1,  # more servers than replicas: where placement decides the load
            partition_tags=("rack-a", "n2", "n3"),
        )
        nc = await connect(settings, "test-placement")
        try:
            js = nc.jetstream()
            await ensure(js, settings)
            assert await leaders(nc, tasks_streams(K)) == ["n1", "n2", "n3"]
            assert await leaders(nc, seen_streams(K)) == ["n1", "n2", "n3"]
            await ensure(js, settings.replace(create_topology=False))  # as declared
        finally:
            await nc.close()


@pytest.mark.parametrize("tags", [("a", ""), (" a",)])
def test_a_blank_or_padded_partition_tag_is_refused(tags: tuple[str, ...]) -> None:
    with pytest.raises(SettingsError, match="partition_tags"):
        Settings(partition_tags=tags)
