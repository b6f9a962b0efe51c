"""The spec store and the services' watch on KV crawl_specs, against a real nats-server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from jetcrawl.contract.jobs import JobSpec
from jetcrawl.contract.settings import Settings
from jetcrawl.local.embedded import NatsServer
from jetcrawl.plumbing.bus import connect
from jetcrawl.plumbing.specs import SpecStore, SpecWatch, UnknownJob
from jetcrawl.plumbing.topology import ensure


async def test_puts_race_to_one_version_each_and_the_watch_sees_the_latest(
    nats_server: NatsServer,
) -> None:
    settings = Settings(nats_url=nats_server.url, shards=4)
    nc = await connect(settings, "test")
    try:
        js = nc.jetstream()
        await ensure(js, settings)
        store = await SpecStore.open(js)
        specs = [JobSpec.read({"name": "shop", "max_depth": depth}) for depth in range(6)]
        outcomes = await asyncio.gather(*(store.put(spec) for spec in specs))
        assert sorted(o.stored.version for o in outcomes) == [1, 2, 3, 4, 5, 6]
        assert [s.version for s in await store.history("shop")] == [1, 2, 3, 4, 5, 6]

        stopping = asyncio.Event()
        watch = SpecWatch(js)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(watch.run(stopping))
            async with asyncio.timeout(10):
                await watch.wait_ready()
            latest = watch.current("shop")
            assert latest is not None and latest.version == 6
            assert watch.current("other") is None
            stopping.set()
        with pytest.raises(UnknownJob):
            await store.get("other")
    finally:
        await nc.close()


async def test_the_watch_outlives_a_server_restart_and_sees_the_specs_put_after(
    tmp_path: Path,
) -> None:
    async with NatsServer(tmp_path / "nats") as server:
        settings = Settings(nats_url=server.url, shards=4, nats_ping_interval_s=0.5)
        service = await connect(settings, "service")  # reconnects forever, as services do
        admin = await connect(settings, "admin")
        stopping = asyncio.Event()
        try:
            await ensure(admin.jetstream(), settings)
            store = await SpecStore.open(admin.jetstream())
            await store.put(JobSpec.read({"name": "shop", "max_depth": 1}))
            watch = SpecWatch(service.jetstream())
            async with asyncio.TaskGroup() as tg:
                tg.create_task(watch.run(stopping))
                async with asyncio.timeout(10):
                    await watch.wait_version("shop", 1)
                await server.stop()
                await server.start()
                await store.put(JobSpec.read({"name": "shop", "max_depth": 2}))
                async with asyncio.timeout(30):
                    await watch.wait_version("shop", 2)
                stopping.set()
        finally:
            stopping.set()
            await service.close()
            await admin.close()
