"""The renderer service (``jetcrawl renderer``): render requests in, DOMs out, scaled on its own.

It answers NATS requests on ``crawl.render`` in the queue group ``renderers``, so every
renderer running shares the load. At most ``render_concurrency`` renders run at once: while all
are busy the subscription's callback waits, and further requests wait in the subscription's
bounded queue (``PENDING_PER_SLOT`` per slot; past that NATS drops them as a slow consumer,
and the worker's request times out and is retried). Each render is a SERVER span whose parent is
the context the request carries: the task's trace. A render that fails answers its error; the
DOM of a render is capped at ``render_max_dom_bytes`` and the server's payload limit.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError
from opentelemetry.trace import SpanKind

from jetcrawl.contract.errors import MessageError, SettingsError
from jetcrawl.contract.render import RENDER_QUEUE, RENDER_SUBJECT, RenderReply, RenderRequest
from jetcrawl.contract.settings import Settings
from jetcrawl.otel import NO_TRACING, Tracing
from jetcrawl.otel.spans import URL_FULL, fail, redact_url
from jetcrawl.plumbing.bus import connect
from jetcrawl.worker.fetcher import Fetcher
from jetcrawl.worker.proxies import resolve
from jetcrawl.worker.renderer.browser import Browser, RenderFailed
from jetcrawl.worker.renderer.rules import RenderRules
from jetcrawl.worker.robots import Robots

__all__ = ["PENDING_PER_SLOT", "RenderStats", "RendererService"]

log = logging.getLogger(__name__)

PENDING_PER_SLOT = 4
REPLY_HEADROOM_BYTES = 64 * 1024  # the reply's fields besides the DOM, within max_payload


@dataclass(slots=True)
class RenderStats:
    rendered: int = 0
    failed: int = 0
    refused: int = 0  # sub-requests the rules refused (robots, other host, SSRF, ...)
    bad_requests: int = 0


class RendererService:
    """Async context manager (NATS, the browser, the fetcher); ``run()`` until ``stop()``."""

    def __init__(self, settings: Settings, name: str, tracing: Tracing = NO_TRACING) -> None:
        self._settings = settings
        self._name = name
        self._tracing = tracing
        self._nc: NATS | None = None
        self._fetcher = Fetcher(settings)
        self._robots = Robots(settings, self._fetcher)
        self._browser = Browser(settings.chromium_path, settings.render_pages_per_browser)
        self._sub: Subscription | None = None
        self._slots = asyncio.Semaphore(settings.render_concurrency)
        self._tasks: set[asyncio.Task[None]] = set()  # renders running, owned here
        self._stopping = asyncio.Event()
        self.ready = asyncio.Event()  # subscribed: requests sent from now on reach it
        self.stats = RenderStats()

    async def __aenter__(self) -> RendererService:
        await self._fetcher.__aenter__()
        await self._browser.__aenter__()
        self._nc = await connect(self._settings, f"jetcrawl-renderer-{self._name}")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        self.stop()
        if self._tasks:
            await asyncio.wait(self._tasks)
        if self._nc is not None:
            nc, self._nc = self._nc, None
            await nc.close()
        await self._browser.close()
        await self._fetcher.close()

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        """Answer render requests until ``stop()``; then finish the renders begun."""
        assert self._nc is not None, "use RendererService as a context manager"
        limit = PENDING_PER_SLOT * self._settings.render_concurrency
        self._sub = await self._nc.subscribe(
            RENDER_SUBJECT, queue=RENDER_QUEUE, cb=self._take, pending_msgs_limit=limit
        )
        await self._nc.flush()
        self.ready.set()
        log.info("renderer %s ready on %s", self._name, RENDER_SUBJECT)
        await self._stopping.wait()
        await self._sub.unsubscribe()
        if self._tasks:
            await asyncio.wait(self._tasks)

    async def _take(self, msg: Msg) -> None:
        await self._slots.acquire()  # holds the subscription's delivery while every slot is busy
        task = asyncio.create_task(self._serve(msg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, msg: Msg) -> None:
        try:
            if not msg.data:  # a readiness probe (RenderClient.answers)
                if msg.reply:
                    await msg.respond(b"")
                return
            started = time.perf_counter()
            try:
                request = RenderRequest.from_wire(msg.data)
            except MessageError as e:
                self.stats.bad_requests += 1
                log.warning("render request refused: %s", e)
                await self._answer(msg, RenderReply("", None, (), 0.0, f"bad_request: {e}"))
                return
            with self._tracing.tracer.start_as_current_span(
                "render",
                context=self._tracing.extract(msg.headers),
                kind=SpanKind.SERVER,
                attributes={URL_FULL: redact_url(request.url)},
            ) as span:
                reply = await self._render(request, started)
                if reply.error is not None:
                    fail(span, reply.error.split(":", 1)[0], reply.error)
            await self._answer(msg, reply)
        finally:
            self._slots.release()

    async def _render(self, request: RenderRequest, started: float) -> RenderReply:
        try:
            proxy = resolve(request.proxy).url if request.proxy else None
        except SettingsError as e:
            return RenderReply(request.url, None, (), 0.0, f"proxy: {e}")
        rules = RenderRules(request, self._fetcher, self._robots, proxy)
        dom, error = None, None
        try:
            dom = await self._browser.render(request, rules)
            if len(dom.encode()) > self._dom_limit():
                dom, error = None, f"too_large: the DOM is over {self._dom_limit()} bytes"
        except RenderFailed as e:
            error = str(e)
        elapsed_ms = (time.perf_counter() - started) * 1000
        self.stats.refused += sum(r.verdict != "fetched" for r in rules.requests)
        if error is None:
            self.stats.rendered += 1
        else:
            self.stats.failed += 1
            log.info("render of %s failed: %s", request.url, error)
        return RenderReply(request.url, dom, tuple(rules.requests), elapsed_ms, error)

    def _dom_limit(self) -> int:
        assert self._nc is not None
        return min(self._settings.render_max_dom_bytes, self._nc.max_payload - REPLY_HEADROOM_BYTES)

    async def _answer(self, msg: Msg, reply: RenderReply) -> None:
        if not msg.reply:
            return
        try:
            await msg.respond(reply.to_wire())
        except NatsError as e:  # the worker has given up, or NATS is away: it will retry
            log.warning("could not answer the render of %s: %r", reply.url, e)
