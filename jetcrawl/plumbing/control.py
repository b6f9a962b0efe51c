"""Job run states in KV ``crawl_control``: the changes ``jetcrawl job pause|resume|cancel`` make,
and the watch the dispatcher and the worker keep (:mod:`jetcrawl.contract.control`);
:func:`purge_tasks` takes a cancelled job's queued tasks out of the task streams.

A change is a compare-and-set on the job's record, so two commands at once cannot both cancel
(the cancellation is recorded once) nor resume a job another just cancelled. A job without a
record runs; so does one whose record the watch cannot read (logged, the previous state kept).
"""

from __future__ import annotations

import logging
import time

import orjson
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import (
    APIError,
    KeyDeletedError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NoKeysError,
)
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from jetcrawl.contract.control import CANCELLED, PAUSED, RUNNING, JobControl, State
from jetcrawl.contract.errors import JetcrawlError, MessageError
from jetcrawl.contract.topology import CONTROL_BUCKET, job_tasks
from jetcrawl.plumbing.kvwatch import KvWatch
from jetcrawl.plumbing.topology import task_stream_infos

__all__ = ["ControlStore", "ControlWatch", "JobCancelled", "purge_tasks"]

log = logging.getLogger(__name__)

MAX_CAS_ATTEMPTS = 20


class JobCancelled(JetcrawlError):
    """A cancelled job cannot run again: its cancellation is final."""


class ControlStore:
    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    @classmethod
    async def open(cls, js: JetStreamContext) -> ControlStore:
        return cls(await js.key_value(CONTROL_BUCKET))

    async def get(self, job: str) -> JobControl:
        """The job's state; a job never changed runs."""
        current, _ = await self._latest(job)
        return current or JobControl(job, RUNNING, 0.0)

    async def names(self) -> list[str]:
        """The jobs whose state was ever changed."""
        try:
            return sorted(await self._kv.keys())
        except NoKeysError:
            return []

    async def change(self, job: str, state: State, by: str) -> tuple[JobControl, bool]:
        """Set ``job`` to ``state``: the record now, and whether this call changed it. A
        cancelled job refuses every change (:class:`JobCancelled`)."""
        for _ in range(MAX_CAS_ATTEMPTS):
            current, revision = await self._latest(job)
            if current is not None and current.state == CANCELLED:
                if state == CANCELLED:
                    return current, False
                raise JobCancelled(
                    f"job {job!r} was cancelled at {_when(current.at)}; a cancelled job cannot "
                    "run again (start it under a new name)"
                )
            if (current.state if current else RUNNING) == state:
                return current or JobControl(job, RUNNING, 0.0), False
            record = JobControl(job, state, time.time(), by)
            if await self._write(job, record, revision):
                return record, True
        raise JetcrawlError(f"job {job!r}: too many changes at once, try again")

    async def record_purged(self, job: str, purged: int) -> JobControl:
        """Add ``purged`` tasks to the cancelled job's record."""
        for _ in range(MAX_CAS_ATTEMPTS):
            current, revision = await self._latest(job)
            if current is None or current.state != CANCELLED:
                raise JetcrawlError(f"job {job!r} is not cancelled")
            record = JobControl(job, CANCELLED, current.at, current.by, current.purged + purged)
            if await self._write(job, record, revision):
                return record
        raise JetcrawlError(f"job {job!r}: too many changes at once, try again")

    async def _write(self, job: str, record: JobControl, revision: int) -> bool:
        try:
            if revision == 0:
                await self._kv.create(job, record.to_wire())
            else:
                await self._kv.update(job, record.to_wire(), last=revision)
        except KeyWrongLastSequenceError:
            return False  # another change came first: look again
        return True

    async def _latest(self, job: str) -> tuple[JobControl | None, int]:
        try:
            entry = await self._kv.get(job)
        except (KeyNotFoundError, KeyDeletedError):
            return None, 0
        try:
            return JobControl.from_wire(entry.value or b""), entry.revision or 0
        except MessageError as e:
            raise JetcrawlError(f"the control record of job {job!r} is unreadable: {e}") from e


class ControlWatch(KvWatch):
    """Every job's state, kept by a KV watch; ``run()`` until the stop event."""

    def __init__(self, js: JetStreamContext) -> None:
        super().__init__(js, CONTROL_BUCKET)
        self._states: dict[str, JobControl] = {}
        self.changes = 0  # entries applied: a watcher of many jobs compares it

    def state(self, job: str) -> State:
        record = self._states.get(job)
        return RUNNING if record is None else record.state

    def runs(self, job: str) -> bool:
        record = self._states.get(job)
        return record is None or record.state == RUNNING

    def paused(self) -> frozenset[str]:
        return frozenset(j for j, r in self._states.items() if r.state == PAUSED)

    def cancelled(self) -> frozenset[str]:
        return frozenset(j for j, r in self._states.items() if r.state == CANCELLED)

    async def wait_runs_or_cancelled(self, job: str) -> State:
        """Until ``job`` runs again or is cancelled; which of the two."""
        await self.wait_for(lambda: self.state(job) != PAUSED)
        return self.state(job)

    def apply(self, entry: KeyValue.Entry) -> None:
        self.changes += 1
        if entry.operation in (KV_DEL, KV_PURGE):
            self._states.pop(entry.key, None)
            return
        try:
            record = JobControl.from_wire(entry.value or b"")
        except MessageError as e:
            log.warning("job %s: unreadable control record kept out: %s", entry.key, e)
            return
        if self.state(entry.key) != record.state:
            log.info("job %s is %s (by %s)", entry.key, record.state, record.by or "?")
        self._states[entry.key] = record


async def purge_tasks(nc: NATS, job: str, timeout_s: float) -> int:
    """Remove every queued task of ``job`` (all shards and levels) from every task stream; how
    many went. The JetStream API's answer has the count; nats-py's ``purge_stream`` drops it."""
    purged = 0
    for info in await task_stream_infos(nc.jetstream()):
        reply = await nc.request(
            f"$JS.API.STREAM.PURGE.{info.config.name}",
            orjson.dumps({"filter": job_tasks(job)}),
            timeout=timeout_s,
        )
        answer = orjson.loads(reply.data)
        if "error" in answer:
            APIError.from_error(answer["error"])  # raises the matching nats-py error
        purged += int(answer.get("purged", 0))
    return purged


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))
