"""jetcrawl job pause|resume|cancel NAME: a job's run state in KV ``crawl_control``.

Each command changes the state by compare-and-set (:class:`jetcrawl.plumbing.control.ControlStore`)
and prints one line: what changed, or that nothing did (already paused, say). Workers and
dispatchers watch the bucket, so a change reaches the mesh within a watch's delivery. Cancel is
final: the state first (so what a worker still holds is settled, and the dispatchers drop the
job's links), then every queued task of the job is purged from the task streams and the count is
recorded. A cancel again purges what arrived since (a dispatcher's batch under way).

A name that is no job of this mesh is a typo, refused with exit 2 before anything is written
(:func:`jetcrawl.ops.jobstatus.check_known`).
"""

from __future__ import annotations

import getpass
import socket

from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError
from nats.js.errors import NotFoundError

from jetcrawl.contract.control import CANCELLED, PAUSED, RUNNING, JobControl, State
from jetcrawl.contract.errors import JetcrawlError
from jetcrawl.contract.settings import Settings, redact_urls
from jetcrawl.contract.topology import CONTROL_BUCKET
from jetcrawl.ops.jobstatus import check_job_name, check_known, when
from jetcrawl.plumbing.bus import connect
from jetcrawl.plumbing.control import ControlStore, purge_tasks

__all__ = ["ACTIONS", "by_whom", "run_control"]

ACTIONS: dict[str, State] = {"pause": PAUSED, "resume": RUNNING, "cancel": CANCELLED}


def by_whom() -> str:
    """user@host of this command: who a control record says asked."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container's)
        user = "?"
    return f"{user}@{socket.gethostname()}"


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
        await check_known(js, name)
        try:
            record, changed = await store.change(name, ACTIONS[action], by_whom())
            if record.state == CANCELLED:
                print(await _cancelled(nc, store, record, changed, settings.command_timeout_s))
            elif changed:
                print(f"job {name} {record.state}" + (" again" if record.runs else ""))
            else:
                print(f"job {name}: already {record.state}{_since(record)}; nothing changed")
        except (NatsError, TimeoutError) as e:  # refused (a user without the right) or no answer
            raise JetcrawlError(
                f"job {name}: NATS at {redact_urls(settings.nats_url)} did not take the "
                f"{action} ({e!r}); it needs KV {CONTROL_BUCKET} writes"
                + (" and the purge of its tasks" if action == "cancel" else "")
                + " (the admin user)"
            ) from e
        return 0
    finally:
        await nc.close()


async def _cancelled(
    nc: NATS, store: ControlStore, record: JobControl, changed: bool, timeout_s: float
) -> str:
    try:
        purged = await purge_tasks(nc, record.job, timeout_s)
    except (NatsError, TimeoutError) as e:
        raise JetcrawlError(
            f"job {record.job} is cancelled, but its queued tasks were not purged ({e!r}); "
            "the workers settle them as they come, or cancel again to purge them"
        ) from e
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
