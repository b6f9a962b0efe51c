"""A crawl mesh for tests: the real services as processes against real servers.

``Mesh`` runs ``python -m jetcrawl dispatcher`` and ``python -m jetcrawl worker`` processes (the
commands compose runs) against a test's nats-server and etcd, with timings shrunk through
``JETCRAWL_*`` settings, and reads back what they did: ownership from etcd, results from
``CRAWL_RESULTS``, drained-ness from :mod:`jetcrawl.local.drain`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

import orjson
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from jetcrawl.contract.messages import Result
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import RESULTS_STREAM, SEEDS
from jetcrawl.local.drain import Snapshot, snapshot
from jetcrawl.plumbing.bus import connect
from jetcrawl.plumbing.topology import ensure
from jetcrawl.registry import read_ownership
from tests.support import faulty
from tests.support.ledger import Tap
from tests.support.streams import eventually, stored

SHARDS = 16
TOPOLOGY_WITHIN_S = 60.0


@dataclass(slots=True)
class Service:
    name: str
    proc: asyncio.subprocess.Process
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    async def wait(self, within_s: float = 30) -> int:
        async with asyncio.timeout(within_s):
            return await self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


class Mesh:
    def __init__(self, nats_url: str, etcd_url: str, workdir: Path, **settings: object) -> None:
        defaults: dict[str, object] = {
            "shards": SHARDS,
            "lease_ttl_s": 3.0,
            "ack_wait_s": 4.0,
            "etcd_timeout_s": 2.0,
            "concurrency": 4,
            "drain_deadline_s": 10.0,
            "allow_nets": ("127.0.0.0/8",),
            "host_delay_s": 0.0,  # the product's 1 s per host would make every crawl minutes
            "topology_wait_s": TOPOLOGY_WITHIN_S,
        }
        self.settings = Settings(nats_url=nats_url, etcd_url=etcd_url, **{**defaults, **settings})  # type: ignore[arg-type]
        self._workdir = workdir
        self.services: dict[str, Service] = {}
        self._nc: NATS | None = None
        self.tap = Tap()  # tasks and results on the wire, to explain a lost URL

    async def __aenter__(self) -> Self:
        # The services' own connection: every URL of a cluster, reconnecting forever.
        self._nc = await connect(self.settings, "mesh")
        await self.tap.start(self._nc)
        await self._ensure_topology()
        return self

    async def _ensure_topology(self) -> None:
        """The topology, waited for (``topology_wait_s``) while a young cluster cannot take it:
        a stream create can outlast its 5 s request on a busy machine, and the meta leader can
        count a peer offline for a moment after the cluster fixture's probe stream placed (CI
        once saw it refuse KV_crawl_seen after the streams before it)."""
        await ensure(self.js, self.settings)

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        for service in self.services.values():
            if service.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    service.signal(signal.SIGKILL)
                await service.proc.wait()
        if self._nc is not None:
            await self._nc.close()

    @property
    def js(self) -> JetStreamContext:
        assert self._nc is not None
        return self._nc.jetstream()

    # ------------------------------------------------------------------ services

    async def start(
        self,
        role: str,
        name: str,
        *,
        fault: str | None = None,
        prefix: Sequence[str] = (),
        **env: str,
    ) -> Service:
        """``jetcrawl ROLE`` as ``name``; with ``fault``, crashing on it (support/faulty.py);
        behind ``prefix`` (a network namespace's ``ip netns exec NS``, support/netns.py)."""
        log_path = self._workdir / f"{name}.log"
        with log_path.open("wb") as log_file:
            proc = await asyncio.create_subprocess_exec(
                *prefix,
                *faulty.command(fault),
                "--log-level",
                "INFO",
                role,
                env=faulty.environ(
                    {
                        # Tracing is on only where a test asks for it (OTEL_* in ``env``).
                        **{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
                        **self.settings.to_env(),
                        "JETCRAWL_WORKER_ID": name,
                        **env,
                    }
                ),
                stdout=log_file,
                stderr=asyncio.subprocess.STDOUT,
            )
        service = Service(name, proc, log_path)
        self.services[name] = service
        return service

    async def start_workers(self, *names: str) -> list[Service]:
        return [await self.start("worker", name) for name in names]

    # ------------------------------------------------------------------ reading state

    async def seed(self, urls: list[str], scope: str = "any", job: str | None = None) -> None:
        assert self._nc is not None
        seeds = [{"url": url, "scope": scope} | ({"job": job} if job else {}) for url in urls]
        await self.js.publish(SEEDS, orjson.dumps(seeds))

    async def ownership(self) -> dict[int, str]:
        return await read_ownership(self.settings)

    async def wait_ownership(self, owners: set[str], within_s: float = 20) -> dict[int, str]:
        """Until every shard is owned, by exactly ``owners``, balanced to one shard."""
        latest: dict[int, str] = {}

        async def settled() -> bool:
            nonlocal latest
            latest = await self.ownership()
            counts = [list(latest.values()).count(o) for o in owners]
            return (
                len(latest) == self.settings.shards
                and set(latest.values()) == owners
                and max(counts) - min(counts) <= 1
            )

        await eventually(settled, within_s)
        return latest

    async def results(self) -> list[Result]:
        return [Result.from_wire(m.data) for m in await stored(self.js, RESULTS_STREAM)]

    async def result_count(self) -> int:
        return (await self.js.stream_info(RESULTS_STREAM)).state.messages

    async def wait_results(self, at_least: int, within_s: float = 60) -> None:
        async def enough() -> bool:
            return await self.result_count() >= at_least

        await eventually(enough, within_s)

    async def wait_drained(self, within_s: float = 90) -> Snapshot:
        previous: Snapshot | None = None
        current: Snapshot | None = None

        async def settled() -> bool:
            nonlocal previous, current
            previous, current = current, await snapshot(self.js, self.settings.shards)
            return current.settled_after(previous)

        await eventually(settled, within_s)
        assert current is not None
        return current
