"""``python -m bench results``: reading the result records back, as ``jetcrawl results`` does.

An embedded nats-server with jetcrawl's topology; the harness publishes ``records`` synthetic
result records (the shape a worker writes, ~600 bytes) and reads them all with
``jetcrawl.results.read_results`` — once pulling with ``jetcrawl.pull`` (what it uses) and once
with nats-py's ``fetch`` (the baseline), alternately, ``reps`` times each. Reported per reader:
records/s and the reading process's CPU per record (decoding each into a ``Result`` included).
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

import jetcrawl.results
from jetcrawl.bus import Outbox, Outgoing, PublishFailed, connect
from jetcrawl.embedded import NatsServer
from jetcrawl.messages import Result
from jetcrawl.pull import pull
from jetcrawl.results import Query, read_results
from jetcrawl.settings import Settings
from jetcrawl.topology import ensure, result_subject

__all__ = ["ReadingResult", "measure_reading", "reading_markdown"]

SHARDS = 8
PUBLISH_BATCH = 256
Reader = Callable[[JetStreamContext.PullSubscription, int, float], Awaitable[list[Msg]]]


async def _fetch(sub: JetStreamContext.PullSubscription, batch: int, wait_s: float) -> list[Msg]:
    return await sub.fetch(batch, timeout=wait_s)


READERS: dict[str, Reader] = {"jetcrawl.pull": pull, "nats-py fetch (baseline)": _fetch}


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
    """The ``n``-th synthetic result record, as a worker would write it."""
    url = f"http://host{n % 20}.example/section/{n // 20}/page-{n}.html"
    return Result(
        url=url,
        fp=f"{n:032x}",
        job="default",
        depth=n % 5,
        parent=f"http://host{n % 20}.example/section/{n // 20}/",
        outcome="fetched",
        status=200,
        final_url=url,
        redirects=(),
        content_type="text/html",
        length=4096,
        title=f"Page {n}",
        outlinks=30,
        fetched_at=1_790_000_000.0 + n,
        elapsed_ms=2.5,
        shard=n % SHARDS,
        fence=7,
        worker="worker-1",
        headers={"last-modified": "Sun, 29 Nov 2026 10:00:00 GMT", "etag": f'"{n:x}"'},
        payload_digest="sha1:" + "A" * 32,
        trace_id="0" * 32,
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
                outbox = Outbox(nc)
                for start in range(0, records, PUBLISH_BATCH):
                    batch = [
                        Outgoing(result_subject(n % SHARDS), record(n), {})
                        for n in range(start, min(records, start + PUBLISH_BATCH))
                    ]
                    acks = await outbox.send(batch)
                    if any(isinstance(ack, PublishFailed) for ack in acks):
                        raise RuntimeError("JetStream refused result records")
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
    original = jetcrawl.results.pull
    # The one call read_results makes to pull a batch; the baseline lacks pull()'s cut.
    jetcrawl.results.pull = reader  # type: ignore[assignment]
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        count = 0
        async for _ in read_results(js, Query()):
            count += 1
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        jetcrawl.results.pull = original
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
