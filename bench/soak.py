"""``python -m bench soak-memory``: the dispatcher's and the worker's RSS over a long crawl.

The bench site (the tree shape), an embedded nats-server and etcd, and one ``python -m jetcrawl
dispatcher`` and one ``python -m jetcrawl worker`` process (the commands compose runs) with
``recrawl_after_s``: the harness publishes the site's seeds once per cycle, a little longer than
a mark lives, so every cycle re-admits and re-fetches the whole site. Every ``sample_s`` it reads
both services' RSS (and nats-server's) and the pages fetched so far. Reported: the samples as a
table, and each process's RSS slope (least squares, MB per hour) after a warm-up — flat memory
is a slope near zero over many cycles, whatever the level.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson
from nats.js import JetStreamContext

from bench.memory import topology_ready
from bench.procs import child_env, read_stat
from bench.siteserver import SiteServer
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import RESULTS_STREAM, SEEDS
from jetcrawl.local.embedded import EtcdServer, NatsServer
from jetcrawl.plumbing.bus import connect
from tests.support.site.tree import SiteSpec, generate

__all__ = ["SoakResult", "SoakSample", "measure_soak", "slope_per_hour", "soak_markdown"]

MAX_DEPTH = 100
SHARDS = 16
WARMUP_FRACTION = 0.2  # the first fifth of the samples is left out of the slopes (caches fill)
TICK_S = 0.5


@dataclass(frozen=True, slots=True)
class SoakSample:
    minute: float
    pages: int  # results stored so far
    cycles: int  # seed publications so far
    dispatcher_rss_mb: float
    worker_rss_mb: float
    nats_rss_mb: float


@dataclass(slots=True)
class SoakResult:
    minutes: float
    site_pages: int
    recrawl_after_s: float
    cycle_s: float
    sample_s: float
    samples: list[SoakSample] = field(default_factory=list)

    def slopes(self) -> dict[str, float]:
        """RSS slope of each process after the warm-up, MB per hour."""
        kept = self.samples[int(len(self.samples) * WARMUP_FRACTION) :]
        xs = [s.minute / 60 for s in kept]
        return {
            name: slope_per_hour(xs, [getattr(s, f"{name}_rss_mb") for s in kept])
            for name in ("dispatcher", "worker", "nats")
        }

    def to_dict(self) -> dict[str, object]:
        return asdict(self) | {"slopes_mb_per_hour": self.slopes()}


def slope_per_hour(hours: list[float], values: list[float]) -> float:
    """The least-squares slope of ``values`` over ``hours`` (0 with fewer than two points)."""
    n = len(hours)
    if n < 2:
        return 0.0
    mx, my = sum(hours) / n, sum(values) / n
    var = sum((x - mx) ** 2 for x in hours)
    if var == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in zip(hours, values, strict=True)) / var


async def measure_soak(
    minutes: float,
    pages: int,
    recrawl_after_s: float,
    sample_s: float,
    work_dir: Path,
    progress: Callable[[SoakSample], None] | None = None,
) -> SoakResult:
    spec = SiteSpec(hosts=20, pages=pages)
    cycle_s = recrawl_after_s * 1.1 + 1
    result = SoakResult(minutes, pages, recrawl_after_s, cycle_s, sample_s)
    with (
        tempfile.TemporaryDirectory(prefix="bench-soak-", dir=work_dir) as tmp,
        SiteServer(spec, 2, work_dir / "logs") as site,
    ):
        seeds = list(generate(spec).expected(site.authorities).seeds)
        async with (
            NatsServer(Path(tmp) / "nats") as nats,
            EtcdServer(Path(tmp) / "etcd") as etcd,
        ):
            assert nats.pid is not None
            env = {
                "JETCRAWL_RECRAWL_AFTER_S": str(recrawl_after_s),
                "JETCRAWL_ALLOW_NETS": "127.0.0.0/8",
                "JETCRAWL_HOST_DELAY_S": "0",
                "JETCRAWL_HOST_CONCURRENCY": "8",
                "JETCRAWL_SHARDS": str(SHARDS),
            }
            common = ["--nats", nats.url]
            dispatcher = await _spawn(["dispatcher", *common], env, Path(tmp), work_dir)
            worker = await _spawn(["worker", *common, "--etcd", etcd.url], env, Path(tmp), work_dir)
            nc = await connect(Settings(nats_url=nats.url), "bench-soak")
            try:
                await topology_ready(nc.jetstream(), dispatcher)
                await _run(nc.jetstream(), seeds, (dispatcher, worker), nats.pid, result, progress)
            finally:
                await nc.close()
                for proc in (worker, dispatcher):
                    if proc.returncode is None:
                        proc.send_signal(signal.SIGTERM)
                    await proc.wait()
    return result


async def _spawn(
    args: list[str], env: dict[str, str], cwd: Path, log_dir: Path
) -> asyncio.subprocess.Process:
    log = (log_dir / f"soak-{args[0]}.log").open("wb")
    try:
        return await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "jetcrawl", *args],
            env=child_env(env),
            cwd=cwd,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
        )
    finally:
        log.close()  # the child has its own descriptor


async def _run(
    js: JetStreamContext,
    seeds: list[str],
    services: tuple[asyncio.subprocess.Process, asyncio.subprocess.Process],
    nats_pid: int,
    result: SoakResult,
    progress: Callable[[SoakSample], None] | None,
) -> None:
    body = orjson.dumps([{"url": s, "scope": "any", "max_depth": MAX_DEPTH} for s in seeds])
    started = time.monotonic()
    end = started + result.minutes * 60
    next_seed, next_sample, cycles = started, started, 0
    while True:
        now = time.monotonic()
        if any(p.returncode is not None for p in services):
            raise RuntimeError("the dispatcher or the worker exited (see soak-*.log)")
        if now >= next_seed and now < end:
            await js.publish(SEEDS, body)
            cycles += 1
            next_seed += result.cycle_s
        if now >= next_sample:
            stats = [read_stat(p.pid) for p in services] + [read_stat(nats_pid)]
            if any(s is None for s in stats):
                raise RuntimeError("a process of the soak exited (see soak-*.log)")
            d, w, n = (s.rss_bytes / 2**20 for s in stats if s is not None)
            pages = (await js.stream_info(RESULTS_STREAM)).state.messages
            sample = SoakSample(round((now - started) / 60, 2), pages, cycles, d, w, n)
            result.samples.append(sample)
            if progress is not None:
                progress(sample)
            next_sample += result.sample_s
            if now >= end:
                return
        await asyncio.sleep(TICK_S)


def soak_markdown(result: SoakResult) -> str:
    slopes = result.slopes()
    lines = [
        f"## Memory over a {result.minutes:g}-minute crawl (python -m bench soak-memory)",
        "",
        f"Site: 20 hosts, {result.site_pages:,} pages; marks live {result.recrawl_after_s:g} s; "
        f"the seeds are published every {result.cycle_s:g} s, so each cycle re-crawls the site.",
        "",
        "| minute | pages fetched | cycles | dispatcher RSS MB | worker RSS MB "
        "| nats-server RSS MB |",
        "|---|---|---|---|---|---|",
        *(
            f"| {s.minute:g} | {s.pages:,} | {s.cycles} | {s.dispatcher_rss_mb:.1f} "
            f"| {s.worker_rss_mb:.1f} | {s.nats_rss_mb:.1f} |"
            for s in result.samples
        ),
        "",
        f"RSS slope after the first {WARMUP_FRACTION:.0%} of the samples (least squares): "
        f"dispatcher {slopes['dispatcher']:+.1f} MB/h, worker {slopes['worker']:+.1f} MB/h, "
        f"nats-server {slopes['nats']:+.1f} MB/h.",
        "",
    ]
    return "\n".join(lines)
