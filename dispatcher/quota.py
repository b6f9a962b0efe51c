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
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from nats.errors import Error as NatsError
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from jetcrawl.dispatcher.seen import SeenSetUnavailable

MAX_CAS_ATTEMPTS = 50


def host_key(job: str, host: str) -> str:
    """The counter name of ``host`` in ``job`` (KV keys cannot hold every host's characters)."""
    return f"{job}.{hashlib.blake2b(host.encode(), digest_size=8).hexdigest()}"


class AdmissionQuota:
    def __init__(self, kv: KeyValue, limit: int, prefix: str = "admitted") -> None:
        self._kv = kv
        self._limit = limit
        self._prefix = prefix

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
        for _ in range(MAX_CAS_ATTEMPTS):
            try:
                try:
                    entry = await self._kv.get(key)
                    used, revision = int(entry.value or b"0"), entry.revision or 0
                except KeyNotFoundError:
                    used, revision = 0, 0
                delta: int = delta_for(used)
                if delta == 0:
                    return 0
                if revision == 0:
                    await self._kv.create(key, str(used + delta).encode())
                else:
                    await self._kv.update(key, str(used + delta).encode(), last=revision)
                return abs(delta)
            except KeyWrongLastSequenceError:
                continue  # another dispatcher moved the counter; read it again
            except (TimeoutError, NatsError) as e:
                # Unanswered, no responders or no stream leader (an election): retry the batch.
                raise SeenSetUnavailable(f"crawl_jobs {key}: {e!r}") from e
        raise SeenSetUnavailable(f"crawl_jobs {key}: too much contention")

    def _key(self, name: str) -> str:
        return f"{self._prefix}.{name}"
