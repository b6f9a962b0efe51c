"""The service endpoint in process: liveness, readiness against a real nats-server, metrics."""

from __future__ import annotations

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from jetcrawl.contract.settings import Settings
from jetcrawl.plumbing.endpoint import Endpoint
from jetcrawl.plumbing.health import Readiness, nats_ready
from jetcrawl.plumbing.metrics import DispatcherMetrics, WorkerMetrics
from jetcrawl.plumbing.topology import ensure
from tests.support.scrape import free_port, probe, scrape


async def test_alive_at_once_ready_only_when_every_check_passes(
    nc: NATS, js: JetStreamContext
) -> None:
    settings = Settings(nats_url="unused", shards=4)
    readiness = Readiness()
    port = free_port()
    async with Endpoint(port, DispatcherMetrics("d", "1", "i").registry, readiness, "127.0.0.1"):
        assert (await probe(port, "/healthz"))[0] == 200
        assert await probe(port, "/readyz") == (
            503,
            {"ready": False, "checks": {"service": "starting"}},
        )

        readiness.add("nats", nats_ready(nc, settings))
        status, doc = await probe(port, "/readyz")
        assert status == 503, "no topology yet"
        assert str(doc["checks"]["nats"]).startswith("topology:")  # type: ignore[index]

        await ensure(js, settings.replace(shards=8))
        status, doc = await probe(port, "/readyz")
        assert status == 503
        assert doc["checks"] == {"nats": "topology: CRAWL_TASKS has 8 shards, this service 4"}

        await js.delete_stream("CRAWL_TASKS")
        await ensure(js, settings)
        assert await probe(port, "/readyz") == (200, {"ready": True, "checks": {"nats": "ok"}})

        await nc.close()
        assert await probe(port, "/readyz") == (
            503,
            {"ready": False, "checks": {"nats": "nats: not connected"}},
        )
        assert (await probe(port, "/healthz"))[0] == 200, "not ready is still alive"


async def test_metrics_are_the_service_registry_in_prometheus_text() -> None:
    metrics = WorkerMetrics("jetcrawl-worker", "0.1.0", "w1")
    other = WorkerMetrics("jetcrawl-worker", "0.1.0", "w2")  # a registry each: no collision
    metrics.page("fetched", 200, 1000)
    metrics.page("fetched", 404, 10)
    metrics.page("robots_disallowed", None, 0)
    other.page("failed", None, 0)
    metrics.fetch_seconds.observe(0.02)
    port = free_port()
    async with Endpoint(port, metrics.registry, Readiness(), "127.0.0.1"):
        samples = await scrape(port)
    assert samples.get(
        "jetcrawl_build_info", service="jetcrawl-worker", version="0.1.0", instance="w1"
    )
    assert samples.get("jetcrawl_pages_total", outcome="fetched", status_class="2xx") == 1
    assert samples.get("jetcrawl_pages_total", outcome="fetched", status_class="4xx") == 1
    assert samples.get("jetcrawl_pages_total", outcome="robots_disallowed", status_class="none")
    assert samples.total("jetcrawl_pages_total") == 3, "w2's page is not in w1's registry"
    assert samples.get("jetcrawl_fetched_bytes_total") == 1010
    assert samples.get("jetcrawl_fetch_duration_seconds_bucket", le="0.025") == 1
    assert samples.get("jetcrawl_fetch_duration_seconds_bucket", le="0.01") == 0
