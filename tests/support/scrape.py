"""Reading a service's HTTP endpoint in tests: Prometheus samples, health and readiness."""

from __future__ import annotations

import os
import random
import socket
from dataclasses import dataclass

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

# Below Linux's ephemeral range (32768-60999), where every outgoing connection takes its local
# port: a port the OS hands out as free there is often taken again before the service binds it.
PORTS = range(20000, 32000)


def free_port() -> int:
    """A TCP port free on every address now, for a service's ``metrics_port``."""
    ports = _share()
    while True:
        port = random.choice(ports)
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port


def _share() -> range:
    """This process's part of PORTS: pytest-xdist's workers draw from disjoint parts, so two
    tests running at once never pick the same port."""
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return PORTS[index::workers]


@dataclass(frozen=True, slots=True)
class Samples:
    """Every sample of one scrape: (name, sorted label pairs) -> value."""

    values: dict[tuple[str, tuple[tuple[str, str], ...]], float]

    def get(self, name: str, **labels: str) -> float:
        return self.values[(name, tuple(sorted(labels.items())))]

    def total(self, name: str, **labels: str) -> float:
        """The sum over every sample of ``name`` whose labels include ``labels``."""
        want = set(labels.items())
        return sum(v for (n, ls), v in self.values.items() if n == name and want <= set(ls))


async def scrape(port: int) -> Samples:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        response.raise_for_status()
        text = await response.text()
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return Samples(values)


async def probe(port: int, path: str) -> tuple[int, dict[str, object]]:
    """``/healthz`` or ``/readyz``: the status, and the JSON body (``{}`` if not JSON)."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}{path}") as response,
    ):
        body = await response.read()
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            doc = {}
        return response.status, doc if isinstance(doc, dict) else {}
