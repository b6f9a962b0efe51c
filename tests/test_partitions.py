"""Real network partitions under a crawl: every server and service in a network namespace of its
own (tests/support/netns.py), links cut with blackhole routes while the crawl runs.

Three nats-server nodes (R3 streams), etcd, the dispatcher and three workers each have their own
address; the website is served by the test process on addresses of its own on the same bridge,
so its access log says which worker asked (the peer address) and when. Each scenario cuts one
link for ``CUT_S``, heals it, and lets the crawl drain; then (``verify``):

- the crawl drained in about the baseline's time (``Pace.floor_s``, the politeness floor of
  the largest host, doubled, plus the cut and a fixed slack for elections and redeliveries);
- the ledger shows lost 0, duplicates 0, and the results are exactly the site's reachable set;
- no page was requested twice: a result that could not be published was held, not re-fetched;
- no host heard from two workers less than the host delay apart (robots.txt aside: it is read
  once per origin per worker, outside politeness).

The cut itself is a timed wait (it is the fault); everything else waits on states.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from jetcrawl.contract.topology import TASKS_STREAM
from jetcrawl.contract.urls import shard_of
from jetcrawl.local.embedded import EtcdServer, NatsCluster
from jetcrawl.plumbing.bus import EXPIRY_CHECKS_PER_TIMEOUT, PUBLISH_TIMEOUT_S
from jetcrawl.registry import assign
from tests.support.ledger import Ledger
from tests.support.mesh import Mesh
from tests.support.netns import Network, Node
from tests.support.site import MultiHostSite, SiteRequest
from tests.support.streams import eventually
from tests.test_faults import FENCED, finish, stream_leader

HOSTS = 8


@dataclass(frozen=True, slots=True)
class Pace:
    """The site's size per host and the host delay a test crawls it at."""

    pages_per_host: int = 24
    host_delay_s: float = 0.4

    @property
    def floor_s(self) -> float:
        """The politeness floor: the largest host, one request per delay."""
        return self.pages_per_host * self.host_delay_s


# A handover after a lease expiry is ~0.5 s apart by itself (the fence margin, etcd's expiry
# check): at a 1 s delay only the new owner's wait keeps it polite.
SLOW = Pace(pages_per_host=12, host_delay_s=1.0)
SLACK_S = 20.0  # elections, a lease's expiry, AckWait and a reconnect after the heal
CUT_S = 6.0  # longer than AckWait and the lease TTL below
# A worker's publish gets no answer, and is tried again: a publish fails 1 to 1.25 timeouts after
# it went out (the outbox looks for overdue acks EXPIRY_CHECKS_PER_TIMEOUT times a timeout), and
# the cut starts before the held page is answered.
NATS_CUT_S = PUBLISH_TIMEOUT_S * (1 + 1 / EXPIRY_CHECKS_PER_TIMEOUT) + 2
ARRIVAL_JITTER_S = 0.05  # a request spaced by the delay at the worker may arrive a little early
WORKERS = ("w1", "w2", "w3")
SITE_SEED = 3030
START_WITHIN_S = 60.0  # four Python services starting at once on a busy 2-core machine
COPY_ACKED = "delivered again after its result was stored"  # a worker's log line

pytestmark = pytest.mark.timeout(150)


class Partitioned:
    """The mesh of this module: every process on its own node of ``net``."""

    def __init__(
        self, net: Network, mesh: Mesh, cluster: NatsCluster, site: MultiHostSite, pace: Pace
    ) -> None:
        self.pace = pace
        self.net = net
        self.mesh = mesh
        self.cluster = cluster
        self.site = site
        self.seeded_at = 0.0

    def node(self, name: str) -> Node:
        return self.net.nodes[name]

    @property
    def nats_nodes(self) -> list[Node]:
        return [self.node(str(s.server_name)) for s in self.cluster.servers]

    async def start_crawl(self, *workers: str) -> None:
        """The services (``workers``, or w1 to w3, on the nodes w1 to w3 in order), the seeds,
        and a quarter of the crawl."""
        await self.start_services(*(workers or WORKERS))
        self.seeded_at = time.monotonic()
        await self.mesh.seed(self.site.seeds)
        await self.mesh.wait_results(len(self.site.reachable) // 4)

    async def start_services(self, *workers: str) -> None:
        await self.mesh.start("dispatcher", "dispatcher", prefix=self.node("dispatcher").prefix)
        for node, name in zip(WORKERS, workers, strict=False):
            await self.mesh.start("worker", name, prefix=self.node(node).prefix)
        await self.mesh.wait_ownership(set(workers), within_s=START_WITHIN_S)

    async def cut_for(
        self,
        a: Node,
        *others: Node,
        seconds: float = CUT_S,
        on_cut: Callable[[], object] | None = None,
    ) -> None:
        """Cut ``a`` from ``others`` for ``seconds``; ``on_cut`` is called once the cut is in."""
        await self.net.cut(a, *others)
        try:
            if on_cut is not None:
                on_cut()
            await asyncio.sleep(seconds)  # the fault
        finally:
            await self.net.heal(a, *others)

    async def verify(self, cut_s: float = CUT_S, exited: frozenset[str] = frozenset()) -> Ledger:
        floor_s = self.pace.floor_s
        within_s = floor_s * 2 + cut_s + SLACK_S
        ledger = await finish(self.mesh, self.site, within_s=within_s, exited=exited)
        took_s = time.monotonic() - self.seeded_at
        print(f"drained {took_s:.1f} s after the seeds (politeness floor {floor_s:g} s)")
        print(f"closest requests to one host from two workers: {closest(self.site.requests)}")
        assert ledger.duplicates == 0, ledger.summary()
        assert twice(self.site.requests) == {}, "pages fetched again"
        too_soon = too_close(self.site.requests, self.pace.host_delay_s)
        assert too_soon == [], "two workers on one host"
        return ledger


def hosted_shards(p: Partitioned) -> set[int]:
    """The shards of the site's hosts (a function of their addresses)."""
    return {shard_of(host.split(":")[0], p.mesh.settings.shards) for host in p.site.hosts}


def leaving_name(p: Partitioned) -> str:
    """A worker id that, beside w1 and w2, owns the shards of at least two of the site's hosts
    (which shards it owns is a function of the ids)."""
    hosted = hosted_shards(p)
    for n in itertools.count(3):
        name = f"w{n}"
        owners = assign(p.mesh.settings.shards, ["w1", "w2", name])
        if len({s for s, owner in owners.items() if owner == name} & hosted) >= 2:
            return name
    raise AssertionError("unreachable")


def hosting_worker(p: Partitioned) -> str:
    """One of ``WORKERS`` that owns the shard of one of the site's hosts, w3 if it does."""
    owners = assign(p.mesh.settings.shards, list(WORKERS))
    hosting = {owners[s] for s in hosted_shards(p)}
    return next(w for w in reversed(WORKERS) if w in hosting)


def moved_hosts(p: Partitioned) -> set[str]:
    """The site's hosts that more than one worker asked for pages."""
    peers: dict[str, set[str]] = defaultdict(set)
    for request in pages(p.site.requests):
        peers[request.url.split("/")[2]].add(request.peer)
    return {host for host, asked in peers.items() if len(asked) > 1}


def pages(requests: list[SiteRequest]) -> list[SiteRequest]:
    return [r for r in requests if not r.url.endswith("/robots.txt")]


def by_host(requests: list[SiteRequest]) -> dict[str, list[SiteRequest]]:
    """Page requests per host, in the order they arrived."""
    hosts: dict[str, list[SiteRequest]] = defaultdict(list)
    for request in sorted(pages(requests), key=lambda r: r.at):
        hosts[request.url.split("/")[2]].append(request)
    return hosts


def twice(requests: list[SiteRequest]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for request in pages(requests):
        counts[request.url] += 1
    return {url: n for url, n in counts.items() if n > 1}


def too_close(requests: list[SiteRequest], delay_s: float) -> list[str]:
    """Requests to one host from two peers less than ``delay_s`` apart, as lines to read."""
    close = []
    for host, asked in by_host(requests).items():
        for before, after in itertools.pairwise(asked):
            gap = after.at - before.at
            if before.peer != after.peer and gap < delay_s - ARRIVAL_JITTER_S:
                close.append(f"{host}: {before.peer} then {after.peer} {gap:.3f} s apart")
    return close


def closest(requests: list[SiteRequest]) -> str:
    """The shortest gap between two peers' requests to one host, as a line to read."""
    gaps = [
        (after.at - before.at, host, before.peer, after.peer)
        for host, asked in by_host(requests).items()
        for before, after in itertools.pairwise(asked)
        if before.peer != after.peer
    ]
    if not gaps:
        return "no host changed hands"
    gap, host, before, after = min(gaps)
    return f"{gap:.3f} s ({host}: {before} then {after})"


def test_the_access_log_checks_catch_what_they_look_for() -> None:
    """The negative case of ``verify``'s checks: a page asked twice, two peers too close."""
    log = [
        SiteRequest("GET", "http://h:1/robots.txt", 200, 0.0, "10.0.0.2"),
        SiteRequest("GET", "http://h:1/a", 200, 0.01, "10.0.0.2"),
        SiteRequest("GET", "http://h:1/b", 200, 0.2, "10.0.0.3"),
        SiteRequest("GET", "http://h:1/a", 200, 1.0, "10.0.0.3"),
    ]
    assert twice(log) == {"http://h:1/a": 2}
    assert too_close(log, 0.4) == ["h:1: 10.0.0.2 then 10.0.0.3 0.190 s apart"]
    assert too_close(log[:2] + log[3:], 0.4) == []


@pytest.fixture
async def net() -> AsyncIterator[Network]:
    async with Network() as network:
        for name in ("n1", "n2", "n3", "etcd", "dispatcher", *WORKERS):
            await network.node(name)
        yield network


@pytest.fixture
def pace() -> Pace:
    return Pace()


@pytest.fixture
async def partitioned(net: Network, pace: Pace, tmp_path: Path) -> AsyncIterator[Partitioned]:
    nats_nodes = [net.nodes[n] for n in ("n1", "n2", "n3")]
    etcd_node = net.nodes["etcd"]
    addresses = [await net.address() for _ in range(HOSTS)]
    assert net.subnet is not None
    async with (
        NatsCluster(
            tmp_path / "cluster",
            hosts=[n.address for n in nats_nodes],
            prefixes=[n.prefix for n in nats_nodes],
        ) as cluster,
        EtcdServer(tmp_path / "etcd", host=etcd_node.address, prefix=etcd_node.prefix) as etcd,
        Mesh(
            ",".join(cluster.urls),
            etcd.url,
            tmp_path,
            replicas=3,
            host_delay_s=pace.host_delay_s,
            allow_nets=(str(net.subnet),),
            lease_ttl_s=3.0,
            ack_wait_s=4.0,
        ) as mesh,
        MultiHostSite(SITE_SEED, HOSTS, pace.pages_per_host, addresses=addresses) as site,
    ):
        yield Partitioned(net, mesh, cluster, site, pace)


async def test_baseline_without_a_cut(partitioned: Partitioned) -> None:
    await partitioned.start_crawl()
    await partitioned.verify(cut_s=0.0)


async def test_a_worker_leaving_mid_crawl_hands_its_hosts_over_without_rushing_them(
    partitioned: Partitioned,
) -> None:
    """A graceful handover: the leaver drains and releases its shards, and each new owner
    waits a host delay from taking a shard before asking its hosts."""
    p = partitioned
    leaver = leaving_name(p)
    await p.start_crawl("w1", "w2", leaver)
    p.mesh.services[leaver].signal(signal.SIGTERM)
    assert await p.mesh.services[leaver].wait() == 0
    await p.verify(cut_s=0.0, exited=frozenset({leaver}))
    assert moved_hosts(p), "no host changed hands mid-crawl: the check above checked nothing"


async def test_a_worker_cut_from_nats_holds_its_results_and_fetches_nothing_twice(
    partitioned: Partitioned,
) -> None:
    p = partitioned
    await p.start_crawl()
    name = hosting_worker(p)
    cut = p.node(name)
    held = p.site.hold(cut.address)  # a page it fetches, answered once the cut is in place
    async with asyncio.timeout(p.pace.floor_s):
        await held.arrived.wait()
    # once the cut is in, its result is published into it
    await p.cut_for(cut, *p.nats_nodes, seconds=NATS_CUT_S, on_cut=held.release)
    await p.verify(NATS_CUT_S)
    # The cut did what it does: the worker's publishes went unanswered. Its tasks outlived
    # AckWait (its in-progress acks did not get through either); whether JetStream delivered
    # one again before its ack arrived depends on the order the healed link delivers them in,
    # but none was fetched again (verify).
    log = p.mesh.services[name].log()
    assert "publishing crawl." in log, f"no publish failed ({held.url} was held)"
    print(f"copies acked unfetched: {log.count(COPY_ACKED)}")


@pytest.mark.parametrize("pace", [SLOW])
async def test_a_worker_cut_from_etcd_stops_fetching_before_its_shards_move(
    partitioned: Partitioned,
) -> None:
    p = partitioned
    await p.start_crawl()
    cut = p.node("w3")
    await p.net.cut(cut, p.node("etcd"))
    try:

        async def moved() -> bool:  # the lease expired and the others took the shards
            return "w3" not in (await p.mesh.ownership()).values()

        await eventually(moved, within_s=p.mesh.settings.lease_ttl_s + CUT_S)
        assert FENCED in p.mesh.services["w3"].log()
    finally:
        await p.net.heal(cut, p.node("etcd"))
    await p.mesh.wait_ownership(set(WORKERS), within_s=30)  # it rejoined
    await p.verify()


async def test_one_nats_node_cut_from_the_other_two(partitioned: Partitioned) -> None:
    p = partitioned
    await p.start_crawl()
    leader = await stream_leader(p.mesh, p.cluster, TASKS_STREAM)
    isolated = p.node(str(leader.server_name))
    await p.cut_for(isolated, *(n for n in p.nats_nodes if n != isolated))
    await p.verify()


async def test_the_dispatcher_cut_from_nats(partitioned: Partitioned) -> None:
    p = partitioned
    await p.start_crawl()
    await p.cut_for(p.node("dispatcher"), *p.nats_nodes)
    await p.verify()
