"""A service's readiness: named checks that ``/readyz`` (:mod:`jetcrawl.plumbing.endpoint`) answers.

The service adds its checks as its parts come up (NATS connected and the topology present; for a
worker, registered in etcd with etcd answering), so a service still starting is alive but not
ready. Apart from the endpoint so that a service without one never imports aiohttp's server.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError

from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import FRONTIER_STREAM, SHARDS_METADATA_KEY, shard_tasks_stream

__all__ = ["Readiness", "nats_ready", "registry_ready"]

log = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 2.0

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


def nats_ready(nc: NATS, settings: Settings) -> Check:
    """Connected to NATS, and the topology is there with our shard count."""

    async def check() -> str | None:
        if not nc.is_connected:
            return "nats: not connected"
        js = nc.jetstream()
        tasks = shard_tasks_stream(0, settings)
        try:
            await js.stream_info(FRONTIER_STREAM)
            info = await js.stream_info(tasks)
        except NatsError as e:
            return f"topology: {e!r}"
        recorded = (info.config.metadata or {}).get(SHARDS_METADATA_KEY)
        if recorded != str(settings.shards):
            return f"topology: {tasks} has {recorded} shards, this service {settings.shards}"
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
