"""Tasks in hand until their results are stored, so that a redelivery of one is never fetched.

A page is never fetched again because its result could not be published. While NATS cannot be
reached (this worker cut off, its server without a quorum), a result's publish fails with no
answer; the worker keeps the result and its links, its task still held (its in-progress acks go
out again once the connection is back), and publishes them again until they are stored, then
acks. If AckWait passed meanwhile (the in-progress acks did not get through either), JetStream
delivers the task again, to this worker, the shard's owner, while it still has the task in hand
(waiting for its host, fetching, or publishing): that delivery waits for the first one and, if
its result was stored, is acked with it (acks match by stream and sequence), never fetched. A task
whose ack was lost on its way comes back the same way and is acked again. Bounded: what is
in hand is among the worker's held tasks (``concurrency + waiting_max``), so a worker holding that
many results pulls no more; counted in the worker's ``CrawlStats``.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager

from nats.js.errors import APIError, ServerError, ServiceUnavailableError

from jetcrawl.plumbing.bus import PublishFailed
from jetcrawl.worker.outcome import TaskRef

__all__ = ["Unpublished", "unreachable"]

MAX_REMEMBERED_ACKS = 100_000  # the tasks acked here lately


def unreachable(failed: PublishFailed) -> bool:
    """Whether the publish failed for want of an answer (worth holding the result for), not
    because JetStream refused the message (retried a few times, then handed back)."""
    cause = failed.cause
    return not isinstance(cause, APIError) or isinstance(
        cause, ServiceUnavailableError | ServerError
    )


class _Held:
    __slots__ = ("done", "stored")

    def __init__(self) -> None:
        self.done = asyncio.Event()  # the holder is through, stored or not
        self.stored = False


class Unpublished:
    def __init__(self) -> None:
        self._held: dict[TaskRef, _Held] = {}  # the tasks in hand
        self._acked: OrderedDict[TaskRef, None] = OrderedDict()  # stored and acked, lately

    @contextmanager
    def in_hand(self, ref: TaskRef) -> Iterator[None]:
        """While the task ``ref`` is crawled (call ``settled`` first)."""
        held = self._held[ref] = _Held()
        try:
            yield
        finally:
            del self._held[ref]
            held.done.set()

    def stored(self, ref: TaskRef) -> None:
        """The task's records are stored: any delivery of it from now on is acked unfetched."""
        held = self._held.get(ref)
        if held is not None:
            held.stored = True
        self._acked[ref] = None
        self._acked.move_to_end(ref)
        while len(self._acked) > MAX_REMEMBERED_ACKS:
            self._acked.popitem(last=False)

    async def settled(self, ref: TaskRef) -> bool:
        """Whether a delivery of the task ``ref`` is one whose result is stored here already
        (waiting for a delivery of it in hand); False: crawl it, ``in_hand`` at once."""
        while (held := self._held.get(ref)) is not None:  # one in hand: wait for it
            await held.done.wait()
            if held.stored:
                return True
        return ref in self._acked
