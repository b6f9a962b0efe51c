"""The services' /metrics, /healthz and /readyz, scraped from real processes during a crawl."""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import aiohttp
import pytest

from jetcrawl.contract.topology import FRONTIER_STREAM
from jetcrawl.local.embedded import EtcdServer, NatsServer
from jetcrawl.plumbing.metrics import WorkerMetrics, status_class
from tests.support.mesh import Mesh
from tests.support.scrape import Samples, free_port, probe, scrape
from tests.support.site import MultiHostSite
from tests.support.streams import eventually

WORKERS = ("w1", "w2")


@pytest.fixture
async def mid_site() -> AsyncIterator[MultiHostSite]:
    """Big enough that the crawl is still running when it is first scraped."""
    async with MultiHostSite(seed=11, hosts=4, pages_per_host=60) as site:
        yield site


async def ready(port: int) -> bool:
    try:
        status, _ = await probe(port, "/readyz")
    except aiohttp.ClientConnectionError:
        return False  # not listening yet
    return status == 200


async def test_metrics_and_health_follow_the_crawl(
    nats_server: NatsServer, etcd_server: EtcdServer, tmp_path: Path, mid_site: MultiHostSite
) -> None:
    ports = {name: free_port() for name in ("dispatcher", *WORKERS)}
    async with Mesh(nats_server.url, etcd_server.url, tmp_path) as mesh:
        services = [
            await mesh.start(
                "dispatcher" if name == "dispatcher" else "worker",
                name,
                JETCRAWL_METRICS_PORT=str(port),
            )
            for name, port in ports.items()
        ]
        for name, port in ports.items():
            await eventually(partial(ready, port), within_s=20)
            assert await probe(port, "/healthz") == (200, {}), name
        ownership = await mesh.wait_ownership(set(WORKERS))
        _, doc = await probe(ports["w1"], "/readyz")
        assert doc == {"ready": True, "checks": {"nats": "ok", "etcd": "ok"}}
        _, doc = await probe(ports["dispatcher"], "/readyz")
        assert doc == {"ready": True, "checks": {"nats": "ok"}}

        # During the crawl: pages are counted after the result is stored and the task acked.
        await mesh.seed(mid_site.seeds)
        await mesh.wait_results(len(mid_site.reachable) // 4)
        stored_before = await mesh.result_count()
        during = {name: await scrape(ports[name]) for name in WORKERS}
        stored_after = await mesh.result_count()
        pages = sum(s.total("jetcrawl_pages_total") for s in during.values())
        held_max = mesh.settings.holding  # tasks a worker holds
        assert pages <= stored_after
        assert pages >= stored_before - held_max * len(WORKERS)
        for name, samples in during.items():
            owned = sum(1 for owner in ownership.values() if owner == name)
            assert samples.get("jetcrawl_owned_shards") == owned
            assert 0 <= samples.get("jetcrawl_tasks_in_flight") <= held_max
            assert 0 <= samples.get("jetcrawl_fetches_in_flight") <= mesh.settings.concurrency

        # After the drain: every number matches the crawl's records.
        snapshot = await mesh.wait_drained()
        results = await mesh.results()
        after = {name: await scrape(ports[name]) for name in WORKERS}
        dispatcher = await scrape(ports["dispatcher"])
        frontier_messages = (await mesh.js.stream_info(FRONTIER_STREAM)).state.last_seq
        for service in services:
            service.signal(signal.SIGTERM)
        for service in services:
            assert await service.wait() == 0, service.log()

    assert sum(s.total("jetcrawl_pages_total") for s in after.values()) == len(results)
    for name, samples in after.items():
        mine = [r for r in results if r.worker == name]
        assert mine, f"{name} crawled something"
        expected = Counter(
            (r.outcome, status_class(r.status) if r.outcome == "fetched" else "none") for r in mine
        )
        assert _pages(samples) == expected
        assert samples.get("jetcrawl_fetched_bytes_total") == sum(r.length for r in mine)
        fetched = sum(r.outcome == "fetched" for r in mine)
        assert samples.get("jetcrawl_fetch_duration_seconds_count") == fetched
        assert samples.get("jetcrawl_politeness_wait_seconds_count") == fetched
        disallowed = sum(r.outcome == "robots_disallowed" for r in mine)
        assert samples.get("jetcrawl_robots_denials_total") == disallowed > 0
        assert samples.get("jetcrawl_task_retries_total") == 0
        assert samples.get("jetcrawl_dead_letters_total") == 0
        assert samples.get("jetcrawl_tasks_in_flight") == 0
        assert samples.get("jetcrawl_fetches_in_flight") == 0
        assert samples.get(
            "jetcrawl_build_info", service="jetcrawl-worker", version="0.1.0", instance=name
        )

    # a link repeated on a worker's pages is sent once (worker/sent.py); pages here repeat theirs
    assert sum(s.get("jetcrawl_links_sent_before_total") for s in after.values()) > 0
    assert dispatcher.get("jetcrawl_urls_admitted_total") == len(results)
    assert dispatcher.get("jetcrawl_frontier_backlog") == 0
    assert dispatcher.get("jetcrawl_dead_letters_total") == snapshot.dead == 0
    # every message the frontier stream ever held (the seeds, each page's links) once
    assert dispatcher.get("jetcrawl_frontier_messages_total") == frontier_messages > 1
    assert dispatcher.get("jetcrawl_urls_rejected_total", reason="duplicate") > 0


def _pages(samples: Samples) -> Counter[tuple[str, str]]:
    out: Counter[tuple[str, str]] = Counter()
    for (name, labels), value in samples.values.items():
        if name == "jetcrawl_pages_total" and value:
            out[(dict(labels)["outcome"], dict(labels)["status_class"])] = int(value)
    return out


def test_failures_are_counted_by_their_cause() -> None:
    metrics = WorkerMetrics("jetcrawl-worker", "0.1.0", "w1")
    for kind in ("dns", "refused", "dns"):
        metrics.failure(kind)
    sample = metrics.registry.get_sample_value
    assert sample("jetcrawl_fetch_failures_total", {"kind": "dns"}) == 2
    assert sample("jetcrawl_fetch_failures_total", {"kind": "refused"}) == 1
    assert sample("jetcrawl_fetch_failures_total", {"kind": "tls"}) is None
