"""A real Prometheus scraping a local mesh answers PromQL about the crawl."""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from jetcrawl.local.embedded import EmbeddedServerError, EtcdServer, NatsServer
from jetcrawl.plumbing.metrics import status_class
from tests.support import tools
from tests.support.mesh import Mesh
from tests.support.prometheus import RATE_RANGE, Prometheus, QueryError
from tests.support.scrape import free_port
from tests.support.site import MultiHostSite
from tests.support.streams import read_until

PAGES = "sum(jetcrawl_pages_total)"
CRAWL_RATE = f"sum(rate(jetcrawl_pages_total[{RATE_RANGE}]))"
PAGES_BY_OUTCOME = "sum by (outcome, status_class) (jetcrawl_pages_total)"
HOSTS = 4
# Unpaced, the crawl below is over within a scrape or two; politeness makes it last seconds
# whatever the machine (each host's ~75 URLs a turn apart), and bounds its rate.
HOST_DELAY_S = 0.04
MAX_RATE = HOSTS / HOST_DELAY_S


@pytest.fixture(autouse=True)
def _prometheus_installed() -> None:
    tools.require("prometheus", "the live scrape tests")


@pytest.fixture
async def mid_site() -> AsyncIterator[MultiHostSite]:
    async with MultiHostSite(seed=11, hosts=HOSTS, pages_per_host=60) as site:
        yield site


async def test_prometheus_answers_the_crawl_rate(
    nats_server: NatsServer, etcd_server: EtcdServer, tmp_path: Path, mid_site: MultiHostSite
) -> None:
    ports = {"dispatcher": free_port(), "w1": free_port()}
    async with (
        Mesh(nats_server.url, etcd_server.url, tmp_path, host_delay_s=HOST_DELAY_S) as mesh,
        Prometheus(tmp_path / "prometheus", ports) as prom,
    ):
        services = [
            await mesh.start(role, name, JETCRAWL_METRICS_PORT=str(port))
            for (name, port), role in zip(ports.items(), ("dispatcher", "worker"), strict=True)
        ]
        await prom.wait_up()
        await mesh.wait_ownership({"w1"})
        assert await prom.value(PAGES) in (None, 0)  # nothing crawled before the seeds

        # While crawling: a rate, within what politeness allows (rate() extrapolates a little).
        await mesh.seed(mid_site.seeds)
        rate = await prom.wait_value(CRAWL_RATE, lambda v: v is not None and v > 0)
        stored = await mesh.result_count()
        assert stored < len(mid_site.reachable), f"the crawl was over ({stored}) when first seen"
        assert rate is not None and rate <= 1.5 * MAX_RATE

        # Once drained: the count is the crawl's results, by outcome too, and the rate falls to 0.
        await mesh.wait_drained()
        results = await mesh.results()
        assert len(results) == len(mid_site.reachable)
        await prom.wait_value(PAGES, lambda v: v == len(results))
        by_outcome = {
            (s.labels["outcome"], s.labels["status_class"]): s.value
            for s in await prom.query(PAGES_BY_OUTCOME)
            if s.value
        }
        assert by_outcome == Counter(
            (r.outcome, status_class(r.status) if r.outcome == "fetched" else "none")
            for r in results
        )
        await prom.wait_value(CRAWL_RATE, lambda v: v == 0)
        assert await prom.up() == {"dispatcher": 1, "w1": 1}

        for service in services:
            service.signal(signal.SIGTERM)
        for service in services:
            assert await service.wait() == 0, service.log()


async def test_a_target_that_does_not_answer_is_down(tmp_path: Path) -> None:
    nobody = free_port()  # nothing listens there
    async with Prometheus(tmp_path / "prometheus", {"ghost": nobody}) as prom:
        up = await read_until(prom.up, lambda up: "ghost" in up)
        assert up == {"ghost": 0}
        with pytest.raises(AssertionError, match=rf"ghost http://127.0.0.1:{nobody}/metrics: down"):
            await prom.wait_up(within_s=1)


async def test_a_bad_query_says_why(tmp_path: Path) -> None:
    async with Prometheus(tmp_path / "prometheus", {}) as prom:
        with pytest.raises(QueryError) as caught:
            await prom.query("sum(rate(jetcrawl_pages_total))")
    assert caught.value.status == 400
    assert caught.value.error_type == "bad_data"
    assert "range vector" in caught.value.error


async def test_a_prometheus_that_cannot_start_says_why(tmp_path: Path) -> None:
    async with Prometheus(tmp_path / "first", {}) as first:
        second = Prometheus(tmp_path / "second", {})
        second.port = first.port  # taken
        with pytest.raises(EmbeddedServerError, match="address already in use") as caught:
            await second.start()
    assert "Unable to start web listener" in caught.value.log_tail
    assert not second.running
