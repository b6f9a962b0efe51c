"""Job specs in KV ``crawl_specs``: versioned puts, reads, and the watch the services keep.

:class:`SpecStore` is what ``jetcrawl job`` uses: a put writes version N+1 with a compare-and-set
on the key's revision (two puts at once cannot both be version N+1) and writes nothing when the
document is the one stored already; the bucket keeps ``SPEC_VERSIONS_KEPT`` versions per job.

:class:`SpecWatch` is what the dispatcher and the worker use: a KV watch that keeps the latest
spec of every job in memory, so a spec put mid-crawl applies to the next URL admitted and the
next task fetched, with no read on the hot path. A record it cannot read is logged and the
previous version kept; the watch is made again after an error. Across a server restart the
watch is nats-py's ordered consumer, which notices the missed heartbeats and starts again after
the last version it delivered (tests/test_specs.py): a spec put meanwhile applies a little later.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.errors import (
    KeyDeletedError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NoKeysError,
)
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from jetcrawl.contract.errors import JetcrawlError, MessageError
from jetcrawl.contract.jobs import JobSpec, StoredSpec, canonical_doc
from jetcrawl.contract.topology import SPECS_BUCKET
from jetcrawl.plumbing.kvwatch import KvWatch

__all__ = ["PutOutcome", "SpecStore", "SpecWatch", "UnknownJob"]

log = logging.getLogger(__name__)

MAX_CAS_ATTEMPTS = 20


class UnknownJob(JetcrawlError):
    """No spec of that name (or not that version of it) is stored."""

    def __init__(self, name: str, version: int | None = None) -> None:
        what = f"job {name!r}" if version is None else f"version {version} of job {name!r}"
        super().__init__(f"no {what} in {SPECS_BUCKET}")
        self.name = name
        self.version = version


@dataclass(frozen=True, slots=True)
class PutOutcome:
    stored: StoredSpec  # the version stored now
    changed: bool  # False: the document was the stored one; nothing was written


class SpecStore:
    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    @classmethod
    async def open(cls, js: JetStreamContext) -> SpecStore:
        return cls(await js.key_value(SPECS_BUCKET))

    async def put(self, spec: JobSpec) -> PutOutcome:
        for _ in range(MAX_CAS_ATTEMPTS):
            current, revision = await self._latest(spec.name)
            if current is not None and canonical_doc(current.spec.doc) == canonical_doc(spec.doc):
                return PutOutcome(current, changed=False)
            stored = StoredSpec((current.version if current else 0) + 1, time.time(), spec)
            try:
                if revision == 0:
                    await self._kv.create(spec.name, stored.to_wire())
                else:
                    await self._kv.update(spec.name, stored.to_wire(), last=revision)
            except KeyWrongLastSequenceError:
                continue  # another put came first: compare with it
            return PutOutcome(stored, changed=True)
        raise JetcrawlError(f"job {spec.name!r}: too many puts at once, try again")

    async def get(self, name: str, version: int | None = None) -> StoredSpec:
        if version is None:
            current, _ = await self._latest(name)
            if current is None:
                raise UnknownJob(name)
            return current
        for stored in await self.history(name):
            if stored.version == version:
                return stored
        raise UnknownJob(name, version)

    async def history(self, name: str) -> list[StoredSpec]:
        """The versions of ``name`` the bucket keeps, oldest first."""
        try:
            entries = await self._kv.history(name)
        except NoKeysError:
            raise UnknownJob(name) from None
        out = [_read(name, e.value) for e in entries if e.value and e.operation is None]
        if not out:
            raise UnknownJob(name)
        return out

    async def names(self) -> list[str]:
        try:
            return sorted(await self._kv.keys())
        except NoKeysError:
            return []

    async def _latest(self, name: str) -> tuple[StoredSpec | None, int]:
        try:
            entry = await self._kv.get(name)
        except (KeyNotFoundError, KeyDeletedError):
            return None, 0
        return _read(name, entry.value or b""), entry.revision or 0


def _read(name: str, data: bytes) -> StoredSpec:
    try:
        return StoredSpec.from_wire(data)
    except MessageError as e:
        raise JetcrawlError(f"the stored spec of job {name!r} is unreadable: {e}") from e


class SpecWatch(KvWatch):
    """The latest spec of every job, kept by a KV watch. ``run()`` until the stop event."""

    def __init__(self, js: JetStreamContext) -> None:
        super().__init__(js, SPECS_BUCKET)
        self._specs: dict[str, StoredSpec] = {}

    def current(self, job: str) -> StoredSpec | None:
        return self._specs.get(job)

    def jobs(self) -> list[str]:
        """The jobs that have a spec now."""
        return sorted(self._specs)

    async def wait_version(self, job: str, version: int) -> None:
        """Until the watch holds ``version`` (or a later one) of ``job``."""
        await self.wait_for(
            lambda: (s := self._specs.get(job)) is not None and s.version >= version
        )

    def apply(self, entry: KeyValue.Entry) -> None:
        if entry.operation in (KV_DEL, KV_PURGE):
            self._specs.pop(entry.key, None)
            return
        try:
            stored = StoredSpec.from_wire(entry.value or b"")
        except MessageError as e:
            log.warning("job %s: unreadable spec record kept out: %s", entry.key, e)
            return
        known = self._specs.get(entry.key)
        if known is None or stored.version >= known.version:
            if known is None or stored.version > known.version:
                log.info("job %s: spec version %d applies", entry.key, stored.version)
            self._specs[entry.key] = stored
