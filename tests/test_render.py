"""Rendering: a site whose links only JavaScript writes, crawled with and without a browser, and
the crawler's rules holding for every request the browser makes (read from the sites' logs).

A real dispatcher, worker and renderer (in this process) on a real nats-server; Debian's
Chromium driven by Playwright (skipped without it, failed on CI: tests/support/tools.py).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import SEEDS
from jetcrawl.dispatcher import Dispatcher
from jetcrawl.local.embedded import NatsServer
from jetcrawl.otel import Tracing
from jetcrawl.worker import Worker
from jetcrawl.worker.errors import FetchError
from jetcrawl.worker.render import RenderClient
from jetcrawl.worker.renderer import RendererService
from tests.support.badsite import BadSite
from tests.support.jssite import JS_PAGES, SHELL, js_site
from tests.support.tools import require
from tests.test_fail_fast import jetcrawl
from tests.test_good_citizen import crawling, drained, gaps, results, seed, settings_for


def render_settings(nats_server: NatsServer, **changes: Any) -> Settings:
    chromium = require("chromium", "the renderer drives Debian's Chromium")
    return settings_for(nats_server, chromium_path=chromium, render_timeout_s=30.0).replace(
        **changes
    )


@asynccontextmanager
async def rendering(settings: Settings) -> AsyncIterator[RendererService]:
    async with RendererService(settings, "r1") as renderer, asyncio.TaskGroup() as tg:
        tg.create_task(renderer.run())
        await renderer.ready.wait()
        try:
            yield renderer
        finally:
            renderer.stop()


@pytest.mark.parametrize("render", ["auto", "never"])
async def test_links_written_by_javascript_are_found_only_when_rendered(
    nats_server: NatsServer, js: JetStreamContext, render: str
) -> None:
    settings = render_settings(nats_server, render=render)
    async with (
        BadSite() as site,
        BadSite(host="127.0.0.2") as elsewhere,
        rendering(settings) as renderer,
        crawling(settings) as worker,
    ):
        js_site(site, elsewhere.url("/track.js"))
        await seed(js, [site.url("/")])
        await drained(js)
    crawled = await results(js)
    root = crawled[site.url("/")]
    if render == "auto":
        assert set(crawled) == {site.url("/"), *(site.url(p) for p in JS_PAGES)}
        assert (root.rendered, root.title, root.outlinks) == (True, "rendered", len(JS_PAGES))
        assert not any(crawled[site.url(p)].rendered for p in JS_PAGES), "plain pages: served"
        assert (worker.stats.rendered, renderer.stats.rendered) == (1, 1)
    else:
        assert set(crawled) == {site.url("/")}, "the served HTML has no link"
        assert (root.rendered, root.title, root.outlinks) == (False, "app", 0)
        assert site.hits["/app.js"] == 0 and renderer.stats.rendered == 0
    assert elsewhere.log == [], "a render never reaches another host"
    assert site.hits["/"] == 1, "the document is fetched once: the renderer gets it from the worker"


@pytest.mark.parametrize("delay_s", [0.0, 0.6])
async def test_every_request_of_a_rendered_page_keeps_the_crawl_rules(
    nats_server: NatsServer, nc: NATS, delay_s: float
) -> None:
    settings = render_settings(nats_server)
    nats_endpoint = f"http://127.0.0.1:{urlsplit(nats_server.url).port}/"
    async with (
        BadSite() as site,
        BadSite(host="127.0.0.2") as elsewhere,
        rendering(settings),
    ):
        js_site(site, elsewhere.url("/track.js"), forbidden=(nats_endpoint,))
        client = RenderClient(nc, settings.render_timeout_s)
        reply = await client.render(site.url("/"), SHELL, settings.user_agent, delay_s, None)
    verdicts = {r.url.removeprefix(site.origin): r.verdict for r in reply.requests}
    assert verdicts == {
        "/app.js": "fetched",
        "/links.json": "fetched",
        "/logo.png": "resource_type",
        "/private/secret.js": "robots",
        elsewhere.url("/track.js"): "other_host",
        nats_endpoint: "ssrf",
    }
    assert site.paths() == ["/app.js", "/links.json"], "nothing refused reached the site"
    assert elsewhere.log == []
    spacing = gaps([t for t, path in site.log if path != "/robots.txt"])
    if delay_s:
        assert min(spacing) >= delay_s - 0.02, spacing
    else:
        assert max(spacing) < 0.6, "the negative case: without a delay, no wait"
    assert reply.dom is not None and all(f'href="{p}"' in reply.dom for p in JS_PAGES)


async def test_a_page_that_hangs_is_killed_and_the_renderer_goes_on(
    nats_server: NatsServer, nc: NATS
) -> None:
    settings = render_settings(nats_server)
    async with BadSite() as site, rendering(settings) as renderer:
        js_site(site, site.url("/nowhere"))
        hung = "<title>spin</title><script>while (true) {}</script>"
        with pytest.raises(FetchError) as caught:  # the time limit travels with the request
            await RenderClient(nc, 2.0).render(
                site.url("/spin"), hung, settings.user_agent, 0.0, None
            )
        assert caught.value.kind == "render" and "not rendered in 2.0 s" in caught.value.message
        client = RenderClient(nc, settings.render_timeout_s)
        reply = await client.render(site.url("/"), SHELL, settings.user_agent, 0.0, None)
    assert reply.dom is not None and "rendered" in reply.dom
    assert (renderer.stats.failed, renderer.stats.rendered) == (1, 1)


async def test_no_renderer_is_a_transient_failure_named(nats_server: NatsServer, nc: NATS) -> None:
    client = RenderClient(nc, 1.0)
    with pytest.raises(FetchError) as caught:
        await client.render("http://127.0.0.1:1/", SHELL, "jetcrawl/0.1", 0.0, None)
    assert caught.value.kind == "render_unavailable" and caught.value.transient
    assert "no renderer is running" in caught.value.message


async def test_the_render_span_joins_the_tasks_trace(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing(provider.get_tracer("test"), provider)
    settings = render_settings(nats_server, render="always")
    async with (
        BadSite() as site,
        RendererService(settings, "r1", tracing) as renderer,
        Dispatcher(settings, tracing) as dispatcher,
        Worker(settings, "w1", tracing) as worker,
        asyncio.TaskGroup() as tg,
    ):
        js_site(site, site.url("/nowhere"))
        for service in (renderer, dispatcher, worker):
            tg.create_task(service.run())
        await renderer.ready.wait()
        await worker.wait_running()
        for shard in range(settings.shards):
            await worker.on_acquired(shard, fence=1)
        await js.publish(SEEDS, orjson.dumps({"url": site.url("/"), "max_depth": 0}))
        await drained(js)
        for service in (renderer, dispatcher, worker):
            service.stop()
    provider.shutdown()
    spans = exporter.get_finished_spans()
    [process] = [s for s in spans if s.name.startswith("process crawl.tasks.")]
    [get] = [s for s in spans if s.name == "GET"]
    [render] = [s for s in spans if s.name == "render"]
    assert render.context.trace_id == process.context.trace_id, "one trace"
    assert render.parent is not None and render.parent.span_id == process.context.span_id
    assert render.kind == SpanKind.SERVER
    assert get.attributes is not None and get.attributes["jetcrawl.rendered"] is True


CHALLENGE = """<html><head><title>Checking your browser</title>
<script src="/challenge.js"></script></head><body></body></html>"""
CHALLENGE_JS = """document.currentScript.remove();
document.addEventListener('DOMContentLoaded', () => {
  document.title = 'passed';
  document.body.innerHTML = '<a href="/js/p0">p0</a>';
});"""


@pytest.mark.parametrize("on_block", ["render", "record"])
async def test_on_block_render_gets_past_a_script_challenge(
    nats_server: NatsServer, js: JetStreamContext, on_block: str
) -> None:
    settings = render_settings(nats_server, on_block=on_block)
    async with BadSite() as site, rendering(settings), crawling(settings):
        js_site(site, site.url("/nowhere"))
        site.add("/gate", CHALLENGE)
        site.add("/challenge.js", CHALLENGE_JS, content_type="text/javascript")
        await seed(js, [site.url("/gate")])
        await drained(js)
    crawled = await results(js)
    gate = crawled[site.url("/gate")]
    if on_block == "render":
        assert (gate.outcome, gate.rendered, gate.title) == ("fetched", True, "passed")
        assert set(crawled) == {site.url("/gate"), site.url("/js/p0")}
    else:
        assert (gate.outcome, gate.rendered) == ("blocked", False)
        assert gate.error is not None and gate.error.message.startswith("challenge_script")
        assert set(crawled) == {site.url("/gate")}


@pytest.mark.parametrize(
    "command",
    [["renderer"], ["crawl", "http://a.test/", "--render", "auto"]],
    ids=["renderer", "crawl --render auto"],
)
async def test_no_chromium_fails_the_command_at_once_in_one_line(command: list[str]) -> None:
    code, err = await jetcrawl(*command, "--set", "chromium_path=/nonexistent/chromium")
    assert code == 2, err
    assert err[-1] == (
        "jetcrawl: chromium_path: /nonexistent/chromium is not an executable Chromium "
        "(apt-get install chromium, or set chromium_path)"
    )


@pytest.mark.parametrize(
    "command",
    [["renderer"], ["crawl", "http://a.test/", "--render", "auto"]],
    ids=["renderer", "crawl --render auto"],
)
async def test_without_the_render_extra_the_command_fails_at_once_in_one_line(
    command: list[str],
) -> None:
    # An install without Playwright (pip install jetcrawl[embedded]): hidden from this process.
    program = (
        "import sys; sys.modules['playwright'] = None\n"
        "from jetcrawl.cli import main\n"
        f"sys.exit(main({command!r}))"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", program, stderr=asyncio.subprocess.PIPE
    )
    async with asyncio.timeout(60):
        _, err = await proc.communicate()
    lines = err.decode().splitlines()
    assert proc.returncode == 2, lines
    assert lines[-1] == (
        "jetcrawl: render: rendering needs Playwright: pip install 'jetcrawl[render]'"
    )
