"""``python -m bench memory``: the dispatcher's memory stays flat while its seen set grows.

An embedded nats-server and one ``python -m jetcrawl dispatcher`` process; the harness publishes
``urls`` distinct synthetic seed URLs (``PER_MESSAGE`` per ``crawl.seeds`` message, one per line,
over ``HOSTS`` hosts) as fast as JetStream takes them, and samples while the dispatcher admits
them: the count of marks in the ``KV_crawl_seen`` stream and the dispatcher's RSS. Reported: RSS
at checkpoints (100k and the end, among others), admissions per second, the dispatcher's CPU per
admission, and the KV store's bytes on disk per URL. No page is fetched; the admitted tasks wait
in ``CRAWL_TASKS``.
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

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from bench.procs import child_env, read_stat
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import (
    DISPATCH_CONSUMER,
    FRONTIER_STREAM,
    SEEDS,
    SEEN_STREAM,
    TASKS_STREAM,
)
from jetcrawl.local.embedded import NatsServer
from jetcrawl.plumbing.bus import Outbox, Outgoing, PublishFailed, connect

__all__ = ["Checkpoint", "MemoryResult", "measure_memory", "topology_ready"]

PER_MESSAGE = 32  # URLs per seed message: about a page's worth of new links
PUBLISH_BATCH = 256  # messages per pipelined publish
HOSTS = 5000
SAMPLE_EVERY_S = 0.5
STALL_TIMEOUT_S = 60.0
READY_TIMEOUT_S = 30.0
READY_POLL_S = 0.1  # nothing announces the topology: its consumer appearing is the sign


@dataclass(frozen=True, slots=True)
class Checkpoint:
    admitted: int
    seconds: float  # since the first publish
    dispatcher_rss_mb: float
    nats_rss_mb: float
    dispatcher_cpu_s: float


@dataclass(slots=True)
class MemoryResult:
    urls: int
    dedupe_cache_size: int
    checkpoints: list[Checkpoint] = field(default_factory=list)
    admitted: int = 0
    seconds: float = 0.0
    kv_disk_bytes: int = 0
    tasks_disk_bytes: int = 0
    peak_dispatcher_rss_mb: float = 0.0

    @property
    def admissions_per_s(self) -> float:
        return self.admitted / self.seconds if self.seconds > 0 else 0.0

    @property
    def kv_bytes_per_url(self) -> float:
        return self.kv_disk_bytes / self.admitted if self.admitted else 0.0

    @property
    def dispatcher_us_per_admission(self) -> float:
        last = self.checkpoints[-1] if self.checkpoints else None
        return 1e6 * last.dispatcher_cpu_s / last.admitted if last and last.admitted else 0.0

    def to_dict(self) -> dict[str, object]:
        return asdict(self) | {
            "admissions_per_s": self.admissions_per_s,
            "kv_bytes_per_url": self.kv_bytes_per_url,
            "dispatcher_us_per_admission": self.dispatcher_us_per_admission,
        }


def checkpoints_for(urls: int) -> list[int]:
    marks = {urls // 10, urls // 4, urls // 2, urls}
    if urls > 100_000:
        marks.add(100_000)
    return sorted(m for m in marks if m > 0)


async def measure_memory(
    urls: int, work_dir: Path, progress: Callable[[Checkpoint], None] | None = None
) -> MemoryResult:
    with tempfile.TemporaryDirectory(prefix="bench-memory-", dir=work_dir) as tmp:
        store = Path(tmp) / "nats"
        async with NatsServer(store) as server:
            assert server.pid is not None
            settings = Settings(nats_url=server.url)
            nc = await connect(settings, "bench-memory")
            try:
                js = nc.jetstream()
                result = MemoryResult(urls, Settings().dedupe_cache_size)
                dispatcher = await _spawn_dispatcher(server.url, Path(tmp), work_dir)
                try:
                    await topology_ready(js, dispatcher)
                    await _run(js, Outbox(nc), dispatcher.pid, server.pid, result, progress)
                finally:
                    if dispatcher.returncode is None:
                        dispatcher.send_signal(signal.SIGTERM)
                    await dispatcher.wait()
            finally:
                await nc.close()
            result.kv_disk_bytes = _disk_bytes(store, SEEN_STREAM)
            result.tasks_disk_bytes = _disk_bytes(store, TASKS_STREAM)
            return result


async def _spawn_dispatcher(nats_url: str, cwd: Path, log_dir: Path) -> asyncio.subprocess.Process:
    log = (log_dir / "memory-dispatcher.log").open("wb")
    try:
        return await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "jetcrawl", "dispatcher", "--nats", nats_url],
            env=child_env(),
            cwd=cwd,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
        )
    finally:
        log.close()  # the child has its own descriptor


async def topology_ready(js: JetStreamContext, dispatcher: asyncio.subprocess.Process) -> None:
    """Wait until the dispatcher has created the topology (its own version of it)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        try:
            await js.consumer_info(FRONTIER_STREAM, DISPATCH_CONSUMER)
            return
        except NotFoundError:
            pass
        if dispatcher.returncode is not None or time.monotonic() > deadline:
            raise RuntimeError("the dispatcher did not start (see memory-dispatcher.log)")
        await asyncio.sleep(READY_POLL_S)


async def _run(
    js: JetStreamContext,
    outbox: Outbox,
    dispatcher: int,
    server: int,
    result: MemoryResult,
    progress: Callable[[Checkpoint], None] | None,
) -> None:
    started = time.monotonic()
    publishing = asyncio.create_task(_publish(outbox, result.urls))
    marks = checkpoints_for(result.urls)
    last_progress, last_count = time.monotonic(), -1
    try:
        while marks:
            await asyncio.sleep(SAMPLE_EVERY_S)
            if publishing.done():
                publishing.result()  # a failed publish ends the run
            count = (await js.stream_info(SEEN_STREAM)).state.messages
            stat, nats_stat = read_stat(dispatcher), read_stat(server)
            if stat is None or nats_stat is None:
                raise RuntimeError(
                    "the dispatcher or nats-server exited (see memory-dispatcher.log)"
                )
            rss = stat.rss_bytes / 2**20
            result.peak_dispatcher_rss_mb = max(result.peak_dispatcher_rss_mb, rss)
            while marks and count >= marks[0]:
                marks.pop(0)
                checkpoint = Checkpoint(
                    admitted=count,
                    seconds=time.monotonic() - started,
                    dispatcher_rss_mb=rss,
                    nats_rss_mb=nats_stat.rss_bytes / 2**20,
                    dispatcher_cpu_s=stat.cpu_s,
                )
                result.checkpoints.append(checkpoint)
                if progress is not None:
                    progress(checkpoint)
            if count != last_count:
                last_progress, last_count = time.monotonic(), count
            elif time.monotonic() - last_progress > STALL_TIMEOUT_S:
                raise RuntimeError(f"no admission for {STALL_TIMEOUT_S:g} s at {count} URLs")
        await publishing
    finally:
        publishing.cancel()
    result.admitted = result.checkpoints[-1].admitted
    result.seconds = result.checkpoints[-1].seconds


async def _publish(outbox: Outbox, urls: int) -> None:
    messages: list[Outgoing] = []
    for start in range(0, urls, PER_MESSAGE):
        body = "\n".join(
            f"http://h{i % HOSTS}.bench.example/p/{i}"
            for i in range(start, min(urls, start + PER_MESSAGE))
        )
        messages.append(Outgoing(SEEDS, body.encode()))
        if len(messages) == PUBLISH_BATCH:
            await _send(outbox, messages)
            messages = []
    if messages:
        await _send(outbox, messages)


async def _send(outbox: Outbox, messages: list[Outgoing]) -> None:
    failed = [a for a in await outbox.send(messages) if isinstance(a, PublishFailed)]
    if failed:
        raise RuntimeError(f"{len(failed)} seed publishes failed, e.g. {failed[0]}")


def _disk_bytes(store: Path, stream: str) -> int:
    return sum(
        f.stat().st_size
        for d in store.rglob(stream)
        if d.is_dir()
        for f in d.rglob("*")
        if f.is_file()
    )
