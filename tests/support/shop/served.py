"""The shop served in this process by aiohttp, on one loopback address and an OS-chosen port.

``ShopSite`` answers from ``catalog.responses`` (a query matched with its pairs sorted, as a
crawler canonicalizes it) and logs every request; ``urls`` are all its pages, for a test that
runs extraction over each.
"""

from __future__ import annotations

import socket
from types import TracebackType
from typing import Self
from urllib.parse import urlencode

from aiohttp import web

from tests.support.shop.catalog import ANY_QUERY, responses

__all__ = ["ADDRESS", "ShopSite"]

ADDRESS = "127.0.0.30"


class ShopSite:
    """``async with ShopSite() as shop``: ``shop.base_url`` is ``http://127.0.0.30:PORT``."""

    def __init__(self) -> None:
        self._runner: web.AppRunner | None = None
        self._port = 0
        self._responses: dict[str, tuple[int, str, bytes]] = {}
        self.requests: list[str] = []  # path and query as requested, in order

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        self._runner = runner
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((ADDRESS, 0))
            await web.SockSite(runner, sock).start()
        except BaseException:
            sock.close()
            await self.stop()
            raise
        self._port = sock.getsockname()[1]
        self._responses = responses(self.base_url)

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def base_url(self) -> str:
        if not self._port:
            raise RuntimeError("the shop has a port only once it is started")
        return f"http://{ADDRESS}:{self._port}"

    @property
    def seed(self) -> str:
        return f"{self.base_url}/"

    @property
    def urls(self) -> list[str]:
        """Every HTML page the shop serves, sorted."""
        return sorted(
            self.base_url + target
            for target, (_, content_type, _) in self._responses.items()
            if content_type.startswith("text/html")
        )

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(request.path_qs)
        query = urlencode(sorted(request.query.items()))
        answer = self._responses.get(f"{request.path}?{query}" if query else request.path)
        if answer is None and request.path in ANY_QUERY:
            answer = self._responses[request.path]
        if answer is None:
            return web.Response(status=404, text="not found", content_type="text/plain")
        status, content_type, body = answer
        return web.Response(status=status, body=body, headers={"Content-Type": content_type})
