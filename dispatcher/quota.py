"""``max_pages`` and ``max_urls_per_host`` across the whole mesh: admission counters in KV.

``max_pages`` counts per job (key ``admitted.<job>``), ``max_urls_per_host`` per job and host
(key ``hosts.<job>.<digest of the host>``: a spider trap's endless URLs stop at the limit), both in
bucket ``crawl_jobs``.

Before creating seen marks, a dispatcher reserves as many admissions as it has candidates with a
compare-and-set on the counter; after the creates it gives back what it did not use. Every
dispatcher goes through the same counter, so the number of tasks a job gets never exceeds the
limit: the overshoot is zero. A dispatcher that crashes between reserving and giving back leaves
the counter high, so a crash can only make the crawl stop short (by at most one batch), never
run over.

A counter's change is one write, not a read and a write: the dispatcher remembers each counter's
value and revision as it last wrote or read them (a counter it never met, as absent) and writes
on that; a counter moved meanwhile fails the write and is read again. A counter found moved is
read first at its next change too (two dispatchers taking turns on a host would otherwise pay a
failed write each time), until a read shows it unmoved since. A refusal (no room left) is only
ever decided on a value just read, since a remembered one can predate a give-back.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from nats.errors import Error as NatsError
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from jetcrawl.dispatcher.seen import SeenSetUnavailable

MAX_CAS_ATTEMPTS = 50
REMEMBERED = 100_000  # counters whose value and revision are kept (a host's each, in a broad crawl)
_ABSENT = (0, 0)  # (value, revision) of a counter not in the bucket


@dataclass(slots=True)
class _Counter:
    """A counter as this dispatcher last wrote or read it."""

    value: int
    revision: int
    moved: bool = False  # another dispatcher moved it since: read it before the next write


def host_key(job: str, host: str) -> str:
    """The counter name of ``host`` in ``job`` (KV keys cannot hold every host's characters)."""
    return f"{job}.{hashlib.blake2b(host.encode(), digest_size=8).hexdigest()}"


class AdmissionQuota:
    def __init__(self, kv: KeyValue, limit: int, prefix: str = "admitted") -> None:
        self._kv = kv
        self._limit = limit
        self._prefix = prefix
        self._known: OrderedDict[str, _Counter] = OrderedDict()  # least recently met first

    @property
    def limited(self) -> bool:
        return self._limit > 0

    async def reserve(self, job: str, wanted: int, limit: int | None = None) -> int:
        """Take up to ``wanted`` admissions for ``job``; returns how many were granted.
        ``limit``: the job's own (its spec's ``max_pages``) instead of the setting's."""
        limit = self._limit if limit is None else limit
        if limit <= 0:
            return wanted
        return await self._change(job, lambda used: min(wanted, max(0, limit - used)))

    async def give_back(self, job: str, unused: int) -> None:
        if unused > 0:
            await self._change(job, lambda used: -min(unused, used))

    async def used(self, job: str) -> int:
        try:
            entry = await self._kv.get(self._key(job))
        except KeyNotFoundError:
            return 0
        return int(entry.value or b"0")

    async def _change(self, job: str, delta_for: Callable[[int], int]) -> int:
        key = self._key(job)
        counter = self._known.get(key)
        remembered = None if counter is None else (counter.value, counter.revision)
        known = None if counter is not None and counter.moved else (remembered or _ABSENT)
        read = False  # whether ``known`` was just read, not remembered
        for _ in range(MAX_CAS_ATTEMPTS):
            try:
                if known is None:
                    known, read = await self._read(key), True
                    if counter is not None and known == remembered:
                        counter.moved = False  # unmoved since: the next change writes first
                used, revision = known
                delta: int = delta_for(used)
                if delta == 0:
                    if not read:
                        known = None  # a remembered counter may have room again: read it
                        continue
                    return 0
                # Revision 0: the counter must not exist (nats-py's create reads it on failure).
                written = await self._kv.update(key, str(used + delta).encode(), last=revision)
                self._remember(key, used + delta, written)
                return abs(delta)
            except KeyWrongLastSequenceError:
                if not read and counter is not None:
                    counter.moved = True
                known = None  # another dispatcher moved the counter; read it again
            except (TimeoutError, NatsError) as e:
                self._known.pop(key, None)
                # Unanswered, no responders or no stream leader (an election): retry the batch.
                raise SeenSetUnavailable(f"crawl_jobs {key}: {e!r}") from e
        raise SeenSetUnavailable(f"crawl_jobs {key}: too much contention")

    async def _read(self, key: str) -> tuple[int, int]:
        try:
            entry = await self._kv.get(key)
        except KeyNotFoundError as e:
            # A deleted or purged counter is written over its delete marker's revision.
            marker = e.entry.revision if e.entry is not None else None
            return 0, marker or 0
        return int(entry.value or b"0"), entry.revision or 0

    def _remember(self, key: str, value: int, revision: int) -> None:
        counter = self._known.get(key)
        if counter is None:
            self._known[key] = _Counter(value, revision)
        else:  # a counter found moved stays so until a read shows it unmoved
            counter.value, counter.revision = value, revision
            self._known.move_to_end(key)
        while len(self._known) > REMEMBERED:
            self._known.popitem(last=False)

    def _key(self, name: str) -> str:
        return f"{self._prefix}.{name}"
