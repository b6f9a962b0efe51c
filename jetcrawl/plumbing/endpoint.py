"""A service's HTTP endpoint on ``metrics_port``: ``/metrics``, ``/healthz``, ``/readyz``.

``/healthz``  200 while the process and its event loop run (a liveness probe).
``/readyz``   200 when every readiness check (:mod:`jetcrawl.plumbing.health`) passes, else
              503; the JSON body names each check and why it fails.
``/metrics``  the service's Prometheus registry, in the format the scraper asks for.

The endpoint is an aiohttp app the service runs beside its work and closes when it stops.
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import Self

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

from jetcrawl.plumbing.health import Readiness

__all__ = ["Endpoint"]

log = logging.getLogger(__name__)

DEFAULT_HOST = "0.0.0.0"


class Endpoint:
    """The HTTP endpoint; an async context manager that serves while entered."""

    def __init__(
        self,
        port: int,
        registry: CollectorRegistry,
        readiness: Readiness,
        host: str = DEFAULT_HOST,
    ) -> None:
        self._host = host
        self._port = port
        self.readiness = readiness
        app = web.Application()
        app.router.add_get("/metrics", make_aiohttp_handler(registry))
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._runner = web.AppRunner(app, access_log=None)

    async def __aenter__(self) -> Self:
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, self._host, self._port).start()
        except OSError:
            await self._runner.cleanup()
            raise
        log.info("metrics and health on http://%s:%d/", self._host, self._port)
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._runner.cleanup()

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        checks = await self.readiness.probe()
        ready = all(answer == "ok" for answer in checks.values())
        return web.Response(
            body=orjson.dumps({"ready": ready, "checks": checks}),
            status=200 if ready else 503,
            content_type="application/json",
        )
