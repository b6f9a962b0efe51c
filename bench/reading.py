"""``python -m bench results``: reading the result records back, as ``jetcrawl results`` does.

An embedded nats-server with jetcrawl's topology; the harness publishes ``records`` synthetic
result records (the shape a worker writes, as the ceiling's) and reads them all with
``jetcrawl.ops.results.read_results`` — once pulling with ``jetcrawl.plumbing.pull`` (what it uses)
and once with nats-py's ``fetch`` (the baseline), alternately, ``reps`` times each. Reported per
reader: records/s and the reading process's CPU per record (decoding each into a ``Result``
included).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from nats.aio.msg import Msg
from nats.js import JetStreamContext

import jetcrawl.ops.results
from bench.ceiling import publish_all, result_record
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import result_subject
from jetcrawl.local.embedded import NatsServer
from jetcrawl.ops.results import Query, read_results
from jetcrawl.plumbing.bus import Outbox, Outgoing, connect
from jetcrawl.plumbing.pull import pull
from jetcrawl.plumbing.topology import ensure

__all__ = ["ReadingResult", "measure_reading", "reading_markdown"]

SHARDS = 8
Reader = Callable[[JetStreamContext.PullSubscription, int, float], Awaitable[list[Msg]]]


async def _fetch(sub: JetStreamContext.PullSubscription, batch: int, wait_s: float) -> list[Msg]:
    return await sub.fetch(batch, timeout=wait_s)


READERS: dict[str, Reader] = {"jetcrawl.plumbing.pull": pull, "nats-py fetch (baseline)": _fetch}


@dataclass(frozen=True, slots=True)
class ReaderFigures:
    reader: str
    records_per_s: float
    cpu_us_per_record: float
    runs: int


@dataclass(frozen=True, slots=True)
class ReadingResult:
    records: int
    readers: tuple[ReaderFigures, ...]

    def to_dict(self) -> dict[str, object]:
        return {"records": self.records, "readers": [asdict(r) for r in self.readers]}


def record(n: int) -> bytes:
    """The ``n``-th synthetic result record."""
    return result_record(
        f"http://host{n % 20}.example/page-{n}.html", f"{n:032x}", n % SHARDS
    ).to_wire()


async def measure_reading(records: int, reps: int) -> ReadingResult:
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in READERS}
    with tempfile.TemporaryDirectory(prefix="bench-reading-") as tmp:
        async with NatsServer(Path(tmp) / "nats") as server:
            settings = Settings(nats_url=server.url, shards=SHARDS)
            nc = await connect(settings, "bench-reading")
            try:
                js = nc.jetstream()
                await ensure(js, settings)
                await publish_all(
                    Outbox(nc),
                    [Outgoing(result_subject(n % SHARDS), record(n), {}) for n in range(records)],
                )
                for _ in range(reps):
                    for name, reader in READERS.items():
                        samples[name].append(await _read_all(js, reader, records))
            finally:
                await nc.close()
    figures = tuple(
        ReaderFigures(
            reader=name,
            records_per_s=statistics.median(records / wall for wall, _ in runs),
            cpu_us_per_record=statistics.median(cpu / records * 1e6 for _, cpu in runs),
            runs=len(runs),
        )
        for name, runs in samples.items()
    )
    return ReadingResult(records, figures)


async def _read_all(js: JetStreamContext, reader: Reader, records: int) -> tuple[float, float]:
    """Wall and CPU seconds to read every record through ``read_results`` with ``reader``."""
    original = jetcrawl.ops.results.pull
    # The one call read_results makes to pull a batch; the baseline lacks pull()'s cut.
    jetcrawl.ops.results.pull = reader  # type: ignore[assignment]
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        count = 0
        async for _ in read_results(js, Query()):
            count += 1
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        jetcrawl.ops.results.pull = original
    if count != records:
        raise RuntimeError(f"read {count} records of {records}")
    return wall, cpu


def reading_markdown(result: ReadingResult) -> str:
    lines = [
        "# Reading results back (`jetcrawl results`)",
        "",
        f"{result.records:,} result records on a fresh nats-server, read through "
        "`read_results` by each reader in turn; medians.",
        "",
        "| reader | records/s | CPU µs per record | runs |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {r.reader} | {r.records_per_s:,.0f} | {r.cpu_us_per_record:.1f} | {r.runs} |"
        for r in result.readers
    ]
    return "\n".join(lines) + "\n"
