"""The soak: a five-minute crawl under random faults, then the ledger. Opt-in (``-m soak``).

A 3-node JetStream cluster with R3 streams, etcd, one dispatcher and three workers crawl a site
slowed by politeness so that it outlasts ``SOAK_S``. Every 20-40 s (drawn from ``SOAK_SEED``) one
fault is injected and healed: a worker or the dispatcher killed with SIGKILL and replaced, a
worker stopped past its lease and continued, the task stream's leader killed and restarted, two
of three servers down for ``LONG_OUTAGE_S`` (no quorum), etcd down for ``LONG_OUTAGE_S``. Then
the crawl must finish with every admitted URL holding exactly one result::

    .venv/bin/pytest -m soak -n 0 -s tests/test_soak.py    # prints the fault log and the ledger
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from collections.abc import AsyncIterator
from itertools import count
from pathlib import Path

import pytest

from jetcrawl.contract.topology import TASKS_STREAM
from jetcrawl.local.embedded import EtcdServer, NatsCluster
from tests.support.mesh import Mesh
from tests.support.site import MultiHostSite
from tests.test_faults import finish, stream_leader

SOAK_SEED = 20261129
SOAK_S = 300.0
FAULT_EVERY_S = (20.0, 40.0)
LONG_OUTAGE_S = 20.0
LEADER_DOWN_S = 8.0

pytestmark = [pytest.mark.soak, pytest.mark.timeout(SOAK_S + 600)]


@pytest.fixture
async def mesh(
    nats_cluster: NatsCluster, etcd_server: EtcdServer, tmp_path: Path
) -> AsyncIterator[Mesh]:
    urls = ",".join(nats_cluster.urls)
    # ~2,400 pages over 6 hosts at 0.6 s per host: about 240 s of crawling before any fault.
    async with Mesh(urls, etcd_server.url, tmp_path, replicas=3, host_delay_s=0.6) as started:
        yield started


@pytest.fixture
async def slow_site() -> AsyncIterator[MultiHostSite]:
    async with MultiHostSite(seed=SOAK_SEED, hosts=6, pages_per_host=400) as site:
        yield site


class Chaos:
    """The fault menu over one mesh; keeps three workers and one dispatcher running."""

    def __init__(
        self, mesh: Mesh, cluster: NatsCluster, etcd: EtcdServer, rng: random.Random
    ) -> None:
        self.mesh = mesh
        self.cluster = cluster
        self.etcd = etcd
        self.rng = rng
        self.workers = ["w1", "w2", "w3"]
        self.dispatcher = "dispatcher"
        self.dead: set[str] = set()  # services killed on purpose
        self._names = count(len(self.workers) + 1)  # w4, w5, ...
        self.started = time.monotonic()

    def note(self, what: str) -> None:
        print(f"[{time.monotonic() - self.started:6.1f} s] {what}", flush=True)

    async def inject(self) -> None:
        fault = self.rng.choice(
            [
                self.kill_worker,
                self.stop_worker,
                self.kill_dispatcher,
                self.kill_leader,
                self.lose_quorum,
                self.etcd_down,
            ]
        )
        await fault()

    async def kill_worker(self) -> None:
        victim = self.rng.choice(self.workers)
        await self._kill(victim)
        replacement = f"w{next(self._names)}"
        self.workers[self.workers.index(victim)] = replacement
        await self.mesh.start("worker", replacement)
        self.note(f"kill -9 worker {victim}, started {replacement}")

    async def stop_worker(self) -> None:
        victim = self.mesh.services[self.rng.choice(self.workers)]
        victim.signal(signal.SIGSTOP)
        await asyncio.sleep(self.mesh.settings.lease_ttl_s + 2)  # the fault: past its lease
        victim.signal(signal.SIGCONT)
        self.note(f"SIGSTOP worker {victim.name} past its lease, SIGCONT")

    async def kill_dispatcher(self) -> None:
        await self._kill(self.dispatcher)
        self.dispatcher = f"dispatcher{next(self._names)}"
        await self.mesh.start("dispatcher", self.dispatcher)
        self.note("kill -9 the dispatcher, started another")

    async def kill_leader(self) -> None:
        leader = await stream_leader(self.mesh, self.cluster, TASKS_STREAM)
        await leader.kill()
        await asyncio.sleep(LEADER_DOWN_S)  # the fault
        await leader.start()
        self.note(f"kill -9 {TASKS_STREAM} leader {leader.server_name}, restarted")

    async def lose_quorum(self) -> None:
        down = self.rng.sample(self.cluster.servers, 2)
        await asyncio.gather(*(s.kill() for s in down))
        await asyncio.sleep(LONG_OUTAGE_S)  # the fault
        await asyncio.gather(*(s.start() for s in down))
        self.note(
            f"no quorum: {', '.join(str(s.server_name) for s in down)} down for {LONG_OUTAGE_S:g} s"
        )

    async def etcd_down(self) -> None:
        await self.etcd.stop()
        await asyncio.sleep(LONG_OUTAGE_S)  # the fault
        await self.etcd.start()
        self.note(f"etcd down for {LONG_OUTAGE_S:g} s")

    async def _kill(self, name: str) -> None:
        service = self.mesh.services[name]
        service.signal(signal.SIGKILL)
        await service.wait()
        self.dead.add(name)


async def test_a_five_minute_crawl_under_random_faults_loses_nothing(
    mesh: Mesh, nats_cluster: NatsCluster, etcd_server: EtcdServer, slow_site: MultiHostSite
) -> None:
    await mesh.start("dispatcher", "dispatcher")
    for name in ("w1", "w2", "w3"):
        await mesh.start("worker", name)
    await mesh.wait_ownership({"w1", "w2", "w3"})
    await mesh.seed(slow_site.seeds)

    chaos = Chaos(mesh, nats_cluster, etcd_server, random.Random(SOAK_SEED))
    deadline = chaos.started + SOAK_S
    while (now := time.monotonic()) < deadline:
        await asyncio.sleep(min(chaos.rng.uniform(*FAULT_EVERY_S), deadline - now))  # the pace
        if time.monotonic() < deadline:
            await chaos.inject()

    chaos.note("faults over; waiting for the crawl to finish")
    ledger = await finish(mesh, slow_site, within_s=600, exited=frozenset(chaos.dead))
    chaos.note("crawl finished, ledger checked")
    assert ledger.duplicates == 0, ledger.summary()
