"""``jetcrawl status --job NAME`` and the jobs part of ``jetcrawl status``, against real etcd and
nats-server: backlogs from CRAWL_TASKS' lanes, states from KV crawl_control, activity from the
workers' reports; no result is read (there is none)."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import orjson
from nats.js import JetStreamContext

from jetcrawl.contract.messages import JobActivity, WorkerReport
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import RESULTS_STREAM, WORKERS_BUCKET, task_subject
from jetcrawl.local.embedded import EtcdServer, NatsServer
from jetcrawl.plumbing.control import ControlStore
from jetcrawl.plumbing.topology import ensure
from jetcrawl.registry.etcd import Etcd
from jetcrawl.registry.keys import Keys
from jetcrawl.registry.records import WorkerInfo

SHARDS = 4


async def status(settings: Settings, *flags: str) -> tuple[int, str, str]:
    where = ("--nats", settings.nats_url, "--etcd", settings.etcd_url, "--shards", str(SHARDS))
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "jetcrawl", "status", "--interval", "0", *where, *flags),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(30):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def status_json(settings: Settings, *flags: str) -> dict[str, Any]:
    code, out, err = await status(settings, "--json", *flags)
    assert code == 0, err
    doc = orjson.loads(out)
    assert isinstance(doc, dict)
    return doc


async def join(settings: Settings, worker: str) -> None:
    """A live worker as etcd shows it (its record under a lease, as the registry writes it)."""
    async with Etcd.from_settings(settings) as etcd:
        lease = await etcd.grant_lease(60)
        info = WorkerInfo.local(worker, capacity=8)
        await etcd.put(Keys(settings.cluster).worker(worker), info.to_wire(), lease)


async def report(js: JetStreamContext, worker: str, **jobs: JobActivity) -> None:
    """A worker's report in KV crawl_workers, as worker/report.py writes it."""
    kv = await js.key_value(WORKERS_BUCKET)
    wire = WorkerReport(worker, time.time(), 0, 0, 0, 0, None, jobs=jobs).to_wire()
    await kv.put(worker, wire)


async def test_status_of_one_job_sums_its_lanes_and_the_workers_reports(
    nats_server: NatsServer, etcd_server: EtcdServer, js: JetStreamContext
) -> None:
    settings = Settings(nats_url=nats_server.url, etcd_url=etcd_server.url, shards=SHARDS)
    await ensure(js, settings)
    for shard, level, job, count in [
        (0, 0, "news", 2),
        (2, 0, "news", 1),
        (2, 3, "news", 4),
        (1, 2, "shop", 5),
    ]:
        for i in range(count):
            await js.publish(task_subject(shard, level, job), f"{job}-{shard}-{level}-{i}".encode())
    await join(settings, "w1")
    await report(js, "w1", news=JobActivity(10, 1, 2.5), shop=JobActivity(3, 0, 1.0))
    await report(js, "gone", news=JobActivity(4, 2, 9.0, settled=1))  # left etcd: no rate
    await (await ControlStore.open(js)).change("news", "paused", "ops@console")

    doc = await status_json(settings, "--job", "news")
    job = doc["job"]
    assert job["backlog"] == {"queued": 7, "levels": [3, 0, 0, 4], "shards": {"0": 2, "2": 5}}
    assert (job["state"], job["by"], job["purged"]) == ("paused", "ops@console", 0)
    assert time.time() - 60 < job["since"] <= time.time()
    assert job["pages_per_s"] == 2.5, "only live workers' rates"
    assert (job["pages"], job["errors"], job["settled"], job["reports"]) == (14, 3, 1, 2)
    assert doc["results"] == 0 == (await js.stream_info(RESULTS_STREAM)).state.messages

    # the whole mesh: every lane counted on its shard, and the paused job listed
    assert doc["tasks"]["queued"] == 12 and doc["tasks"]["levels"] == [3, 0, 5, 4]
    assert [s["queued"] for s in doc["shards"]] == [2, 5, 5, 0]
    assert doc["shards"][2]["levels"] == [1, 0, 0, 4]
    assert doc["jobs"]["news"]["state"] == "paused" and "shop" not in doc["jobs"]

    code, table, _ = await status(settings, "--job", "news")
    assert code == 0
    assert "tasks         queued 12 (P0 3, P2 5, P3 4)" in table, table
    assert "job news  paused since " in table and " by ops@console" in table
    assert "backlog   7 queued (P0 3, P3 4)  shards 0: 2, 2: 5" in table
    assert "rate      2.5 pages/s  pages 14  errors 3  settled 1" in table

    # a job with no record runs; one with nothing queued shows 0
    shop = (await status_json(settings, "--job", "shop"))["job"]
    assert (shop["state"], shop["since"], shop["backlog"]["queued"]) == ("running", None, 5)
    assert shop["pages_per_s"] == 1.0 and shop["pages"] == 3


async def test_status_lists_jobs_only_when_one_is_not_running(
    nats_server: NatsServer, etcd_server: EtcdServer, js: JetStreamContext
) -> None:
    settings = Settings(nats_url=nats_server.url, etcd_url=etcd_server.url, shards=SHARDS)
    await ensure(js, settings)
    await js.publish(task_subject(1, 2, "news"), b"a task")
    code, table, _ = await status(settings)
    assert code == 0 and "job " not in table, "every job runs: no job lines"
    assert "tasks         queued 1 (P2 1)" in table

    store = await ControlStore.open(js)
    await store.change("news", "paused", "ops@console")
    await store.change("news", "running", "ops@console")
    await store.change("shop", "cancelled", "ops@console")
    code, table, _ = await status(settings)
    assert code == 0 and "job shop  cancelled since " in table and "job news" not in table


async def test_status_of_an_unknown_job_exits_2_naming_it(
    nats_server: NatsServer, etcd_server: EtcdServer, js: JetStreamContext
) -> None:
    settings = Settings(nats_url=nats_server.url, etcd_url=etcd_server.url, shards=SHARDS)
    await ensure(js, settings)
    await js.publish(task_subject(0, 2, "news"), b"a task")
    code, out, err = await status(settings, "--job", "nwes")
    assert (code, out) == (2, "")
    assert err.startswith("jetcrawl: no job 'nwes'") and "jetcrawl job list" in err
    assert err.count("\n") == 1
    code, _, err = await status(settings, "--job", "news")  # the negative: it is known
    assert code == 0, err
    # a job seeded without a spec that has finished is known by the workers' reports
    assert (await status(settings, "--job", "seeded"))[0] == 2
    await report(js, "w1", seeded=JobActivity(3, 0, 0.0))
    code, out, err = await status(settings, "--job", "seeded", "--json")
    assert code == 0, err
    assert orjson.loads(out)["job"]["pages"] == 3
