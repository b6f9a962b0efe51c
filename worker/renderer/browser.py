"""One headless Chromium, driven by Playwright: each page in a fresh context, under a deadline.

Each render gets a browser context of its own (no cookie, cache or storage is shared between
pages or hosts) and closes it after, which also frees the page's memory. The browser process is
replaced after ``pages_per_browser`` renders (a new one serves new renders while the old one
finishes its own), and V8's heap is capped per renderer process (``JS_HEAP_MB``), so a long run
does not grow. A render that passes its deadline is cancelled, its page and context closed
(which kills the page's scripts), and it fails with ``RenderFailed("timeout")``. A browser that
crashed is launched again for the next render.

Chromium is Debian's (``chromium_path``), not a Playwright download; it runs without the
sandbox (as root in containers) and without the background connections it would make on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from types import TracebackType

from playwright.async_api import Browser as PlaywrightBrowser
from playwright.async_api import BrowserContext, Playwright, async_playwright
from playwright.async_api import Error as PlaywrightError

from jetcrawl.contract.render import RenderRequest
from jetcrawl.worker.renderer.rules import RenderRules

__all__ = ["CHROMIUM_ARGS", "Browser", "RenderFailed"]

log = logging.getLogger(__name__)

JS_HEAP_MB = 256
CHROMIUM_ARGS = (
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-gpu",
    "--disable-quic",
    "--disable-dev-shm-usage",
    f"--js-flags=--max-old-space-size={JS_HEAP_MB}",
)
SETTLE_S = 1.0  # after "load", how long the page may keep fetching (XHR) before it is read
CLOSE_S = 5.0  # a page or context that does not close in this long takes the browser with it


class RenderFailed(Exception):
    """A render did not produce a DOM; ``kind``: timeout, browser, too_large."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


class Browser:
    """An async context manager; ``render`` may run concurrently."""

    def __init__(self, chromium_path: str, pages_per_browser: int) -> None:
        # configuration
        self._chromium_path = chromium_path
        self._pages_per_browser = pages_per_browser
        # the Playwright driver and the current browser, with how many renders it has begun
        self._playwright: Playwright | None = None
        self._browser: PlaywrightBrowser | None = None
        self._begun = 0
        self._launching = asyncio.Lock()
        # renders running per browser, so an old browser closes when its last one ends
        self._running: dict[PlaywrightBrowser, int] = {}
        self.launches = 0

    async def __aenter__(self) -> Browser:
        self._playwright = await async_playwright().start()
        await self._current()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        browsers = [*self._running, *([self._browser] if self._browser else [])]
        self._browser = None
        self._running.clear()
        for browser in dict.fromkeys(browsers):
            with contextlib.suppress(PlaywrightError):
                await browser.close()
        if self._playwright is not None:
            playwright, self._playwright = self._playwright, None
            await playwright.stop()

    async def _current(self) -> PlaywrightBrowser:
        """The browser for the next render: launched when there is none, it crashed, or it
        has begun ``pages_per_browser`` renders."""
        async with self._launching:
            browser = self._browser
            if (
                browser is None
                or not browser.is_connected()
                or (self._begun >= self._pages_per_browser)
            ):
                assert self._playwright is not None, "use Browser as a context manager"
                old = browser
                browser = await self._playwright.chromium.launch(
                    executable_path=self._chromium_path, args=list(CHROMIUM_ARGS)
                )
                self._browser, self._begun = browser, 0
                self.launches += 1
                if old is not None and not self._running.get(old):
                    self._running.pop(old, None)
                    with contextlib.suppress(PlaywrightError):
                        await old.close()
            self._begun += 1
            self._running[browser] = self._running.get(browser, 0) + 1
            return browser

    async def render(self, request: RenderRequest, rules: RenderRules) -> str:
        """The DOM of ``request``'s page after its scripts ran, serialised as HTML."""
        browser = await self._current()
        try:
            context = await browser.new_context(
                user_agent=request.user_agent,
                service_workers="block",  # a service worker's fetches would not be routed
                java_script_enabled=True,
            )
        except PlaywrightError as e:
            await self._release(browser)
            raise RenderFailed("browser", str(e)[:300]) from None
        try:
            await context.route("**/*", rules.handle)
            page = await context.new_page()
            try:
                async with asyncio.timeout(request.timeout_s):
                    await page.goto(request.url, wait_until="load")
                    # Scripts may go on fetching after "load" (XHR, fetch): give them a while,
                    # longer on a host whose politeness spaces their requests.
                    settle_ms = (SETTLE_S + 2 * request.delay_s) * 1000
                    with contextlib.suppress(PlaywrightError):
                        await page.wait_for_load_state("networkidle", timeout=settle_ms)
                    await rules.settled()  # no request half-decided when the DOM is read
                    return await page.content()
            except TimeoutError:
                raise RenderFailed("timeout", f"not rendered in {request.timeout_s} s") from None
            except PlaywrightError as e:
                raise RenderFailed("browser", str(e).splitlines()[0][:300]) from None
        finally:
            await self._close_context(context, browser)

    async def _close_context(self, context: BrowserContext, browser: PlaywrightBrowser) -> None:
        try:
            async with asyncio.timeout(CLOSE_S):
                await context.close()
        except (TimeoutError, PlaywrightError):
            log.warning("a browser context did not close: restarting the browser")
            with contextlib.suppress(PlaywrightError):
                await browser.close()
        finally:
            await self._release(browser)

    async def _release(self, browser: PlaywrightBrowser) -> None:
        left = self._running.get(browser, 1) - 1
        if left > 0:
            self._running[browser] = left
            return
        self._running.pop(browser, None)
        if browser is not self._browser:  # replaced meanwhile: its last render is done
            with contextlib.suppress(PlaywrightError):
                await browser.close()
