"""``python -m bench seen``: the seen set's memory per key, and admissions/s with K=1 and K=3.

Memory, on one nats-server: ``urls`` seen marks created straight into ``crawl_seen`` (as the
dispatcher creates them: no message id), then as many tasks published into ``CRAWL_TASKS`` (as
the dispatcher publishes them: ``Nats-Msg-Id``, remembered for ``duplicate_window_s``). The
server's RSS after each, and after a restart (what it keeps per key once the publishing's
garbage and caches are gone), gives the bytes per seen key apart from those per stored task; as
many messages on one subject, on another server, tell the per-subject state from the rest.

Admissions, on a local 3-node cluster for each partition count K and replica count R: R3 as
deployed (every server stores every partition), and R1 with each partition placed on a server of
its own by ``partition_tags`` (a cluster of more servers than replicas, in small). Once
``dispatchers`` ``python -m jetcrawl dispatcher`` processes wait on the intake, the harness
publishes the seed messages (``PER_MESSAGE`` URLs each, pipelined) and waits for the last mark;
admissions/s and CPU per URL (the dispatchers' and each nats-server's) are over that span. The
busiest server's CPU per URL bounds admissions/s where each server has a core of its own, which
a shared 2-core machine cannot show; ``--server-cores C`` gives each nats-server a budget of C
cores (bench/cpulimit.py), so that the servers, as on machines of their own, set the rate.
``--reps`` runs, interleaved K=1, K=3 for each R.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from bench.ceiling import publish_all
from bench.cpulimit import CpuLimit
from bench.procs import child_env, read_stat
from jetcrawl.contract.messages import Lineage, Task
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import (
    DISPATCH_CONSUMER,
    FRONTIER_STREAM,
    SEEDS,
    SEEN_STREAM,
    SEEN_SUBJECT_PREFIX,
    TASKS_STREAM,
    seen_streams,
    task_subject,
    tasks_streams,
)
from jetcrawl.contract.urls import fingerprint, host_of, shard_of
from jetcrawl.local.embedded import NatsCluster, NatsServer
from jetcrawl.plumbing.bus import EXPECTED_LAST_SUBJECT_SEQ, MSG_ID, Outbox, Outgoing, connect
from jetcrawl.plumbing.leaders import leaders, spread_leaders
from jetcrawl.plumbing.topology import ensure

__all__ = ["Admission", "MemoryPerKey", "SeenBench", "measure_seen", "seen_markdown"]

SHARDS = 64
HOSTS = 5000
PER_MESSAGE = 32  # URLs per seed message, as bench/memory.py
SAMPLE_S = 0.2
STALL_S = 60.0
SPREAD_WITHIN_S = 30.0
READY_S = 60.0


@dataclass(frozen=True, slots=True)
class MemoryPerKey:
    keys: int
    empty_rss_mb: float  # after the topology, before any mark
    marks_rss_mb: float  # after the marks
    marks_restarted_rss_mb: float  # the same, after a restart
    tasks_rss_mb: float  # after the tasks too
    tasks_restarted_rss_mb: float
    kv_disk_bytes: int
    tasks_disk_bytes: int
    # The same count of messages like a mark on one subject of a plain stream, on a fresh server,
    # after a restart: what a stored message costs without a subject of its own.
    one_subject_empty_rss_mb: float = 0.0
    one_subject_restarted_rss_mb: float = 0.0

    @property
    def bytes_per_key(self) -> float:
        return (self.marks_rss_mb - self.empty_rss_mb) * 2**20 / self.keys

    @property
    def bytes_per_key_restarted(self) -> float:
        return (self.marks_restarted_rss_mb - self.empty_rss_mb) * 2**20 / self.keys

    @property
    def bytes_per_message_one_subject(self) -> float:
        used = self.one_subject_restarted_rss_mb - self.one_subject_empty_rss_mb
        return used * 2**20 / self.keys

    @property
    def bytes_per_subject(self) -> float:
        """A mark's memory beyond a message's: nats-server's per-subject state."""
        return self.bytes_per_key_restarted - self.bytes_per_message_one_subject

    @property
    def bytes_per_task(self) -> float:
        return (self.tasks_rss_mb - self.marks_restarted_rss_mb) * 2**20 / self.keys

    @property
    def bytes_per_task_restarted(self) -> float:
        return (self.tasks_restarted_rss_mb - self.marks_restarted_rss_mb) * 2**20 / self.keys


@dataclass(frozen=True, slots=True)
class Admission:
    partitions: int
    replicas: int
    rep: int
    urls: int
    seconds: float  # the dispatchers waiting, seeds published, to the last mark
    dispatcher_cpu_s: float
    nats_cpu_s: float  # the three servers
    leaders: list[str | None]
    server_cpu_s: list[float]  # each server's, n1 to n3
    server_cores: float | None = None  # each server's CPU budget (None: the machine's)

    @property
    def busiest_server_us_per_url(self) -> float:
        """The busiest server's CPU per URL: with a core per server, it bounds admissions/s."""
        return 1e6 * max(self.server_cpu_s) / self.urls

    @property
    def server_bound_per_s(self) -> float:
        """Admissions/s the busiest server allows at one core each (1 / its CPU per URL)."""
        us = self.busiest_server_us_per_url
        return 1e6 / us if us > 0 else 0.0

    @property
    def per_s(self) -> float:
        return self.urls / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_us_per_url(self) -> float:
        return 1e6 * (self.dispatcher_cpu_s + self.nats_cpu_s) / self.urls

    @property
    def nats_us_per_url(self) -> float:
        return 1e6 * self.nats_cpu_s / self.urls


@dataclass(slots=True)
class SeenBench:
    urls: int
    dispatchers: int
    server_cores: float | None = None  # each nats-server's CPU budget in the admission runs
    memory: MemoryPerKey | None = None
    admissions: list[Admission] = field(default_factory=list)

    def median(self, k: int, attr: str, replicas: int = 3) -> float:
        values = [
            getattr(a, attr)
            for a in self.admissions
            if a.partitions == k and a.replicas == replicas
        ]
        return statistics.median(values) if values else 0.0

    def to_dict(self) -> dict[str, object]:
        memory = self.memory
        return asdict(self) | {
            "bytes_per_key": memory.bytes_per_key if memory else None,
            "bytes_per_key_restarted": memory.bytes_per_key_restarted if memory else None,
            "bytes_per_task": memory.bytes_per_task if memory else None,
            "bytes_per_subject": memory.bytes_per_subject if memory else None,
            "admissions_per_s": {
                f"R{a.replicas} K{a.partitions}": self.median(a.partitions, "per_s", a.replicas)
                for a in self.admissions
            },
        }


def _urls(n: int) -> list[str]:
    return [f"http://h{i % HOSTS}.bench.example/p/{i}" for i in range(n)]


# ---------------------------------------------------------------------- memory per key


async def measure_memory_per_key(n: int, work_dir: Path) -> MemoryPerKey:
    with tempfile.TemporaryDirectory(prefix="bench-seen-", dir=work_dir) as tmp:
        store = Path(tmp) / "nats"
        server = NatsServer(store)
        await server.start()
        try:
            settings = Settings(nats_url=server.url, shards=SHARDS)
            urls = _urls(n)
            fps = [fingerprint(u) for u in urls]
            nc = await connect(settings, "bench-seen")
            try:
                await ensure(nc.jetstream(), settings)
                empty = _rss_mb(server)
                creates = [
                    Outgoing(
                        f"{SEEN_SUBJECT_PREFIX}{fp}", b"123456", {EXPECTED_LAST_SUBJECT_SEQ: "0"}
                    )
                    for fp in fps
                ]
                await publish_all(Outbox(nc), creates)
                del creates
                marks = _rss_mb(server)
            finally:
                await nc.close()
            marks_restarted = await _restarted_rss_mb(server)
            lineage = Lineage(job="default", scope="any", root="", max_depth=16)
            tasks = [
                Outgoing(
                    task_subject(shard_of(host_of(u), SHARDS)),
                    Task(u, fp, 1, lineage).to_wire(),
                    {MSG_ID: fp},
                )
                for u, fp in zip(urls, fps, strict=True)
            ]
            nc = await connect(settings, "bench-seen")
            try:
                await publish_all(Outbox(nc), tasks)
                del tasks
                with_tasks = _rss_mb(server)
            finally:
                await nc.close()
            tasks_restarted = await _restarted_rss_mb(server)
        finally:
            await server.stop()
        kv_disk, tasks_disk = _disk_bytes(store, SEEN_STREAM), _disk_bytes(store, TASKS_STREAM)
        one_empty, one_restarted = await _one_subject(n, Path(tmp) / "one")
        return MemoryPerKey(
            n,
            empty,
            marks,
            marks_restarted,
            with_tasks,
            tasks_restarted,
            kv_disk,
            tasks_disk,
            one_empty,
            one_restarted,
        )


async def _one_subject(n: int, store: Path) -> tuple[float, float]:
    """nats-server's RSS with an empty stream, and with ``n`` mark-sized messages on one
    subject after a restart."""
    server = NatsServer(store)
    await server.start()
    try:
        nc = await connect(Settings(nats_url=server.url), "bench-seen")
        try:
            await nc.jetstream().add_stream(name="ONE", subjects=["one"])
            empty = _rss_mb(server)
            await publish_all(Outbox(nc), [Outgoing("one", b"123456") for _ in range(n)])
        finally:
            await nc.close()
        return empty, await _restarted_rss_mb(server)
    finally:
        await server.stop()


async def _restarted_rss_mb(server: NatsServer) -> float:
    await server.stop()
    await server.start()
    return _rss_mb(server)


def _rss_mb(server: NatsServer) -> float:
    assert server.pid is not None
    stat = read_stat(server.pid)
    if stat is None:
        raise RuntimeError("nats-server exited")
    return stat.rss_bytes / 2**20


def _disk_bytes(store: Path, stream: str) -> int:
    return sum(
        f.stat().st_size
        for d in store.rglob(stream)
        if d.is_dir()
        for f in d.rglob("*")
        if f.is_file()
    )


# ---------------------------------------------------------------------- admissions


async def measure_admission(
    partitions: int,
    replicas: int,
    rep: int,
    n: int,
    dispatchers: int,
    work_dir: Path,
    server_cores: float | None = None,
) -> Admission:
    # R1: partition p's streams on node p+1 (server tag n<p+1>); R3: every node holds each.
    tags = ("n1", "n2", "n3") if replicas == 1 else ()
    with tempfile.TemporaryDirectory(prefix="bench-seen-", dir=work_dir) as tmp:
        async with NatsCluster(
            Path(tmp) / "cluster", 3, tags=[[t] for t in tags] or None
        ) as cluster:
            urls = ",".join(cluster.urls)
            settings = Settings(
                nats_url=urls,
                shards=SHARDS,
                replicas=replicas,
                partitions=partitions,
                partition_tags=tags,
            )
            nc = await connect(settings, "bench-seen")
            try:
                js = nc.jetstream()
                await ensure(js, settings)
                placed = await _spread(nc, partitions)
                env = {
                    "JETCRAWL_SHARDS": str(SHARDS),
                    "JETCRAWL_REPLICAS": str(replicas),
                    "JETCRAWL_PARTITIONS": str(partitions),
                    "JETCRAWL_PARTITION_TAGS": ",".join(tags),
                }
                procs = [
                    await _spawn_dispatcher(
                        urls, env, Path(tmp), work_dir, f"r{replicas}k{partitions}-{i}"
                    )
                    for i in range(dispatchers)
                ]
                try:
                    await _pulling(js, dispatchers, procs)
                    nats_pids = [s.pid for s in cluster.servers if s.pid is not None]
                    d_pids = [p.pid for p in procs]
                    with contextlib.ExitStack() as limits:
                        if server_cores is not None:  # each server its own budget
                            for i, pid in enumerate(nats_pids, start=1):
                                limit = CpuLimit(pid, server_cores, f"r{replicas}k{partitions}n{i}")
                                limits.enter_context(limit)
                        started, d_before = time.monotonic(), _cpu(d_pids)
                        s_before = [_cpu([pid]) for pid in nats_pids]
                        await _store_seeds(Outbox(nc), n)
                        await _admitted(js, partitions, n, procs)
                        seconds, d_cpu = time.monotonic() - started, _cpu(d_pids) - d_before
                        per_server = [
                            _cpu([pid]) - b for pid, b in zip(nats_pids, s_before, strict=True)
                        ]
                finally:
                    for proc in procs:
                        if proc.returncode is None:
                            proc.send_signal(signal.SIGTERM)
                    await asyncio.gather(*(p.wait() for p in procs))
            finally:
                await nc.close()
            return Admission(
                partitions,
                replicas,
                rep,
                n,
                seconds,
                d_cpu,
                sum(per_server),
                placed,
                per_server,
                server_cores,
            )


async def _spread(nc: NATS, partitions: int) -> list[str | None]:
    """The seen buckets' leaders once each partition's task stream and bucket are led by the
    partition's server (or after ``SPREAD_WITHIN_S``)."""
    await spread_leaders(nc, partitions)
    deadline = time.monotonic() + SPREAD_WITHIN_S
    while True:
        now = await leaders(nc, seen_streams(partitions))
        tasks = await leaders(nc, tasks_streams(partitions))
        placed = None not in now and len(set(now)) == min(partitions, 3) and tasks == now
        if partitions == 1 or placed or time.monotonic() > deadline:
            return now
        await asyncio.sleep(SAMPLE_S)


async def _store_seeds(outbox: Outbox, n: int) -> None:
    urls = _urls(n)
    messages = [
        Outgoing(SEEDS, "\n".join(urls[i : i + PER_MESSAGE]).encode())
        for i in range(0, n, PER_MESSAGE)
    ]
    await publish_all(outbox, messages)


async def _spawn_dispatcher(
    nats_url: str, env: dict[str, str], cwd: Path, log_dir: Path, name: str
) -> asyncio.subprocess.Process:
    log = (log_dir / f"seen-dispatcher-{name}.log").open("wb")
    try:
        return await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "jetcrawl", "dispatcher", "--nats", nats_url],
            env=child_env(env),
            cwd=cwd,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
        )
    finally:
        log.close()


async def _pulling(
    js: JetStreamContext, dispatchers: int, procs: list[asyncio.subprocess.Process]
) -> None:
    """Wait until every dispatcher waits on the intake (its pull request is in)."""
    deadline = time.monotonic() + READY_S
    while True:
        try:
            info = await js.consumer_info(FRONTIER_STREAM, DISPATCH_CONSUMER)
            if (info.num_waiting or 0) >= dispatchers:
                return
        except NotFoundError:
            pass
        if any(p.returncode is not None for p in procs) or time.monotonic() > deadline:
            raise RuntimeError("the dispatchers did not start (see seen-dispatcher-*.log)")
        await asyncio.sleep(SAMPLE_S)


async def _admitted(
    js: JetStreamContext, partitions: int, n: int, procs: list[asyncio.subprocess.Process]
) -> None:
    """Wait for ``n`` marks over the partitions."""
    streams = seen_streams(partitions)
    last_count, last_change = -1, time.monotonic()
    while True:
        count = sum([(await js.stream_info(s)).state.messages for s in streams])
        now = time.monotonic()
        if count >= n:
            return
        if any(p.returncode is not None for p in procs):
            raise RuntimeError("a dispatcher exited (see seen-dispatcher-*.log)")
        if count != last_count:
            last_count, last_change = count, now
        elif now - last_change > STALL_S:
            raise RuntimeError(f"no admission for {STALL_S:g} s at {count} of {n}")
        await asyncio.sleep(SAMPLE_S)


def _cpu(pids: list[int]) -> float:
    return sum(stat.cpu_s for pid in pids if (stat := read_stat(pid)) is not None)


# ---------------------------------------------------------------------- the whole bench


async def measure_seen(
    urls: int,
    dispatchers: int,
    reps: int,
    work_dir: Path,
    memory_keys: int,
    replicas: tuple[int, ...] = (3, 1),
    server_cores: float | None = None,
) -> SeenBench:
    bench = SeenBench(urls, dispatchers, server_cores)
    if memory_keys > 0:
        bench.memory = await measure_memory_per_key(memory_keys, work_dir)
    for rep in range(1, reps + 1):
        for r in replicas:
            for k in (1, 3):
                admission = await measure_admission(
                    k, r, rep, urls, dispatchers, work_dir, server_cores
                )
                print(
                    f"bench: seen R{r} K={k} rep {rep}: {admission.per_s:,.0f} admissions/s, "
                    f"{admission.cpu_us_per_url:.0f} CPU us/URL, busiest server "
                    f"{admission.busiest_server_us_per_url:.0f} us/URL "
                    f"{[round(c, 1) for c in admission.server_cpu_s]} s, "
                    f"leaders {admission.leaders}",
                    file=sys.stderr,
                    flush=True,
                )
                bench.admissions.append(admission)
    return bench


def seen_markdown(bench: SeenBench) -> str:
    lines = ["## The seen set (python -m bench seen)", ""]
    m = bench.memory
    if m is not None:
        lines += [
            f"Memory, one nats-server, {m.keys:,} keys then as many tasks (RSS MB):",
            "",
            "| state | nats-server RSS MB | bytes per key or task |",
            "|---|---|---|",
            f"| topology, no mark | {m.empty_rss_mb:.1f} | |",
            f"| + marks | {m.marks_rss_mb:.1f} | {m.bytes_per_key:.0f} per key |",
            f"| + marks, restarted | {m.marks_restarted_rss_mb:.1f} | "
            f"{m.bytes_per_key_restarted:.0f} per key |",
            f"| + tasks (Nats-Msg-Id) | {m.tasks_rss_mb:.1f} | {m.bytes_per_task:.0f} per task |",
            f"| + tasks, restarted | {m.tasks_restarted_rss_mb:.1f} | "
            f"{m.bytes_per_task_restarted:.0f} per task |",
            f"| (another server) as many messages on one subject, restarted "
            f"| {m.one_subject_restarted_rss_mb:.1f} (empty {m.one_subject_empty_rss_mb:.1f}) "
            f"| {m.bytes_per_message_one_subject:.0f} per message |",
            "",
            f"A mark's memory beyond a stored message's, nats-server's per-subject state: "
            f"{m.bytes_per_subject:.0f} bytes.",
            "",
            f"Disk: {m.kv_disk_bytes / m.keys:.0f} bytes per mark (KV_crawl_seen), "
            f"{m.tasks_disk_bytes / m.keys:.0f} per task (CRAWL_TASKS).",
            "",
        ]
    lines += [
        f"Admissions, 3-node cluster, {bench.dispatchers} dispatchers, {bench.urls:,} URLs per "
        "run (medians); R1 places partition p on node p+1 (partition_tags), R3 stores every "
        "partition on every node"
        + (
            f"; each nats-server limited to {bench.server_cores:g} cores (a cgroup)"
            if bench.server_cores
            else ""
        )
        + ":",
        "",
        "| replicas | partitions | admissions/s | CPU us per URL (dispatchers + nats-servers) "
        "| nats-servers' CPU us per URL | busiest server's CPU us per URL "
        "| admissions/s its one core allows | leaders |",
        "|---|---|---|---|---|---|---|---|",
    ]
    layouts = sorted({a.replicas for a in bench.admissions}, reverse=True)
    for r in layouts:
        for k in (1, 3):
            runs = [a for a in bench.admissions if a.partitions == k and a.replicas == r]
            if not runs:
                continue
            placed = ", ".join(map(str, runs[-1].leaders))
            lines.append(
                f"| R{r} | K={k} | {bench.median(k, 'per_s', r):,.0f} "
                f"| {bench.median(k, 'cpu_us_per_url', r):.0f} "
                f"| {bench.median(k, 'nats_us_per_url', r):.0f} "
                f"| {bench.median(k, 'busiest_server_us_per_url', r):.0f} "
                f"| {bench.median(k, 'server_bound_per_s', r):,.0f} | {placed} |"
            )
    lines.append("")
    for r in layouts:
        k1, k3 = bench.median(1, "per_s", r), bench.median(3, "per_s", r)
        b1, b3 = bench.median(1, "server_bound_per_s", r), bench.median(3, "server_bound_per_s", r)
        if k1 and k3:
            lines.append(
                f"R{r}, K=3 / K=1: {k3 / k1:.2f}x admissions/s measured; {b3 / b1:.2f}x what the "
                "busiest server allows at a core per server."
            )
    return "\n".join(lines) + "\n"
