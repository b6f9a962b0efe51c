"""``jetcrawl status``: the mesh as etcd and JetStream show it now, as a table or as JSON.

workers        from etcd: id, host, pid, version, capacity, owned shards, age
shards         each shard's owner (etcd) and its queued tasks per priority level: the lanes'
               subject counts in the task streams (waiting and held by a worker; jobstatus.py)
frontier       the dispatch consumer's pending and unacked counts (the frontier backlog)
tasks          queued over every shard, per level, and how many tasks were ever published
jobs           the jobs that are paused or cancelled (KV crawl_control)
results, dead  message counts of CRAWL_RESULTS and CRAWL_DEAD
hand-backs     from the workers' reports (KV crawl_workers): waiting tasks handed back to
               JetStream whose turn is still to come, and when the last is due; a crawl whose
               backlog is all such tasks is waiting on them, not stuck
rates          results, dead letters and tasks per second between two snapshots: the watch
               interval, or ``--interval`` apart for a single status (0: no rates)
--job NAME     that job's state, backlog, rate, pages and errors, without reading a result

Like this command, a part of the CLI: it may read both etcd (``registry``) and JetStream.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time
from dataclasses import dataclass
from typing import IO, Any

import orjson
from nats.js import JetStreamContext

from jetcrawl.contract.control import RUNNING, JobControl
from jetcrawl.contract.messages import WorkerReport
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import (
    DEAD_STREAM,
    DISPATCH_CONSUMER,
    FRONTIER_STREAM,
    RESULTS_STREAM,
    SHARDS_METADATA_KEY,
)
from jetcrawl.ops.jobstatus import (
    JobStatus,
    check_known,
    job_status,
    not_running,
    read_backlog,
    read_controls,
    read_reports,
    when,
)
from jetcrawl.plumbing.bus import connect
from jetcrawl.plumbing.topology import task_stream_infos
from jetcrawl.registry import read_members, read_ownership

__all__ = ["Rates", "ShardRow", "Status", "WorkerRow", "read_reports", "read_status", "run_status"]


@dataclass(frozen=True, slots=True)
class WorkerRow:
    id: str
    host: str
    pid: int
    version: str
    capacity: int
    started_at: float
    age_s: float
    shards: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ShardRow:
    shard: int
    owner: str | None
    levels: list[int]  # queued tasks per priority level, 0 first

    @property
    def queued(self) -> int:
        return sum(self.levels)


@dataclass(frozen=True, slots=True)
class Rates:
    interval_s: float
    results_per_s: float
    dead_letters_per_s: float
    tasks_per_s: float


@dataclass(frozen=True, slots=True)
class Status:
    at: float  # unix time of the reading
    cluster: str
    workers: tuple[WorkerRow, ...]
    shards: tuple[ShardRow, ...]
    frontier_pending: int
    frontier_unacked: int
    tasks_published: int  # the task streams' last sequences, summed
    results: int
    dead_letters: int
    reports: tuple[WorkerReport, ...] = ()  # the workers' latest, from KV crawl_workers
    rates: Rates | None = None
    jobs: tuple[JobControl, ...] = ()  # every job's control record (KV crawl_control)
    job: JobStatus | None = None  # with --job

    @property
    def handbacks_due(self) -> int:
        return sum(r.handbacks_due for r in self.reports)

    @property
    def handbacks_furthest_due_at(self) -> float | None:
        return max((r.furthest_due_at for r in self.reports if r.furthest_due_at), default=None)

    def since(self, earlier: Status) -> Status:
        """This reading with the rates since ``earlier``."""
        dt = self.at - earlier.at
        if dt <= 0:
            return self
        rates = Rates(
            interval_s=dt,
            results_per_s=(self.results - earlier.results) / dt,
            dead_letters_per_s=(self.dead_letters - earlier.dead_letters) / dt,
            tasks_per_s=(self.tasks_published - earlier.tasks_published) / dt,
        )
        return dataclasses.replace(self, rates=rates)

    def to_json(self) -> dict[str, Any]:
        return {
            "time": self.at,
            "cluster": self.cluster,
            "shard_count": len(self.shards),
            "workers": [
                {
                    "id": w.id,
                    "host": w.host,
                    "pid": w.pid,
                    "version": w.version,
                    "capacity": w.capacity,
                    "started_at": w.started_at,
                    "age_s": round(w.age_s, 3),
                    "shards": list(w.shards),
                }
                for w in self.workers
            ],
            "shards": [
                {"shard": s.shard, "owner": s.owner, "queued": s.queued, "levels": s.levels}
                for s in self.shards
            ],
            "frontier": {"pending": self.frontier_pending, "unacked": self.frontier_unacked},
            "tasks": {
                "queued": self.tasks_queued,
                "levels": self._levels(),
                "published": self.tasks_published,
            },
            "jobs": {
                c.job: {"state": c.state, "since": c.at, "by": c.by, "purged": c.purged}
                for c in self.jobs
            },
            "results": self.results,
            "dead_letters": self.dead_letters,
            "handbacks": {
                "due": self.handbacks_due,
                "furthest_due_at": self.handbacks_furthest_due_at,
                "total": sum(r.handed_back for r in self.reports),
                "by_worker": {
                    r.worker: {
                        "due": r.handbacks_due,
                        "furthest_due_at": r.furthest_due_at,
                        "total": r.handed_back,
                        "reported_at": r.at,
                    }
                    for r in self.reports
                },
            },
            "job": None if self.job is None else self.job.to_json(),
            "rates": None
            if self.rates is None
            else {
                "interval_s": round(self.rates.interval_s, 3),
                "results_per_s": round(self.rates.results_per_s, 3),
                "dead_letters_per_s": round(self.rates.dead_letters_per_s, 3),
                "tasks_per_s": round(self.rates.tasks_per_s, 3),
            },
        }

    def table(self) -> str:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.at))
        lines = [f"jetcrawl status: cluster {self.cluster}, {len(self.shards)} shards, {stamp}", ""]
        lines.append(f"workers ({len(self.workers)})")
        lines += _columns(
            ["ID", "HOST", "PID", "VERSION", "CAPACITY", "SHARDS", "AGE"],
            [
                [w.id, w.host, w.pid, w.version, w.capacity, len(w.shards), _age(w.age_s)]
                for w in self.workers
            ],
        )
        r = self.rates
        lines += [
            "",
            f"frontier      pending {self.frontier_pending}  unacked {self.frontier_unacked}",
            f"tasks         queued {self.tasks_queued}{_by_level(self._levels())}"
            f"  published {self.tasks_published}{_per_s(r.tasks_per_s if r else None)}",
            f"results       {self.results}{_per_s(r.results_per_s if r else None)}",
            f"dead letters  {self.dead_letters}{_per_s(r.dead_letters_per_s if r else None)}",
            f"hand-backs    {self._handbacks()}",
        ]
        for c in not_running(self.jobs):
            if self.job is None or c.job != self.job.control.job:  # shown in full below
                lines.append(f"job {c.job}  {c.state} since {when(c.at)} by {c.by or '?'}")
        if self.job is not None:
            lines += ["", *self.job.lines()]
        lines += [
            "",
            "shards",
        ]
        lines += _columns(
            ["SHARD", "OWNER", "QUEUED", *(f"P{level}" for level in range(len(self._levels())))],
            [[s.shard, s.owner or "-", s.queued, *s.levels] for s in self.shards],
        )
        return "\n".join(lines) + "\n"

    @property
    def tasks_queued(self) -> int:
        return sum(s.queued for s in self.shards)

    def _levels(self) -> list[int]:
        return [sum(column) for column in zip(*(s.levels for s in self.shards), strict=True)]

    def _handbacks(self) -> str:
        total = sum(r.handed_back for r in self.reports)
        furthest = self.handbacks_furthest_due_at
        if not self.handbacks_due or furthest is None:
            return f"none due  ({total} in all)"
        stamp = time.strftime("%H:%M:%S", time.localtime(furthest))
        return (
            f"{self.handbacks_due} due, the last in {_age(max(0.0, furthest - self.at))}"
            f" (at {stamp})  ({total} in all)"
        )


async def read_status(settings: Settings, js: JetStreamContext, job: str | None = None) -> Status:
    """One reading: etcd first, then JetStream (raises RegistryError or nats errors)."""
    at = time.time()
    members = await read_members(settings)
    owners = await read_ownership(settings)
    tasks = await task_stream_infos(js)
    recorded = (tasks[0].config.metadata or {}).get(SHARDS_METADATA_KEY)
    shard_count = int(recorded) if recorded else settings.shards
    backlog = await read_backlog(js)
    shards = tuple(
        ShardRow(shard, owners.get(shard), backlog.by_level(shard=shard))
        for shard in range(shard_count)
    )
    dispatch = await js.consumer_info(FRONTIER_STREAM, DISPATCH_CONSUMER)
    results = await js.stream_info(RESULTS_STREAM)
    dead = await js.stream_info(DEAD_STREAM)
    workers = tuple(
        WorkerRow(
            id=info.id,
            host=info.host,
            pid=info.pid,
            version=info.version,
            capacity=info.capacity,
            started_at=info.started_at,
            age_s=max(0.0, at - info.started_at),
            shards=tuple(s for s, owner in owners.items() if owner == info.id),
        )
        for info in members.values()
    )
    reports = await read_reports(js)
    jobs = await read_controls(js)
    one_job = None
    if job is not None:
        # A job without a record runs (contract/control.py).
        control = next((c for c in jobs if c.job == job), JobControl(job, RUNNING, 0.0))
        one_job = job_status(control, backlog, reports, live=members.keys())
    return Status(
        at=at,
        cluster=settings.cluster,
        workers=workers,
        shards=shards,
        frontier_pending=dispatch.num_pending or 0,
        frontier_unacked=dispatch.num_ack_pending or 0,
        tasks_published=sum(info.state.last_seq for info in tasks),
        results=results.state.messages,
        dead_letters=dead.state.messages,
        reports=reports,
        jobs=jobs,
        job=one_job,
    )


async def run_status(
    settings: Settings,
    *,
    watch_s: float | None,
    interval_s: float,
    as_json: bool,
    out: IO[str] = sys.stdout,
    job: str | None = None,
) -> None:
    """Print one status (rates over ``interval_s``), or one every ``watch_s`` until cancelled."""
    nc = await connect(settings, "jetcrawl-status", give_up_s=settings.command_timeout_s)
    try:
        js = nc.jetstream()
        if job is not None:
            await check_known(js, job)  # a typo is one line, exit 2
        previous = await read_status(settings, js, job)
        if watch_s is None and interval_s <= 0:
            _show(previous, as_json, out, clear=False)
            return
        while True:
            await asyncio.sleep(watch_s if watch_s is not None else interval_s)
            current = await read_status(settings, js, job)
            _show(current.since(previous), as_json, out, clear=watch_s is not None)
            if watch_s is None:
                return
            previous = current
    finally:
        await nc.close()


def _show(status: Status, as_json: bool, out: IO[str], clear: bool) -> None:
    if as_json:
        out.write(orjson.dumps(status.to_json()).decode() + "\n")
    else:
        if clear and out.isatty():
            out.write("\x1b[H\x1b[2J")
        out.write(status.table())
    out.flush()


def _columns(header: list[str], rows: list[list[Any]]) -> list[str]:
    cells = [header, *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return [
        "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in cells
    ]


def _age(seconds: float) -> str:
    s = int(seconds)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _by_level(levels: list[int]) -> str:
    shown = ", ".join(f"P{level} {n}" for level, n in enumerate(levels) if n)
    return f" ({shown})" if shown else ""


def _per_s(rate: float | None) -> str:
    return "" if rate is None else f"  ({rate:.1f}/s)"
