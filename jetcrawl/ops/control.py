"""jetcrawl job pause|resume|cancel NAME: a job's run state in KV ``crawl_control``.

Each command changes the state by compare-and-set (:class:`jetcrawl.plumbing.control.ControlStore`)
and prints one line: what changed, or that nothing did (already paused, say). Workers and
dispatchers watch the bucket, so a change reaches the mesh within a watch's delivery. Cancel is
final: the state first (so what a worker still holds is settled, and the dispatchers drop the
job's links), then every queued task of the job is purged from ``CRAWL_TASKS`` and the count is
recorded. A cancel again purges what arrived since (a dispatcher's batch under way).

A job is known when it has a spec, a control record or queued tasks, or is the default job; any
other name is a typo, refused with exit 2 (:class:`UnknownJob`) before anything is written.
"""

from __future__ import annotations

import getpass
import socket
import time

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from jetcrawl.contract.control import CANCELLED, PAUSED, RUNNING, JobControl, State
from jetcrawl.contract.errors import JetcrawlError, UsageError
from jetcrawl.contract.messages import DEFAULT_JOB, JOB_RE
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import (
    CONTROL_BUCKET,
    CONTROL_STREAM,
    SPECS_BUCKET,
    SPECS_STREAM,
    TASKS_STREAM,
    job_tasks,
)
from jetcrawl.plumbing.bus import connect
from jetcrawl.plumbing.control import ControlStore, purge_tasks

__all__ = [
    "ACTIONS",
    "UnknownJob",
    "by_whom",
    "check_job_name",
    "check_known",
    "run_control",
    "when",
]

ACTIONS: dict[str, State] = {"pause": PAUSED, "resume": RUNNING, "cancel": CANCELLED}


class UnknownJob(JetcrawlError):
    """No spec, no control record, no queued task: not a job of this mesh."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"no job {name!r}: it has no spec in {SPECS_BUCKET}, no state in {CONTROL_BUCKET} "
            "and no queued task (`jetcrawl job list` shows the jobs with a spec)"
        )
        self.name = name


def by_whom() -> str:
    """user@host of this command: who a control record says asked."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container's)
        user = "?"
    return f"{user}@{socket.gethostname()}"


def when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


def check_job_name(name: str) -> None:
    """A name that is no job name (``a.b``, ``>``) would make a subject filter wider than one
    job's lanes: refused before anything is read or purged."""
    if not JOB_RE.match(name):
        raise UsageError(f"job {name!r}", f"a job name matches {JOB_RE.pattern}")


async def check_known(js: JetStreamContext, settings: Settings, name: str) -> None:
    """Raise :class:`UnknownJob` unless ``name`` is a job of this mesh. Reads stream infos
    only (subject counts), so any user that may run ``jetcrawl status`` may ask."""
    check_job_name(name)
    if name == DEFAULT_JOB:
        return
    for stream, subjects in (
        (SPECS_STREAM, f"$KV.{SPECS_BUCKET}.{name}"),
        (CONTROL_STREAM, f"$KV.{CONTROL_BUCKET}.{name}"),
        (TASKS_STREAM, job_tasks(name)),
    ):
        try:
            info = await js.stream_info(stream, subjects_filter=subjects)
        except NotFoundError:
            continue  # a topology from before that bucket: nothing of the job there
        if any(info.state.subjects or {}):
            return
    raise UnknownJob(name)


async def run_control(settings: Settings, action: str, name: str) -> int:
    """``jetcrawl job pause|resume|cancel NAME``; the exit status."""
    check_job_name(name)  # before connecting
    nc = await connect(settings, "jetcrawl-job", give_up_s=settings.command_timeout_s)
    try:
        js = nc.jetstream(timeout=settings.command_timeout_s)
        try:
            store = await ControlStore.open(js)
        except NotFoundError as e:
            raise JetcrawlError(
                f"KV {CONTROL_BUCKET} is missing on {settings.nats_url}: start a service, or "
                "run `jetcrawl topology --apply`, first"
            ) from e
        await check_known(js, settings, name)
        record, changed = await store.change(name, ACTIONS[action], by_whom())
        if record.state == CANCELLED:
            print(await _cancelled(nc, store, record, changed, settings.command_timeout_s))
        elif changed:
            print(f"job {name} {record.state}" + (" again" if record.runs else ""))
        else:
            print(f"job {name}: already {record.state}{_since(record)}; nothing changed")
        return 0
    finally:
        await nc.close()


async def _cancelled(
    nc: NATS, store: ControlStore, record: JobControl, changed: bool, timeout_s: float
) -> str:
    purged = await purge_tasks(nc, record.job, timeout_s)
    if purged:
        record = await store.record_purged(record.job, purged)
    if changed:
        return f"job {record.job} cancelled: {purged} queued tasks removed"
    late = f"; {purged} queued tasks that came since removed" if purged else "; nothing changed"
    return f"job {record.job}: already cancelled{_since(record)}{late}"


def _since(record: JobControl) -> str:
    if not record.at:
        return ""  # never changed: running from the start
    return f" at {when(record.at)} by {record.by or '?'}"
