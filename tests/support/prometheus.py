"""A real Prometheus for tests: scraping given ``/metrics`` ports, answering PromQL.

``Prometheus(workdir, {"w1": port, ...})`` runs the ``prometheus`` binary (the Debian package's;
``binary()`` is None without it) as a ``ServerProcess`` like the embedded nats-server and etcd:
its TSDB, config and log under ``workdir``, its web port picked free, readiness the log line it
writes when ``/-/ready`` starts answering 200 (then checked on the endpoint), a ``level=error``
line from ``main.go`` (bad config, port taken: it exits next) failing the start with the log tail.

Each target is a job of its own, named by its key and scraped every ``SCRAPE_INTERVAL_S``, so
``up{job="w1"}`` is that target's health. ``query(promql)`` is an instant query over the HTTP API
(``/api/v1/query``); ``value(promql)`` the single number of one that sums, and ``wait_value()``
waits for that number to pass a test, failing with the last answer; ``wait_up()`` waits for
every target to be up and otherwise says which is not and why (``/api/v1/targets``).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson

from jetcrawl.local.embedded.process import (
    LOOPBACK,
    READY_TIMEOUT_S,
    STOP_TIMEOUT_S,
    EmbeddedServerError,
    ServerProcess,
)
from tests.support.scrape import free_port
from tests.support.streams import eventually

BINARY = "prometheus"
SCRAPE_INTERVAL_S = 0.5
# rate() needs two samples in its range; four scrape intervals leave room for a late scrape.
RATE_RANGE = "2s"
READY_LINE = 'msg="Server is ready to receive web requests."'
UP_WITHIN_S = 20.0
ANSWER_WITHIN_S = 30.0
THREADS = 1  # GOMAXPROCS: a few targets twice a second need no more of a shared machine


def binary() -> Path | None:
    """The ``prometheus`` binary on PATH, or None."""
    found = shutil.which(BINARY)
    return Path(found) if found else None


class QueryError(Exception):
    """Prometheus refused a query: ``error_type`` and ``error`` are its own words."""

    def __init__(self, promql: str, status: int, error_type: str, error: str) -> None:
        super().__init__(f"{promql!r}: HTTP {status}, {error_type}: {error}")
        self.promql = promql
        self.status = status
        self.error_type = error_type
        self.error = error


@dataclass(frozen=True, slots=True)
class Sample:
    """One element of an instant vector."""

    labels: dict[str, str]
    value: float


@dataclass(frozen=True, slots=True)
class Target:
    """One scrape target as ``/api/v1/targets`` reports it."""

    job: str
    url: str
    health: str  # "up", "down" or "unknown" (not scraped yet)
    last_error: str


class Prometheus(ServerProcess):
    """Async context manager: a started Prometheus scraping ``targets`` (job name -> port)."""

    def __init__(
        self,
        workdir: Path,
        targets: Mapping[str, int],
        *,
        ready_timeout_s: float = READY_TIMEOUT_S,
        stop_timeout_s: float = STOP_TIMEOUT_S,
        threads: int | None = THREADS,
    ) -> None:
        super().__init__(
            "prometheus",
            workdir / "prometheus.log",
            ready_timeout_s=ready_timeout_s,
            stop_timeout_s=stop_timeout_s,
            threads=threads,
        )
        self.workdir = workdir
        self.targets = dict(targets)
        self.port = free_port()

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def config_path(self) -> Path:
        return self.workdir / "prometheus.yml"

    def config(self) -> dict[str, object]:
        interval = f"{int(SCRAPE_INTERVAL_S * 1000)}ms"
        return {
            "global": {
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "evaluation_interval": interval,
            },
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [f"{LOOPBACK}:{port}"]}]}
                for job, port in self.targets.items()
            ],
        }

    # ServerProcess

    def _command(self) -> list[str]:
        found = binary()
        if found is None:
            raise EmbeddedServerError(
                self.name, f"{BINARY} is not on PATH (apt-get install prometheus)"
            )
        return [
            str(found),
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.workdir / 'tsdb'}",
            f"--web.listen-address={LOOPBACK}:{self.port}",
            "--log.level=info",
        ]

    def _prepare(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        # JSON is YAML: no YAML writer needed for a config nobody edits by hand.
        self.config_path.write_bytes(orjson.dumps(self.config(), option=orjson.OPT_INDENT_2))

    def _parse(self, line: str) -> None:
        if READY_LINE in line:
            self._ready = True

    def _is_fatal(self, line: str) -> bool:
        return "level=error" in line and "caller=main.go" in line

    async def start(self) -> None:
        await super().start()
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{self.url}/-/ready") as response,
        ):
            if response.status != 200:
                error = self._error(f"logged ready, but /-/ready answers {response.status}")
                await self.stop()
                raise error

    # The HTTP API

    async def _api(self, path: str, params: dict[str, str], promql: str = "") -> object:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{self.url}/api/v1/{path}", params=params) as response,
        ):
            doc = orjson.loads(await response.read())
        if doc.get("status") != "success":
            raise QueryError(
                promql, response.status, doc.get("errorType", ""), doc.get("error", "")
            )
        return doc["data"]

    async def query(self, promql: str) -> list[Sample]:
        """An instant query now; a scalar result comes back as one sample without labels."""
        data = await self._api("query", {"query": promql}, promql)
        assert isinstance(data, dict)
        if data["resultType"] == "scalar":
            return [Sample({}, float(data["result"][1]))]
        if data["resultType"] != "vector":
            raise QueryError(promql, 200, "unexpected", f"a {data['resultType']}, not a vector")
        return [Sample(r["metric"], float(r["value"][1])) for r in data["result"]]

    async def value(self, promql: str) -> float | None:
        """The one number a query answers (``sum(...)``), or None while it has no samples."""
        samples = await self.query(promql)
        if len(samples) > 1:
            raise QueryError(promql, 200, "unexpected", f"{len(samples)} samples, not one")
        return samples[0].value if samples else None

    async def wait_value(
        self, promql: str, ok: Callable[[float | None], bool], within_s: float = ANSWER_WITHIN_S
    ) -> float | None:
        """``value(promql)`` once ``ok`` holds for it; if not in time, fail with its last answer."""
        last: list[float | None] = []

        async def holds() -> bool:
            last[:] = [await self.value(promql)]
            return ok(last[0])

        try:
            await eventually(holds, within_s)
        except TimeoutError:
            raise AssertionError(
                f"prometheus: {promql} still answers {last[0] if last else 'nothing'} "
                f"after {within_s:g} s"
            ) from None
        return last[0]

    async def scrape_targets(self) -> list[Target]:
        data = await self._api("targets", {"state": "active"})
        assert isinstance(data, dict)
        return [
            Target(t["labels"]["job"], t["scrapeUrl"], t["health"], t["lastError"])
            for t in data["activeTargets"]
        ]

    async def up(self) -> dict[str, float]:
        """``up`` per job: 1 if its last scrape answered, 0 if not; absent before the first."""
        return {s.labels["job"]: s.value for s in await self.query("up")}

    async def wait_up(self, within_s: float = UP_WITHIN_S) -> None:
        """Until ``up`` is 1 for every target; if not in time, fail naming the ones down."""
        want = dict.fromkeys(self.targets, 1.0)

        async def all_up() -> bool:
            return await self.up() == want

        try:
            await eventually(all_up, within_s)
        except TimeoutError:
            down = [t for t in await self.scrape_targets() if t.health != "up"]
            lines = [f"{t.job} {t.url}: {t.health} ({t.last_error or 'no error'})" for t in down]
            raise AssertionError(
                f"prometheus: not every target up after {within_s:g} s: up = {await self.up()}\n"
                + "\n".join(lines)
            ) from None
