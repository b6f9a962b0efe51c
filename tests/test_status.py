"""``jetcrawl status`` as a process, during and after a crawl, against etcd and JetStream."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import orjson

from jetcrawl.contract.topology import RESULTS_STREAM, TASKS_STREAM
from jetcrawl.local.embedded import EtcdServer, NatsServer
from jetcrawl.registry import read_members
from tests.support.mesh import SHARDS, Mesh
from tests.support.site import MultiHostSite

WORKERS = ("w1", "w2")


async def status(mesh: Mesh, *flags: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "jetcrawl",
        "status",
        *flags,
        env={**os.environ, **mesh.settings.to_env()},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(30):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode() + err.decode()


async def status_json(mesh: Mesh, interval_s: float = 0.5) -> dict[str, Any]:
    code, out = await status(mesh, "--json", "--interval", str(interval_s))
    assert code == 0, out
    doc = orjson.loads(out)
    assert isinstance(doc, dict)
    return doc


async def test_status_matches_etcd_and_jetstream_during_and_after_a_crawl(
    nats_server: NatsServer, etcd_server: EtcdServer, tmp_path: Path
) -> None:
    async with (
        MultiHostSite(seed=5, hosts=4, pages_per_host=60) as site,
        Mesh(nats_server.url, etcd_server.url, tmp_path) as mesh,
    ):
        await mesh.start("dispatcher", "dispatcher")
        workers = await mesh.start_workers(*WORKERS)
        ownership = await mesh.wait_ownership(set(WORKERS))
        members = await read_members(mesh.settings)

        await mesh.seed(site.seeds)
        await mesh.wait_results(len(site.reachable) // 4)
        results_before = await mesh.result_count()
        during = await status_json(mesh)
        results_after = await mesh.result_count()

        # who owns what, and who is there, as etcd says
        assert {w["id"] for w in during["workers"]} == set(WORKERS)
        for w in during["workers"]:
            info = members[w["id"]]
            assert (w["host"], w["pid"], w["version"]) == (info.host, info.pid, info.version)
            assert w["shards"] == sorted(s for s, owner in ownership.items() if owner == w["id"])
            assert 0 < w["age_s"] < 120
        assert {s["shard"]: s["owner"] for s in during["shards"]} == ownership
        assert during["shard_count"] == SHARDS
        # the counts, as JetStream says (the crawl moves on while status reads)
        assert results_before <= during["results"] <= results_after
        assert during["rates"]["interval_s"] >= 0.5
        assert during["rates"]["results_per_s"] >= 0
        assert during["dead_letters"] == 0

        await mesh.wait_drained()
        after = await status_json(mesh)
        tasks = await mesh.js.stream_info(TASKS_STREAM)
        results = await mesh.js.stream_info(RESULTS_STREAM)
        assert after["results"] == results.state.messages == len(site.reachable)
        assert after["tasks"] == {"queued": 0, "levels": [0] * 4, "published": tasks.state.last_seq}
        assert after["frontier"] == {"pending": 0, "unacked": 0}
        assert all(s["queued"] == 0 and s["levels"] == [0] * 4 for s in after["shards"])
        assert after["rates"]["results_per_s"] == 0, "drained: nothing moves"
        assert {s["shard"]: s["owner"] for s in after["shards"]} == await mesh.ownership()

        # a worker leaves: status shows it gone once etcd does
        workers[1].signal(signal.SIGTERM)
        assert await workers[1].wait() == 0
        await mesh.wait_ownership({"w1"})
        left = await status_json(mesh, interval_s=0)
        assert [w["id"] for w in left["workers"]] == ["w1"]
        assert left["workers"][0]["shards"] == list(range(SHARDS))
        assert left["rates"] is None

        code, table = await status(mesh, "--interval", "0")
        assert code == 0, table
        assert "workers (1)" in table and "w1" in table and f"{SHARDS} shards" in table

        # --watch: a reading per interval (rates between consecutive ones) until interrupted
        watch = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "jetcrawl", "status", "--watch", "0.2", "--json"),
            env={**os.environ, **mesh.settings.to_env()},
            stdout=asyncio.subprocess.PIPE,
        )
        assert watch.stdout is not None
        async with asyncio.timeout(30):
            readings = [orjson.loads(await watch.stdout.readline()) for _ in range(2)]
            watch.send_signal(signal.SIGINT)
            assert await watch.wait() == 0
        for reading in readings:
            assert [w["id"] for w in reading["workers"]] == ["w1"]
            assert 0.2 <= reading["rates"]["interval_s"] < 5
        assert readings[0]["time"] < readings[1]["time"]
