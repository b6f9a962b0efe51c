"""Results of real crawls: WARC with the bodies served, re-crawls with conditional GET, jobs."""

from __future__ import annotations

import asyncio
import os
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
import pytest
from aiohttp import web
from warcio.archiveiterator import ArchiveIterator

from jetcrawl.contract.urls import fingerprint
from jetcrawl.local.embedded import EtcdServer, NatsServer
from jetcrawl.ops.jobstatus import read_reports
from jetcrawl.plumbing.bodies import payload_digest
from tests.support.mesh import Mesh
from tests.support.site import MultiHostSite
from tests.support.streams import eventually, seen_keys


async def test_a_crawl_with_bodies_written_as_warc_holds_exactly_the_bodies_served(
    site: MultiHostSite, tmp_path: Path
) -> None:
    out = tmp_path / "crawl.warc.gz"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "jetcrawl",
        "crawl",
        *site.seeds,
        "--workers",
        "1",
        "--scope",
        "any",
        "--allow-net",
        "127.0.0.0/8",
        "--output",
        str(out),
        env={**os.environ, "JETCRAWL_SHARDS": "8", "JETCRAWL_HOST_DELAY_S": "0"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode == 0, stderr.decode()

    responses: dict[str, tuple[str, int, bytes]] = {}
    with out.open("rb") as f:
        for record in ArchiveIterator(f):
            if record.rec_type == "response":
                uri = record.rec_headers.get_header("WARC-Target-URI")
                responses[uri] = (
                    record.rec_headers.get_header("WARC-Payload-Digest"),
                    int(record.http_headers.get_statuscode()),
                    record.content_stream().read(),
                )
    fetched = set(site.fetchable)
    assert set(responses) == fetched, "one response record per URL fetched"
    html_pages = 0
    async with aiohttp.ClientSession() as http:
        for uri, (digest, status, payload) in responses.items():
            assert status == site.statuses[uri]
            if status != 200 or not payload:
                continue
            async with http.get(uri, allow_redirects=False) as served:
                body = await served.read()
            assert payload == body, uri
            assert digest == payload_digest(body), uri
            html_pages += 1
    assert html_pages > 10


class ValidatingSite:
    """One page with an ETag and Last-Modified; answers 304 to a matching conditional GET."""

    ETAG = '"v1"'
    MODIFIED = "Tue, 01 Sep 2026 10:00:00 GMT"

    def __init__(self) -> None:
        self.requests: list[dict[str, str]] = []
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def __aenter__(self) -> ValidatingSite:
        app = web.Application()
        app.router.add_get("/robots.txt", self._robots)
        app.router.add_get("/page", self._page)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.5", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.5:{port}/page"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def _robots(self, request: web.Request) -> web.Response:
        return web.Response(status=404)

    async def _page(self, request: web.Request) -> web.Response:
        self.requests.append(dict(request.headers))
        if request.headers.get("If-None-Match") == self.ETAG:
            return web.Response(status=304, headers={"ETag": self.ETAG})
        return web.Response(
            text="<html><title>page</title><body>same content</body></html>",
            content_type="text/html",
            headers={"ETag": self.ETAG, "Last-Modified": self.MODIFIED},
        )


@pytest.fixture
async def validating_site() -> AsyncIterator[ValidatingSite]:
    async with ValidatingSite() as site:
        yield site


async def test_a_recrawl_sends_the_validators_and_records_304_without_a_new_body(
    nats_server: NatsServer,
    etcd_server: EtcdServer,
    tmp_path: Path,
    validating_site: ValidatingSite,
) -> None:
    async with Mesh(
        nats_server.url, etcd_server.url, tmp_path, recrawl_after_s=1.0, store_bodies=True
    ) as mesh:
        await mesh.start("dispatcher", "dispatcher")
        await mesh.start_workers("w1")
        await mesh.wait_ownership({"w1"})
        await mesh.seed([validating_site.url])
        await mesh.wait_drained()
        bodies_after_first = (await mesh.js.stream_info("OBJ_crawl_bodies")).state.messages

        async def expired() -> bool:
            return fingerprint(validating_site.url) not in await seen_keys(mesh.js)

        await eventually(expired, within_s=15)
        await mesh.seed([validating_site.url])
        await mesh.wait_drained()
        results = [r for r in await mesh.results() if r.url == validating_site.url]
        bodies_after_second = (await mesh.js.stream_info("OBJ_crawl_bodies")).state.messages

    assert [r.status for r in results] == [200, 304]
    first, again = results
    assert first.body_ref is not None and first.payload_digest is not None
    assert again.body_ref is None, "a 304 stores no body"
    assert bodies_after_first > 0
    assert bodies_after_second == bodies_after_first, "nothing new in the body store"
    conditional = validating_site.requests[1]
    assert conditional.get("If-None-Match") == ValidatingSite.ETAG
    assert conditional.get("If-Modified-Since") == ValidatingSite.MODIFIED
    assert "If-None-Match" not in validating_site.requests[0]


async def test_two_jobs_with_different_scopes_crawled_at_once_stay_apart(
    nats_server: NatsServer, etcd_server: EtcdServer, tmp_path: Path, site: MultiHostSite
) -> None:
    seed = site.seeds[0]
    async with Mesh(nats_server.url, etcd_server.url, tmp_path) as mesh:
        await mesh.start("dispatcher", "dispatcher")
        await mesh.start_workers("w1", "w2")
        await mesh.wait_ownership({"w1", "w2"})
        await mesh.seed([seed], scope="host", job="narrow")
        await mesh.seed([seed], scope="any", job="wide")
        await mesh.wait_drained()
        results = await mesh.results()
        narrow = sum(r.job == "narrow" for r in results)

        async def reported() -> bool:  # every page, once the workers' next reports are in
            reports = await read_reports(mesh.js)
            return sum(r.jobs["narrow"].pages for r in reports if "narrow" in r.jobs) == narrow

        await eventually(reported)
        status = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "jetcrawl",
            "status",
            "--json",
            "--interval",
            "0",
            "--job",
            "narrow",
            "--nats",
            nats_server.url,
            "--etcd",
            etcd_server.url,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(status.communicate(), 30)
        assert status.returncode == 0, err.decode()
    by_job: dict[str, Counter[str]] = {}
    for r in results:
        by_job.setdefault(r.job, Counter())[r.url] += 1
    assert set(by_job) == {"narrow", "wide"}
    assert set(by_job["narrow"]) == site.reachable_from(seed, "host")
    assert set(by_job["wide"]) == site.reachable_from(seed, "any")
    assert set(by_job["narrow"]) < set(by_job["wide"]), "the overlap was crawled for both"
    job = orjson.loads(out)["job"]  # from the workers' reports, not the results
    assert (job["job"], job["state"], job["backlog"]["queued"]) == ("narrow", "running", 0)
    assert job["pages"] == len(by_job["narrow"]) and job["errors"] == 0
    assert max(max(c.values()) for c in by_job.values()) == 1
