"""The crawler's rules for every request a rendered page makes, at the network layer.

Chromium never touches the network: every request of the page is routed here (Playwright
``page.route``) and either fulfilled with a response the renderer fetched itself, or aborted.
In order:

1. the first navigation is the document: fulfilled from the HTML the worker sent (no refetch);
2. images, fonts and media (``blocked_types``) are aborted: links do not need them;
3. anything but GET is aborted (``method``);
4. a request to any host other than the page's is aborted (``other_host``): a render stays on
   the host whose politeness the worker holds, so no other host is ever reached behind its
   owner's back;
5. robots.txt is checked for the User-Agent the render sends (``robots``);
6. requests to the host are made one at a time, their starts ``delay_s`` apart (the first one
   ``delay_s`` after the document, which the worker fetched just before);
7. the request is made by the renderer's ``Fetcher``, so the SSRF guard checks the address of
   every connection (``ssrf``), and a proxy, when given, carries it.

Each request's fate is kept in ``requests`` for the reply; ``MAX_SUBREQUESTS`` bounds a render.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from playwright.async_api import Route

from jetcrawl.contract.errors import UrlError
from jetcrawl.contract.render import RenderRequest, SubRequest
from jetcrawl.contract.urls import canonicalize, host_of
from jetcrawl.worker.errors import FetchError
from jetcrawl.worker.fetcher import Fetcher
from jetcrawl.worker.robots import Robots

__all__ = ["BLOCKED_TYPES", "MAX_RESOURCE_BYTES", "MAX_SUBREQUESTS", "RenderRules"]

BLOCKED_TYPES = frozenset({"image", "font", "media"})
MAX_SUBREQUESTS = 200
MAX_RESOURCE_BYTES = 5 * 1024 * 1024


class RenderRules:
    """The rules of one render; ``handle`` is its Playwright route handler."""

    def __init__(
        self,
        request: RenderRequest,
        fetcher: Fetcher,
        robots: Robots,
        proxy: str | None = None,
        blocked_types: frozenset[str] = BLOCKED_TYPES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._request = request
        self._host = host_of(request.url)
        self._fetcher = fetcher
        self._robots = robots
        self._proxy = proxy  # resolved, with credentials
        self._blocked_types = blocked_types
        self._clock = clock
        self._document_served = False
        self._turn = asyncio.Lock()  # one request to the host at a time
        self._last_start = clock()  # the worker's fetch of the document
        self._pending = 0  # requests being decided or fetched now
        self._settled = asyncio.Event()  # set while nothing is pending
        self._settled.set()
        self.requests: list[SubRequest] = []

    async def settled(self) -> None:
        """Wait until no request of the page is being decided or fetched."""
        await self._settled.wait()

    async def handle(self, route: Route) -> None:
        self._pending += 1
        self._settled.clear()
        try:
            await self._handle(route)
        finally:
            self._pending -= 1
            if not self._pending:
                self._settled.set()

    async def _handle(self, route: Route) -> None:
        request = route.request
        if not self._document_served and request.is_navigation_request():
            self._document_served = True
            await route.fulfill(
                status=200, content_type="text/html; charset=utf-8", body=self._request.html
            )
            return
        verdict, answer = await self._decide(request.url, request.method, request.resource_type)
        self.requests.append(SubRequest(request.url, verdict, answer[0] if answer else None))
        if answer is None:
            await route.abort("blockedbyclient" if verdict != "failed" else "failed")
            return
        status, headers, body = answer
        await route.fulfill(status=status, headers=headers, body=body)

    async def _decide(
        self, url: str, method: str, resource_type: str
    ) -> tuple[str, tuple[int, dict[str, str], bytes] | None]:
        if resource_type in self._blocked_types:
            return "resource_type", None
        if method != "GET":
            return "method", None
        if len(self.requests) >= MAX_SUBREQUESTS:
            return "over_limit", None
        try:
            canonical = canonicalize(url)
        except UrlError:
            return "other_host", None  # data:, blob:, about: and the like never reach here
        if host_of(canonical) != self._host:
            return "other_host", None
        verdict = await self._robots.check(canonical, self._request.user_agent)
        if not verdict.allowed:
            return "robots", None
        async with self._turn:
            wait_s = self._last_start + self._request.delay_s - self._clock()
            if wait_s > 0:
                await asyncio.sleep(wait_s)  # the host's politeness: a pause, not a poll
            self._last_start = self._clock()
            try:
                if self._proxy is not None:
                    await self._fetcher.guard_name(url)
                status, headers, body = await self._fetcher.get_resource(
                    url,  # as the page asked for it: canonical form may reorder its query
                    MAX_RESOURCE_BYTES,
                    headers={"User-Agent": self._request.user_agent},
                    proxy=self._proxy,
                )
            except FetchError as e:
                return ("ssrf" if e.kind == "blocked" else "failed"), None
        return "fetched", (status, dict(headers), body)
