"""Topology as code: created idempotently, and printed as JSON the nats CLI accepts back."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from pathlib import Path

import nats
import orjson
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from jetcrawl.contract.errors import TopologyError, TopologyUnavailable
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import Topology, as_cli_json, lane_config
from jetcrawl.local.embedded import NatsCluster, NatsServer
from jetcrawl.plumbing.topology import ensure
from tests.support.streams import eventually


def topology_json(*args: str) -> dict[str, dict[str, object]]:
    out = subprocess.run(
        [sys.executable, "-m", "jetcrawl", "topology", *args],
        check=True,
        capture_output=True,
    )
    return orjson.loads(out.stdout)  # type: ignore[no-any-return]


def _comparable(config: dict[str, object]) -> dict[str, object]:
    skip = {"description", "sealed", "first_seq", "consumer_limits", "compression"}
    return {k: v for k, v in config.items() if k not in skip and v not in (None, False, [], {})}


async def test_printed_topology_is_accepted_back_and_matches_ours(
    nats_server: NatsServer, nc: NATS, js: JetStreamContext
) -> None:
    doc = topology_json("--shards", "4")
    # What `nats stream add --config FILE` and `nats consumer add --config FILE` send.
    for name, config in doc["streams"].items():
        reply = await nc.request(f"$JS.API.STREAM.CREATE.{name}", orjson.dumps(config), timeout=5)
        assert "error" not in orjson.loads(reply.data), reply.data
    for entry in doc["consumers"].values():
        assert isinstance(entry, dict)
        stream, config = entry["stream"], entry["config"]
        request = {"stream_name": stream, "config": config}
        subject = f"$JS.API.CONSUMER.CREATE.{stream}.{config['durable_name']}"
        reply = await nc.request(subject, orjson.dumps(request), timeout=5)
        assert "error" not in orjson.loads(reply.data), reply.data

    ours = Topology.from_settings(Settings(nats_url=nats_server.url, shards=4))
    for stream in ours.streams:
        info = await js.stream_info(stream.name or "")
        server_side = _comparable(info.config.as_dict())
        for key, value in _comparable(stream.as_dict()).items():
            if key == "metadata":
                assert isinstance(value, dict)
                assert value.items() <= (server_side.get("metadata") or {}).items()  # type: ignore[union-attr]
            else:
                assert server_side.get(key) == value, (stream.name, key)
    for stream_name, consumer in ours.consumers:
        info = await js.consumer_info(stream_name, consumer.durable_name or "")
        assert info.config.filter_subject == consumer.filter_subject
        assert info.config.ack_wait == consumer.ack_wait
        assert info.config.max_ack_pending == consumer.max_ack_pending

    # A service starting against what the CLI made finds it right: no error, nothing changed.
    await ensure(js, Settings(nats_url=nats_server.url, shards=4))
    assert (await js.stream_info("CRAWL_TASKS")).config.subjects == ["crawl.tasks.>"]


def test_write_emits_one_file_per_definition_and_the_commands(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "jetcrawl", "topology", "--shards", "2", "--write", str(tmp_path)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    assert f"nats stream add CRAWL_TASKS --config {tmp_path / 'stream-CRAWL_TASKS.json'}" in out
    assert any(line.startswith("nats consumer add CRAWL_FRONTIER dispatch ") for line in out)
    written = orjson.loads((tmp_path / "stream-CRAWL_TASKS.json").read_bytes())
    assert written["subjects"] == ["crawl.tasks.>"]
    assert len(list(tmp_path.iterdir())) == len(out)


async def test_ensure_twice_changes_nothing(nats_server: NatsServer, js: JetStreamContext) -> None:
    settings = Settings(nats_url=nats_server.url, shards=4)
    await ensure(js, settings)
    before = await js.stream_info("CRAWL_FRONTIER")
    await ensure(js, settings)
    after = await js.stream_info("CRAWL_FRONTIER")
    assert before.config == after.config and before.created == after.created


async def _requests_of(nc: NATS, js: JetStreamContext, settings: Settings) -> list[str]:
    """The subjects of the JetStream API requests one ``ensure`` makes."""
    seen: list[str] = []

    async def record(msg: Msg) -> None:
        seen.append(msg.subject)

    sub = await nc.subscribe("$JS.API.>", cb=record)
    try:
        await ensure(js, settings)
        await nc.flush()
    finally:
        await sub.unsubscribe()
    return seen


def _writes(requests: list[str]) -> list[str]:
    return [s for s in requests if ".CREATE." in s or ".UPDATE." in s]


async def test_ensure_on_a_topology_in_place_changes_nothing_and_asks_little(
    nc: NATS, js: JetStreamContext, nats_server: NatsServer
) -> None:
    # 300 shards: the lane consumers a crawl made fill more than one page of the list API (256);
    # ensure makes none of them (their shards' owners do), and leaves them as they are.
    settings = Settings(nats_url=nats_server.url, shards=300)
    topology = Topology.from_settings(settings)
    made = _writes(await _requests_of(nc, js, settings))
    assert len(made) == len(topology.streams) + len(topology.consumers), made
    for shard in range(300):
        await js.add_consumer("CRAWL_TASKS", lane_config(settings, shard, 2, "default"))
    asked = await _requests_of(nc, js, settings)
    assert not _writes(asked), asked
    assert len(asked) < 20, asked  # lists, not one request per consumer


async def test_ensure_puts_back_what_was_changed_by_hand(
    nc: NATS, js: JetStreamContext, nats_server: NatsServer
) -> None:
    settings = Settings(nats_url=nats_server.url, shards=4)
    await ensure(js, settings)
    results = (await js.stream_info("CRAWL_RESULTS")).config
    results.max_age = 3600.0  # a limit where we declare none
    await js.update_stream(results)
    dispatch = (await js.consumer_info("CRAWL_FRONTIER", "dispatch")).config
    dispatch.max_ack_pending = 7
    await js.add_consumer("CRAWL_FRONTIER", dispatch)

    writes = _writes(await _requests_of(nc, js, settings))

    # Only what was changed is written (a stream is created, or else updated).
    assert {w.rsplit(".", 1)[-1] for w in writes} == {"CRAWL_RESULTS", "dispatch"}, writes
    assert not (await js.stream_info("CRAWL_RESULTS")).config.max_age
    declared = next(
        c for _, c in Topology.from_settings(settings).consumers if c.durable_name == "dispatch"
    )
    restored = (await js.consumer_info("CRAWL_FRONTIER", "dispatch")).config
    assert restored.max_ack_pending == declared.max_ack_pending != 7


async def test_a_placement_the_cluster_cannot_make_yet_is_unavailable(
    nats_cluster: NatsCluster,
) -> None:
    # Five replicas on three nodes: JetStream's "no suitable peers for placement", the answer a
    # young cluster also gives while it still counts a peer offline. Nodes joining clear it, so
    # it is the error a caller may retry, and the refused request created nothing.
    nc = await nats.connect(nats_cluster.urls[0], connect_timeout=5)
    try:
        js = nc.jetstream()
        five = Settings(nats_url=nats_cluster.urls[0], shards=2, replicas=5, topology_wait_s=0)
        with pytest.raises(TopologyUnavailable, match=r"CRAWL_FRONTIER.*5 replica"):
            await ensure(js, five)
        assert await js.streams_info() == []

        await ensure(js, Settings(nats_url=nats_cluster.urls[0], shards=2, replicas=3))
        assert (await js.stream_info("CRAWL_FRONTIER")).config.num_replicas == 3
    finally:
        await nc.close()


async def test_a_refusal_that_waiting_cannot_clear_is_not_unavailable(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    # A single server takes no replicas at all: retrying would never succeed.
    with pytest.raises(TopologyError, match="CRAWL_FRONTIER") as refused:
        await ensure(js, Settings(nats_url=nats_server.url, shards=2, replicas=3))
    assert not isinstance(refused.value, TopologyUnavailable)


async def test_ensure_waits_for_a_cluster_without_a_leader_then_applies_the_topology(
    nats_cluster: NatsCluster, caplog: pytest.LogCaptureFixture
) -> None:
    # Two of three nodes down: no meta leader, so JetStream's API answers nothing (or 503).
    down = nats_cluster.servers[1:]
    await asyncio.gather(*(server.stop() for server in down))
    nc = await nats.connect(nats_cluster.urls[0], connect_timeout=5)
    try:
        js = nc.jetstream(timeout=1)
        settings = Settings(nats_url=nats_cluster.urls[0], shards=2, replicas=3)
        caplog.set_level(logging.WARNING, logger="jetcrawl.plumbing.topology")
        applying = asyncio.create_task(ensure(js, settings))

        async def refused() -> bool:
            return any("cannot take the topology yet" in r.message for r in caplog.records)

        await eventually(refused)
        assert not applying.done()
        await asyncio.gather(*(server.start() for server in down))
        async with asyncio.timeout(settings.topology_wait_s):
            await applying
        assert (await js.stream_info("CRAWL_FRONTIER")).config.num_replicas == 3
    finally:
        await nc.close()


async def test_ensure_gives_up_after_topology_wait_s(
    nats_cluster: NatsCluster, caplog: pytest.LogCaptureFixture
) -> None:
    nc = await nats.connect(nats_cluster.urls[0], connect_timeout=5)
    try:
        five = Settings(nats_url=nats_cluster.urls[0], shards=2, replicas=5, topology_wait_s=1)
        caplog.set_level(logging.WARNING, logger="jetcrawl.plumbing.topology")
        with pytest.raises(TopologyUnavailable):
            await ensure(nc.jetstream(), five)
        waits = [r.message for r in caplog.records if "cannot take the topology" in r.message]
        assert waits, "it tried again before it gave up"  # 0.25 s, 0.5 s, then what is left
    finally:
        await nc.close()


# The declarations as `jetcrawl topology` prints them for these settings, pinned: a change to a
# stream or consumer shows here as a diff of tests/topology.json (regenerate it on purpose).
PINNED = Path(__file__).with_name("topology.json")
PINNED_SETTINGS = Settings(
    shards=2,
    replicas=3,
    ack_wait_s=7.0,
    max_ack_pending=100,
    duplicate_window_s=300.0,
    frontier_max_deliver=5,
    task_max_deliver=4,
    max_deferrals=3,
)


def test_the_declared_streams_and_consumers_are_the_pinned_ones() -> None:
    declared = orjson.loads(orjson.dumps(as_cli_json(PINNED_SETTINGS)))
    pinned = orjson.loads(PINNED.read_bytes())
    assert list(declared["streams"]) == list(pinned["streams"])  # in the order they are made
    assert declared == pinned


def test_one_lane_can_fill_its_owners_whole_holding() -> None:
    # A lane delivering fewer than the worker holds would leave its waiting room part empty, and
    # a slow host's tasks deep in the lane unseen until the fast hosts' ahead of them are done.
    settings = Settings(concurrency=64, buffer_max=4096, max_ack_pending=1024)
    assert lane_config(settings, 0, 2, "default").max_ack_pending == 64 + 4096
    larger = settings.replace(max_ack_pending=10_000)
    assert lane_config(larger, 0, 2, "default").max_ack_pending == 10_000
