"""The seen set: KV bucket ``crawl_seen``, first writer wins, behind a bounded in-memory cache.

A URL is admitted by creating its fingerprint key; the value is the stream sequence of the frontier
message that admitted it. Creates are pipelined publishes straight to the bucket's subject with
``Nats-Expected-Last-Subject-Sequence: 0`` — nats-py's ``kv.create`` follows every rejection with a
``get``, which doubles the cost of the (common) duplicate. The cache remembers fingerprints already
known to be in the bucket, with their origin sequence when known, so repeated links cost no round
trip at all. It is bounded (LRU); evictions only cost a round trip later, never correctness.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from nats.js.errors import APIError, KeyDeletedError, KeyNotFoundError
from nats.js.kv import KeyValue

from jetcrawl.bus import EXPECTED_LAST_SUBJECT_SEQ, Outbox, Outgoing, PublishFailed
from jetcrawl.errors import JetcrawlError
from jetcrawl.topology import SEEN_SUBJECT_PREFIX

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


class SeenSet:
    def __init__(self, outbox: Outbox, kv: KeyValue, cache_size: int) -> None:
        self._outbox = outbox
        self._kv = kv
        self._cache: OrderedDict[str, int] = OrderedDict()
        self._cache_size = cache_size
        self.stats = SeenStats()

    def cached_origin(self, fp: str) -> int | None:
        """The origin sequence if the cache knows ``fp`` is seen (``UNKNOWN_ORIGIN``: unknown)."""
        origin = self._cache.get(fp)
        if origin is not None:
            self._cache.move_to_end(fp)
            self.stats.cache_hits += 1
        return origin

    async def create(self, marks: list[tuple[str, int]]) -> list[bool]:
        """Try to create each ``(fp, origin_seq)``; True where this call created the key."""
        if not marks:
            return []
        acks = await self._outbox.send(
            [
                Outgoing(
                    f"{SEEN_SUBJECT_PREFIX}{fp}",
                    str(origin).encode(),
                    {EXPECTED_LAST_SUBJECT_SEQ: "0"},
                )
                for fp, origin in marks
            ]
        )
        created: list[bool] = []
        for (fp, origin), ack in zip(marks, acks, strict=True):
            if not isinstance(ack, PublishFailed):
                self._remember(fp, origin)
                self.stats.created += 1
                created.append(True)
            elif isinstance(ack.cause, APIError) and ack.cause.err_code in WRONG_LAST_SEQUENCE:
                self._remember(fp, self._cache.get(fp, UNKNOWN_ORIGIN))
                self.stats.known_remote += 1
                created.append(False)
            else:
                raise SeenSetUnavailable(f"crawl_seen create failed: {ack}") from ack
        return created

    async def origin(self, fp: str) -> int:
        """The origin sequence stored for a seen ``fp`` (``UNKNOWN_ORIGIN`` if unreadable)."""
        try:
            entry = await self._kv.get(fp)
        except (KeyNotFoundError, KeyDeletedError):
            return UNKNOWN_ORIGIN
        except (TimeoutError, APIError) as e:
            raise SeenSetUnavailable(f"crawl_seen get {fp} failed: {e!r}") from e
        try:
            origin = int(entry.value or b"0")
        except ValueError:
            return UNKNOWN_ORIGIN
        self._remember(fp, origin)
        return origin

    def _remember(self, fp: str, origin: int) -> None:
        self._cache[fp] = origin
        self._cache.move_to_end(fp)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
            self.stats.cache_evictions += 1
