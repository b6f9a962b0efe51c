"""The seen set: KV bucket ``crawl_seen``, first writer wins, behind a bounded in-memory cache.

With ``partitions`` K > 1 it is K buckets ``crawl_seen_<p>``, each holding the marks of a
range of shards (K streams, K Raft groups: their leaders spread over the cluster); the caller says
which partition each key is in (``partition_of``), and the rest is the same per bucket.

A URL is admitted by creating its fingerprint key; the value is the stream sequence of the frontier
message that admitted it, and the key's revision tells this crawl of the URL from a later one (with
``recrawl_after_s`` a mark carries a per-message TTL; once it has expired the URL can be admitted
again). Creates are pipelined publishes straight to the bucket's subject with
``Nats-Expected-Last-Subject-Sequence: 0`` — nats-py's ``kv.create`` follows every rejection with a
``get``, which doubles the cost of the (common) duplicate. The cache remembers fingerprints already
known to be in the bucket, with their origin sequence when known, so repeated links cost no round
trip at all. It is bounded (LRU); evictions only cost a round trip later, never correctness.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.errors import APIError, NotFoundError

from jetcrawl.contract.errors import JetcrawlError
from jetcrawl.contract.topology import seen_stream, seen_subject_prefix
from jetcrawl.plumbing.bus import EXPECTED_LAST_SUBJECT_SEQ, TTL, Outbox, Outgoing, PublishFailed

WRONG_LAST_SEQUENCE = (10071, 10164)  # JSStreamWrongLastSequence(Constant)Err
UNKNOWN_ORIGIN = 0


class SeenSetUnavailable(JetcrawlError):
    """The bucket could not answer; the batch must be retried, nothing was decided."""


@dataclass(slots=True)
class SeenStats:
    created: int = 0
    known_remote: int = 0
    cache_hits: int = 0
    cache_evictions: int = 0
    read_back: int = 0  # marks read from the stream leader (a redelivery's unknown origins)


@dataclass(frozen=True, slots=True)
class Mark:
    """What the bucket says of a seen URL: the admitting frontier sequence and the revision."""

    origin: int  # UNKNOWN_ORIGIN when not known here
    revision: int  # 0 when not known here


UNKNOWN = Mark(UNKNOWN_ORIGIN, 0)


class SeenSet:
    def __init__(
        self,
        outbox: Outbox,
        js: JetStreamContext,
        cache_size: int,
        ttl_s: float = 0.0,
        partitions: int = 1,
    ) -> None:
        self._outbox = outbox
        self._js = js
        self._streams = [seen_stream(p, partitions) for p in range(partitions)]
        self._prefixes = [seen_subject_prefix(p, partitions) for p in range(partitions)]
        self._ttl_s = ttl_s
        self._ttl_header = {TTL: str(max(1, round(ttl_s)))} if ttl_s > 0 else {}
        # fp -> (mark, monotonic time it stops being trusted: the mark's expiry, if any)
        self._cache: OrderedDict[str, tuple[Mark, float]] = OrderedDict()
        self._cache_size = cache_size
        self.stats = SeenStats()

    def cached(self, fp: str) -> Mark | None:
        """The mark if the cache knows ``fp`` is seen (fields may be unknown)."""
        entry = self._cache.get(fp)
        if entry is None:
            return None
        mark, trusted_until = entry
        if trusted_until != math.inf and time.monotonic() >= trusted_until:
            del self._cache[fp]  # the bucket's copy may have expired: ask it
            return None
        self._cache.move_to_end(fp)
        self.stats.cache_hits += 1
        return mark

    async def create(
        self,
        marks: list[tuple[str, int]],
        ttls: Mapping[str, float] | None = None,
        partition_of: Mapping[str, int] | None = None,
    ) -> list[Mark | None]:
        """Try to create each ``(fp, origin_seq)``: the new mark, or None where it existed.
        ``ttls``: a mark's own lifetime in seconds (its job spec's ``recrawl_after_s``);
        ``partition_of``: a key's partition (0 if absent)."""
        if not marks:
            return []
        ttls = ttls or {}
        where = partition_of or {}
        acks = await self._outbox.send(
            [
                Outgoing(
                    f"{self._prefixes[where.get(fp, 0)]}{fp}",
                    str(origin).encode(),
                    {EXPECTED_LAST_SUBJECT_SEQ: "0", **self._ttl_header_of(ttls.get(fp))},
                )
                for fp, origin in marks
            ]
        )
        created: list[Mark | None] = []
        for (fp, origin), ack in zip(marks, acks, strict=True):
            if not isinstance(ack, PublishFailed):
                mark = Mark(origin, ack.seq)
                self._remember(fp, mark, ttls.get(fp))
                self.stats.created += 1
                created.append(mark)
            elif isinstance(ack.cause, APIError) and ack.cause.err_code in WRONG_LAST_SEQUENCE:
                self._remember(fp, self._cache.get(fp, (UNKNOWN, 0.0))[0], ttls.get(fp))
                self.stats.known_remote += 1
                created.append(None)
            else:
                raise SeenSetUnavailable(f"seen set create failed: {ack}") from ack
        return created

    async def read(self, fp: str, ttl_s: float | None = None, partition: int = 0) -> Mark:
        """The stored mark of ``fp``, whose create the bucket has just rejected as existing
        (``UNKNOWN`` if its value is not an origin sequence).

        Asked of the stream's leader, not with a direct get: any replica answers a direct get,
        and one still catching up (after an outage) answers "not found" for a mark that exists.
        A mark missing after its create was rejected (a stale answer, or its TTL ran out since)
        decides nothing, so it raises ``SeenSetUnavailable`` and the batch is tried again.
        """
        stream = self._streams[partition]
        try:
            msg = await self._js.get_msg(stream, subject=f"{self._prefixes[partition]}{fp}")
            self.stats.read_back += 1
        except NotFoundError:
            raise SeenSetUnavailable(f"{stream} has no mark {fp} after rejecting it") from None
        except (TimeoutError, NatsError) as e:  # also no responders, no stream leader
            raise SeenSetUnavailable(f"{stream} get {fp} failed: {e!r}") from e
        try:
            mark = Mark(int(msg.data or b"0"), msg.seq or 0)
        except ValueError:
            return UNKNOWN
        self._remember(fp, mark, ttl_s)
        return mark

    def _ttl_header_of(self, ttl_s: float | None) -> dict[str, str]:
        return self._ttl_header if ttl_s is None else {TTL: str(max(1, round(ttl_s)))}

    def _remember(self, fp: str, mark: Mark, ttl_s: float | None = None) -> None:
        # Without TTL a mark is forever; with one, trust it a little less long than it lives.
        ttl_s = self._ttl_s if ttl_s is None else ttl_s
        trusted_until = time.monotonic() + ttl_s * 0.9 if ttl_s > 0 else math.inf
        self._cache[fp] = (mark, trusted_until)
        self._cache.move_to_end(fp)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
            self.stats.cache_evictions += 1
