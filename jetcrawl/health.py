"""A service's HTTP endpoint on ``metrics_port``: ``/metrics``, ``/healthz``, ``/readyz``.

``/healthz``  200 while the process and its event loop run (a liveness probe).
``/readyz``   200 when every readiness check passes, else 503; the JSON body names each check and
              why it fails. The service adds its checks as its parts come up (NATS connected and
              the topology present; for a worker, registered in etcd with etcd answering), so a
              service still starting is alive but not ready.
``/metrics``  the service's Prometheus registry, in the format the scraper asks for.

The endpoint is an aiohttp app the service runs beside its work and closes when it stops.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Protocol, Self

import orjson
from aiohttp import web
from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

from jetcrawl.settings import Settings
from jetcrawl.topology import FRONTIER_STREAM, SHARDS_METADATA_KEY, TASKS_STREAM

__all__ = ["Endpoint", "Readiness", "nats_ready", "registry_ready"]

log = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 2.0
DEFAULT_HOST = "0.0.0.0"

# A check answers None when ready, else why not.
Check = Callable[[], Awaitable[str | None]]


class Readiness:
    """Named checks; ready when there is at least one and every one passes."""

    def __init__(self) -> None:
        self._checks: dict[str, Check] = {}

    def add(self, name: str, check: Check) -> None:
        self._checks[name] = check

    async def probe(self) -> dict[str, str]:
        """Each check's answer: ``"ok"`` or the reason it fails."""
        if not self._checks:
            return {"service": "starting"}
        names = list(self._checks)
        answers = await asyncio.gather(*(self._run(self._checks[n]) for n in names))
        return {name: answer or "ok" for name, answer in zip(names, answers, strict=True)}

    @staticmethod
    async def _run(check: Check) -> str | None:
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_S):
                return await check()
        except TimeoutError:
            return f"no answer within {CHECK_TIMEOUT_S:g} s"


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


def nats_ready(nc: NATS, settings: Settings) -> Check:
    """Connected to NATS, and the topology is there with our shard count."""

    async def check() -> str | None:
        if not nc.is_connected:
            return "nats: not connected"
        js = nc.jetstream()
        try:
            await js.stream_info(FRONTIER_STREAM)
            tasks = await js.stream_info(TASKS_STREAM)
        except NatsError as e:
            return f"topology: {e!r}"
        recorded = (tasks.config.metadata or {}).get(SHARDS_METADATA_KEY)
        if recorded != str(settings.shards):
            return f"topology: {TASKS_STREAM} has {recorded} shards, this service {settings.shards}"
        return None

    return check


class Lease(Protocol):
    @property
    def lease_id(self) -> int | None: ...
    @property
    def outage_s(self) -> float: ...


def registry_ready(registry: Lease) -> Check:
    """Registered in etcd under a lease, and etcd answering."""

    async def check() -> str | None:
        if registry.lease_id is None:
            return "etcd: not registered"
        if registry.outage_s > 0:
            return f"etcd: not answering for {registry.outage_s:.1f} s"
        return None

    return check
