"""What ``jetcrawl status`` shows of jobs, without reading a result.

backlog   the tasks queued per lane (shard, level, job): one stream info of ``CRAWL_TASKS``
          with its subject counts. A work queue keeps a task until it is acked, so a lane's count
          is what waits plus what a worker holds, a paused job's tasks included.
states    the control records of KV ``crawl_control`` (running, paused, cancelled)
one job   ``--job NAME``: its state, its backlog by level and by shard, and its rate, pages,
          errors and settled tasks summed over the workers' reports (KV ``crawl_workers``)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import KeyDeletedError, KeyNotFoundError, NotFoundError

from jetcrawl.contract.control import RUNNING, JobControl
from jetcrawl.contract.errors import MessageError
from jetcrawl.contract.messages import WorkerReport
from jetcrawl.contract.settings import PRIORITY_LEVELS
from jetcrawl.contract.topology import (
    CONTROL_BUCKET,
    CONTROL_STREAM,
    TASKS_PREFIX,
    TASKS_STREAM,
    lane_of,
)
from jetcrawl.ops.control import when

__all__ = ["Backlog", "JobStatus", "job_status", "not_running", "read_backlog", "read_controls"]

Lane = tuple[int, int, str]  # shard, level, job


@dataclass(frozen=True, slots=True)
class Backlog:
    """Queued tasks per lane, as ``CRAWL_TASKS`` counted them at one reading."""

    lanes: dict[Lane, int]

    def total(self, job: str | None = None) -> int:
        return sum(n for lane, n in self.lanes.items() if job is None or lane[2] == job)

    def by_level(self, job: str | None = None, shard: int | None = None) -> list[int]:
        levels = [0] * PRIORITY_LEVELS
        for (s, level, j), n in self.lanes.items():
            if (job is None or j == job) and (shard is None or s == shard) and level < len(levels):
                levels[level] += n
        return levels

    def by_shard(self, job: str | None = None) -> dict[int, int]:
        shards: Counter[int] = Counter()
        for (shard, _, j), n in self.lanes.items():
            if job is None or j == job:
                shards[shard] += n
        return dict(sorted(shards.items()))


async def read_backlog(js: JetStreamContext) -> Backlog:
    info = await js.stream_info(TASKS_STREAM, subjects_filter=f"{TASKS_PREFIX}>")
    lanes: dict[Lane, int] = {}
    for subject, count in (info.state.subjects or {}).items():
        try:
            lanes[lane_of(subject)] = count
        except ValueError:
            continue  # a subject of an older layout (crawl.tasks.<shard>): no lane to show
    return Backlog(lanes)


async def read_controls(js: JetStreamContext) -> tuple[JobControl, ...]:
    """Every job's control record, by name. Keys come from the stream's subjects and values by
    direct get: no consumer, like the workers' reports."""
    prefix = f"$KV.{CONTROL_BUCKET}."
    try:
        info = await js.stream_info(CONTROL_STREAM, subjects_filter=f"{prefix}>")
        bucket = await js.key_value(CONTROL_BUCKET)
    except NotFoundError:
        return ()  # a topology from before job control
    records = []
    for subject in sorted(info.state.subjects or {}):
        try:
            entry = await bucket.get(subject[len(prefix) :])
            records.append(JobControl.from_wire(entry.value or b""))
        except (KeyNotFoundError, KeyDeletedError, MessageError):
            continue  # deleted since the listing, or not a record this build reads
    return tuple(records)


@dataclass(frozen=True, slots=True)
class JobStatus:
    control: JobControl
    levels: list[int]  # queued tasks per priority level, 0 first
    shards: dict[int, int]  # queued tasks per shard that has any
    pages_per_s: float  # summed over the reports of live workers
    pages: int  # summed over every report still kept
    errors: int
    settled: int
    reports: int  # reports that name the job

    @property
    def queued(self) -> int:
        return sum(self.levels)

    def to_json(self) -> dict[str, Any]:
        c = self.control
        return {
            "job": c.job,
            "state": c.state,
            "since": c.at or None,
            "by": c.by or None,
            "purged": c.purged,
            "backlog": {
                "queued": self.queued,
                "levels": self.levels,
                "shards": {str(s): n for s, n in self.shards.items()},
            },
            "pages_per_s": round(self.pages_per_s, 3),
            "pages": self.pages,
            "errors": self.errors,
            "settled": self.settled,
            "reports": self.reports,
        }

    def lines(self) -> list[str]:
        c = self.control
        since = f" since {when(c.at)} by {c.by or '?'}" if c.at else ""
        purged = f" ({c.purged} queued tasks removed)" if c.purged else ""
        levels = ", ".join(f"P{level} {n}" for level, n in enumerate(self.levels) if n)
        shards = (
            "  shards " + ", ".join(f"{s}: {n}" for s, n in self.shards.items())
            if 0 < len(self.shards) <= SHARDS_SHOWN
            else f"  in {len(self.shards)} shards"
            if self.shards
            else ""
        )
        return [
            f"job {c.job}  {c.state}{since}{purged}",
            f"  backlog   {self.queued} queued{f' ({levels})' if levels else ''}{shards}",
            f"  rate      {self.pages_per_s:.1f} pages/s  pages {self.pages}  errors "
            f"{self.errors}  settled {self.settled}  (reports of {self.reports} workers)",
        ]


SHARDS_SHOWN = 8  # a job queued on more shards shows how many


def job_status(
    control: JobControl,
    backlog: Backlog,
    reports: Iterable[WorkerReport],
    live: Collection[str],
) -> JobStatus:
    """``control.job``'s view; ``live``: the ids of the workers etcd shows now (a report
    outlives its worker by a minute: its totals count, its rate no longer does)."""
    job = control.job
    activity = [(r.worker, r.jobs[job]) for r in reports if job in r.jobs]
    return JobStatus(
        control=control,
        levels=backlog.by_level(job),
        shards=backlog.by_shard(job),
        pages_per_s=sum(a.pages_per_s for worker, a in activity if worker in live),
        pages=sum(a.pages for _, a in activity),
        errors=sum(a.errors for _, a in activity),
        settled=sum(a.settled for _, a in activity),
        reports=len(activity),
    )


def not_running(controls: Iterable[JobControl]) -> list[JobControl]:
    return [c for c in controls if c.state != RUNNING]
