"""What ``jetcrawl status`` shows of jobs, without reading a result.

backlog   the tasks queued per lane (shard, level, job): one stream info per task stream
          with its subject counts. A work queue keeps a task until it is acked, so a lane's count
          is what waits plus what a worker holds, a paused job's tasks included.
states    the control records of KV ``crawl_control`` (running, paused, cancelled)
one job   ``--job NAME``: its state, its backlog by level and by shard, and its rate, pages,
          errors and settled tasks summed over the workers' reports (KV ``crawl_workers``)
known     whether a name is a job of this mesh, for status and for ``jetcrawl job pause``
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import KeyDeletedError, KeyNotFoundError, NotFoundError

from jetcrawl.contract.control import RUNNING, JobControl
from jetcrawl.contract.errors import JetcrawlError, MessageError, UsageError
from jetcrawl.contract.messages import DEFAULT_JOB, JOB_RE, WorkerReport
from jetcrawl.contract.settings import PRIORITY_LEVELS
from jetcrawl.contract.topology import (
    CONTROL_BUCKET,
    CONTROL_STREAM,
    SPECS_BUCKET,
    SPECS_STREAM,
    TASKS_PREFIX,
    WORKERS_BUCKET,
    WORKERS_STREAM,
    job_tasks,
    lane_of,
)
from jetcrawl.plumbing.topology import task_stream_infos

__all__ = [
    "Backlog",
    "JobStatus",
    "UnknownJob",
    "check_job_name",
    "check_known",
    "job_status",
    "not_running",
    "read_backlog",
    "read_controls",
    "read_reports",
    "when",
]

Lane = tuple[int, int, str]  # shard, level, job


class UnknownJob(JetcrawlError):
    """No spec, no control record, no queued task, no worker's report of it: not a job here."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"no job {name!r}: it has no spec in {SPECS_BUCKET}, no state in {CONTROL_BUCKET}, "
            "no queued task and no worker reports it (`jetcrawl job list` shows the jobs with "
            "a spec)"
        )
        self.name = name


def when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


def check_job_name(name: str) -> None:
    """A name that is no job name (``a.b``, ``>``) would make a subject filter wider than one
    job's lanes: refused before anything is read or purged."""
    if not JOB_RE.match(name):
        raise UsageError(f"job {name!r}", f"a job name matches {JOB_RE.pattern}")


async def check_known(js: JetStreamContext, name: str) -> None:
    """Raise :class:`UnknownJob` unless ``name`` is a job of this mesh: the default job, or one
    with a spec, a control record, queued tasks, or pages in a worker's report (a job seeded
    without a spec that has finished). Reads what ``jetcrawl status`` reads: stream infos
    (subject counts) and the reports."""
    check_job_name(name)
    if name == DEFAULT_JOB:
        return
    for stream, subjects in (
        (SPECS_STREAM, f"$KV.{SPECS_BUCKET}.{name}"),
        (CONTROL_STREAM, f"$KV.{CONTROL_BUCKET}.{name}"),
    ):
        try:
            info = await js.stream_info(stream, subjects_filter=subjects)
        except NotFoundError:
            continue  # a topology from before that bucket: nothing of the job there
        if any(info.state.subjects or {}):
            return
    try:
        if any(info.state.subjects for info in await task_stream_infos(js, job_tasks(name))):
            return
    except NotFoundError:
        pass  # no task streams yet: no tasks of the job either
    if not any(name in report.jobs for report in await read_reports(js)):
        raise UnknownJob(name)


async def read_reports(js: JetStreamContext) -> tuple[WorkerReport, ...]:
    """The workers' latest reports; one that does not decode is left out.

    Keys come from the stream's subjects and values by direct get: no consumer, so a user that
    may only read (the dispatcher's, in compose) can run it."""
    try:
        info = await js.stream_info(WORKERS_STREAM, subjects_filter=f"$KV.{WORKERS_BUCKET}.>")
        bucket = await js.key_value(WORKERS_BUCKET)
    except NotFoundError:
        return ()
    reports = []
    for subject in sorted(info.state.subjects or {}):
        try:
            entry = await bucket.get(subject[len(f"$KV.{WORKERS_BUCKET}.") :])
            reports.append(WorkerReport.from_wire(entry.value or b""))
        except (KeyNotFoundError, MessageError):
            continue  # expired since the listing, or not a report this build reads
    return tuple(reports)


@dataclass(frozen=True, slots=True)
class Backlog:
    """Queued tasks per lane, as the task streams counted them at one reading."""

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
    lanes: dict[Lane, int] = {}
    for info in await task_stream_infos(js, f"{TASKS_PREFIX}>"):
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
