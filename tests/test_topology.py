"""Topology as code: created idempotently, and printed as JSON the nats CLI accepts back."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from jetcrawl.embedded import NatsServer
from jetcrawl.settings import Settings
from jetcrawl.topology import Topology, ensure


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
    assert (await js.stream_info("CRAWL_TASKS")).config.subjects == ["crawl.tasks.*"]


def test_write_emits_one_file_per_definition_and_the_commands(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "jetcrawl", "topology", "--shards", "2", "--write", str(tmp_path)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    assert f"nats stream add CRAWL_TASKS --config {tmp_path / 'stream-CRAWL_TASKS.json'}" in out
    assert any(line.startswith("nats consumer add CRAWL_TASKS shard-1 --config") for line in out)
    written = orjson.loads((tmp_path / "consumer-CRAWL_TASKS-shard-1.json").read_bytes())
    assert written["filter_subject"] == "crawl.tasks.1"
    assert len(list(tmp_path.iterdir())) == len(out)


async def test_ensure_twice_changes_nothing(nats_server: NatsServer, js: JetStreamContext) -> None:
    settings = Settings(nats_url=nats_server.url, shards=4)
    await ensure(js, settings)
    before = await js.stream_info("CRAWL_FRONTIER")
    await ensure(js, settings)
    after = await js.stream_info("CRAWL_FRONTIER")
    assert before.config == after.config and before.created == after.created
