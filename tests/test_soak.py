"""The soak: a five-minute crawl under random faults, then the ledger. Opt-in (``-m soak``).

A 3-node JetStream cluster with R3 streams, etcd, one dispatcher and three workers crawl a site
slowed by politeness so that it outlasts ``SOAK_S``; each process runs in a network namespace of
its own (tests/support/netns.py, as in tests/test_partitions.py). Every 20-40 s (drawn from
``SOAK_SEED``) one fault is injected and healed: a worker or the dispatcher killed with SIGKILL
and replaced, a worker stopped past its lease and continued, the task stream's leader killed and
restarted, two of three servers down for ``LONG_OUTAGE_S`` (no quorum), etcd down for
``LONG_OUTAGE_S``, a network cut for ``LONG_OUTAGE_S`` (a worker from NATS or from etcd, a NATS
node from the other two, the dispatcher from NATS). Then the crawl must finish with every
admitted URL holding exactly one result::

    .venv/bin/pytest -m soak -n 0 -s tests/test_soak.py    # prints the fault log and the ledger
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from itertools import count
from pathlib import Path

import pytest

from jetcrawl.contract.topology import TASKS_STREAM
from jetcrawl.local.embedded import EtcdServer, NatsCluster
from tests.support.mesh import Mesh, Service
from tests.support.netns import Network, Node
from tests.support.site import MultiHostSite
from tests.test_faults import finish, stream_leader

SOAK_SEED = 20261129
SOAK_S = 300.0
FAULT_EVERY_S = (20.0, 40.0)
LONG_OUTAGE_S = 20.0
LEADER_DOWN_S = 8.0

pytestmark = [pytest.mark.soak, pytest.mark.timeout(SOAK_S + 600)]


SITE_HOSTS = 6


@dataclass(slots=True)
class Soaked:
    net: Network
    cluster: NatsCluster
    etcd: EtcdServer
    mesh: Mesh
    site: MultiHostSite


@pytest.fixture
async def soaked(tmp_path: Path) -> AsyncIterator[Soaked]:
    async with Network() as net:
        nats_nodes = [await net.node(name) for name in ("n1", "n2", "n3")]
        etcd_node = await net.node("etcd")
        addresses = [await net.address() for _ in range(SITE_HOSTS)]
        async with (
            NatsCluster(
                tmp_path / "cluster",
                hosts=[n.address for n in nats_nodes],
                prefixes=[n.prefix for n in nats_nodes],
            ) as cluster,
            EtcdServer(tmp_path / "etcd", host=etcd_node.address, prefix=etcd_node.prefix) as etcd,
            # ~2,400 pages over 6 hosts at 0.6 s per host: about 240 s of crawling before any
            # fault. A task waits minutes for its host here, through several faults, and each
            # can cost it a delivery that is no attempt (a hand-back when its worker is fenced or
            # loses its shard, a redelivery after AckWait while a link is cut): more deliveries
            # than the default 3 attempts, so that they do not make it poison.
            Mesh(
                ",".join(cluster.urls),
                etcd.url,
                tmp_path,
                replicas=3,
                host_delay_s=0.6,
                allow_nets=(str(net.subnet),),
                task_max_deliver=6,
            ) as mesh,
            MultiHostSite(SOAK_SEED, SITE_HOSTS, 400, addresses=addresses) as site,
        ):
            yield Soaked(net, cluster, etcd, mesh, site)


class Chaos:
    """The fault menu over one mesh; keeps three workers and one dispatcher running."""

    def __init__(self, soaked: Soaked, rng: random.Random) -> None:
        self.net = soaked.net
        self.mesh = soaked.mesh
        self.cluster = soaked.cluster
        self.etcd = soaked.etcd
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
                self.cut,
            ]
        )
        await fault()

    async def start(self, role: str, name: str) -> Service:
        """``jetcrawl ROLE`` as ``name``, on a node of its own."""
        node = self.net.nodes.get(name) or await self.net.node(name)
        return await self.mesh.start(role, name, prefix=node.prefix)

    async def kill_worker(self) -> None:
        victim = self.rng.choice(self.workers)
        await self._kill(victim)
        replacement = f"w{next(self._names)}"
        self.workers[self.workers.index(victim)] = replacement
        await self.start("worker", replacement)
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
        await self.start("dispatcher", self.dispatcher)
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

    async def cut(self) -> None:
        nats = [self.net.nodes[str(s.server_name)] for s in self.cluster.servers]
        worker = self.net.nodes[self.rng.choice(self.workers)]
        isolated = self.rng.choice(nats)
        cuts: list[tuple[str, Node, list[Node]]] = [
            (f"worker {worker.name} from NATS", worker, nats),
            (f"worker {worker.name} from etcd", worker, [self.net.nodes["etcd"]]),
            (f"{isolated.name} from the other nodes", isolated, [n for n in nats if n != isolated]),
            ("the dispatcher from NATS", self.net.nodes[self.dispatcher], nats),
        ]
        what, node, others = self.rng.choice(cuts)
        await self.net.cut(node, *others)
        try:
            await asyncio.sleep(LONG_OUTAGE_S)  # the fault
        finally:
            await self.net.heal(node, *others)
        self.note(f"cut {what} for {LONG_OUTAGE_S:g} s")

    async def _kill(self, name: str) -> None:
        service = self.mesh.services[name]
        service.signal(signal.SIGKILL)
        await service.wait()
        self.dead.add(name)


async def test_a_five_minute_crawl_under_random_faults_loses_nothing(soaked: Soaked) -> None:
    mesh, slow_site = soaked.mesh, soaked.site
    chaos = Chaos(soaked, random.Random(SOAK_SEED))
    await chaos.start("dispatcher", "dispatcher")
    for name in ("w1", "w2", "w3"):
        await chaos.start("worker", name)
    await mesh.wait_ownership({"w1", "w2", "w3"}, within_s=60)
    await mesh.seed(slow_site.seeds)

    chaos.started = time.monotonic()
    deadline = chaos.started + SOAK_S
    while (now := time.monotonic()) < deadline:
        await asyncio.sleep(min(chaos.rng.uniform(*FAULT_EVERY_S), deadline - now))  # the pace
        if time.monotonic() < deadline:
            await chaos.inject()

    chaos.note("faults over; waiting for the crawl to finish")
    ledger = await finish(mesh, slow_site, within_s=600, exited=frozenset(chaos.dead))
    chaos.note("crawl finished, ledger checked")
    assert ledger.duplicates == 0, ledger.summary()
