"""The JetStream ceiling for jetcrawl's message mix: what one nats-server core carries.

Against an embedded nats-server with jetcrawl's own topology (file storage, duplicate window),
one client pushes each kind of message a crawled page causes through jetcrawl's ``Outbox``
(pipelined, ``BATCH`` at a time, each with its ``Nats-Msg-Id``) and pulls what the services pull
(``fetch(BATCH)`` and a plain ``ack()`` each, as the worker does):

    task publish        dispatcher -> crawl.tasks.<shard>
    seen create         dispatcher -> $KV.crawl_seen.<fp> (expected last subject sequence 0)
    result publish      worker -> crawl.results.<shard>
    links publish       worker -> crawl.discovered (one message of ~30 links per page)
    task pull + ack     worker, over every shard consumer
    links pull + ack    dispatcher, on the "dispatch" consumer

For each: messages per second from this one Python client, and CPU microseconds per message of
nats-server and of the client. A page costs one of each but the links messages (one seen create
per *new* URL; repeated links are answered by the dispatcher's cache), and a links message for
``links_per_page`` of a page (a worker gathers several pages' links into one, and leaves out the
links it sent before: the report sets it to what the crawls stored), so the weighted sum of
nats-server's microseconds is its CPU per page and ``1e6 /`` that sum the pages/s one
nats-server core sustains.
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from nats.js import JetStreamContext

from bench.procs import cpu_seconds, self_cpu_s
from jetcrawl.contract.messages import Discovered, Lineage, Result, Task
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import (
    DISCOVERED,
    DISPATCH_CONSUMER,
    FRONTIER_STREAM,
    SEEN_SUBJECT_PREFIX,
    TASKS_STREAM,
    lane_config,
    lane_consumer,
    result_subject,
    task_subject,
)
from jetcrawl.contract.urls import fingerprint, host_of, shard_of
from jetcrawl.local.embedded import NatsServer
from jetcrawl.plumbing.bus import (
    EXPECTED_LAST_SUBJECT_SEQ,
    MSG_ID,
    Outbox,
    Outgoing,
    PublishFailed,
    connect,
)
from jetcrawl.plumbing.topology import ensure

__all__ = ["Ceiling", "Phase", "measure_ceiling", "publish_all", "result_record"]

BATCH = 256
LINKS_PER_PAGE = 30
HOSTS = 1000
PULL_WAIT_S = 0.2


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    messages: int
    payload_bytes: int  # per message
    seconds: float
    server_cpu_s: float
    client_cpu_s: float

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    @property
    def server_us(self) -> float:
        return 1e6 * self.server_cpu_s / self.messages

    @property
    def client_us(self) -> float:
        return 1e6 * self.client_cpu_s / self.messages

    def to_dict(self) -> dict[str, object]:
        return asdict(self) | {
            "rate": self.rate,
            "server_us": self.server_us,
            "client_us": self.client_us,
        }


LINKS_PHASES = frozenset({"links publish", "links pull + ack"})


@dataclass(frozen=True, slots=True)
class Ceiling:
    phases: list[Phase]
    links_per_page: float = 1.0  # links messages per page: the weight of the links phases

    def weight(self, phase: Phase) -> float:
        return self.links_per_page if phase.name in LINKS_PHASES else 1.0

    @property
    def server_us_per_page(self) -> float:
        return sum(self.weight(p) * p.server_us for p in self.phases)

    @property
    def client_us_per_page(self) -> float:
        return sum(self.weight(p) * p.client_us for p in self.phases)

    @property
    def pages_per_server_core(self) -> float:
        """Pages/s one fully busy nats-server core carries for this mix."""
        us = self.server_us_per_page
        return 1e6 / us if us > 0 else 0.0

    def to_dict(self) -> dict[str, object]:
        return {
            "phases": [p.to_dict() for p in self.phases],
            "links_per_page": self.links_per_page,
            "server_us_per_page": self.server_us_per_page,
            "client_us_per_page": self.client_us_per_page,
            "pages_per_server_core": self.pages_per_server_core,
        }


async def measure_ceiling(messages: int, work_dir: Path | None = None) -> Ceiling:
    with tempfile.TemporaryDirectory(prefix="bench-ceiling-", dir=work_dir) as tmp:
        async with NatsServer(Path(tmp) / "nats") as server:
            assert server.pid is not None
            settings = Settings(nats_url=server.url)
            nc = await connect(settings, "bench-ceiling")
            try:
                js = nc.jetstream()
                await ensure(js, settings)
                return await _phases(js, Outbox(nc), settings, server.pid, messages)
            finally:
                await nc.close()


async def _phases(
    js: JetStreamContext, outbox: Outbox, settings: Settings, server_pid: int, n: int
) -> Ceiling:
    lineage = Lineage(job="default", scope="any", root="", max_depth=16)
    urls = [f"http://h{i % HOSTS}.bench.example/s{i % 8}/{i}.html" for i in range(n)]
    fps = [fingerprint(url) for url in urls]
    shards = [shard_of(host_of(url), settings.shards) for url in urls]
    per_shard = Counter(shards)
    parent = "http://h0.bench.example/"
    tasks = [
        Outgoing(
            task_subject(shard),
            Task(url, fp, 2, lineage, parent=parent).to_wire(),
            {MSG_ID: fp},
        )
        for url, fp, shard in zip(urls, fps, shards, strict=True)
    ]
    creates = [
        Outgoing(f"{SEEN_SUBJECT_PREFIX}{fp}", b"12345", {EXPECTED_LAST_SUBJECT_SEQ: "0"})
        for fp in fps
    ]
    results = [
        Outgoing(result_subject(shard), result_record(url, fp, shard).to_wire(), {MSG_ID: fp})
        for url, fp, shard in zip(urls, fps, shards, strict=True)
    ]
    links = [
        Outgoing(
            DISCOVERED,
            Discovered(
                url, fp, 3, lineage, tuple(urls[(i + k * 7919) % n] for k in range(30))
            ).to_wire(),
            {MSG_ID: f"links-{fp}"},
        )
        for i, (url, fp) in enumerate(zip(urls, fps, strict=True))
    ]

    async def measure(name: str, size: int, work: Callable[[], Awaitable[None]]) -> Phase:
        server_before, client_before = cpu_seconds(server_pid), self_cpu_s()
        started = time.perf_counter()
        await work()
        seconds = time.perf_counter() - started
        return Phase(
            name,
            n,
            size,
            seconds,
            cpu_seconds(server_pid) - server_before,
            self_cpu_s() - client_before,
        )

    phases = [
        await measure("task publish", len(tasks[0].payload), lambda: publish_all(outbox, tasks)),
        await measure("seen create", len(creates[0].payload), lambda: publish_all(outbox, creates)),
        await measure(
            "result publish", len(results[0].payload), lambda: publish_all(outbox, results)
        ),
        await measure("links publish", len(links[0].payload), lambda: publish_all(outbox, links)),
        await measure(
            "task pull + ack",
            len(tasks[0].payload),
            lambda: _pull_lanes(js, settings, per_shard),
        ),
        await measure(
            "links pull + ack",
            len(links[0].payload),
            lambda: _pull(js, [(FRONTIER_STREAM, DISPATCH_CONSUMER, n)]),
        ),
    ]
    return Ceiling(phases)


def result_record(url: str, fp: str, shard: int) -> Result:
    """A result record of the shape a worker writes for a fetched page."""
    return Result(
        url=url,
        fp=fp,
        job="default",
        depth=2,
        parent="http://h0.bench.example/",
        outcome="fetched",
        status=200,
        final_url=url,
        redirects=(),
        content_type="text/html",
        length=5120,
        title=f"Page {fp[:8]}",
        outlinks=LINKS_PER_PAGE,
        fetched_at=time.time(),
        elapsed_ms=3.2,
        shard=shard,
        fence=17,
        worker="bench-1",
        charset="utf-8",
        headers={"content-type": "text/html; charset=utf-8", "content-length": "5120"},
    )


async def publish_all(outbox: Outbox, messages: list[Outgoing]) -> None:
    """Publish through the Outbox ``BATCH`` at a time; raise if JetStream refused any."""
    for start in range(0, len(messages), BATCH):
        acks = await outbox.send(messages[start : start + BATCH])
        failed = [a for a in acks if isinstance(a, PublishFailed)]
        if failed:
            raise RuntimeError(f"{len(failed)} publishes failed, e.g. {failed[0]}")


async def _pull_lanes(js: JetStreamContext, settings: Settings, per_shard: Counter[int]) -> None:
    """The tasks pulled from each shard's lane (the default level and job), as a worker does."""
    for shard in per_shard:
        await js.add_consumer(TASKS_STREAM, lane_config(settings, shard, 2, "default"))
    await _pull(
        js,
        [(TASKS_STREAM, lane_consumer(s, 2, "default"), c) for s, c in sorted(per_shard.items())],
    )


async def _pull(js: JetStreamContext, consumers: list[tuple[str, str, int]]) -> None:
    """Pull and ack ``count`` messages from each ``(stream, consumer, count)``, one at a time."""
    for stream, consumer, count in consumers:
        sub = await js.pull_subscribe_bind(durable=consumer, stream=stream)
        done = 0
        while done < count:
            try:
                msgs = await sub.fetch(min(BATCH, count - done), timeout=PULL_WAIT_S)
            except TimeoutError:
                raise RuntimeError(f"{consumer}: pulled {done} of {count}, then nothing") from None
            for msg in msgs:
                await msg.ack()
            done += len(msgs)
        await sub.unsubscribe()
