"""Is the crawl done? An exact answer from a snapshot of JetStream state.

A worker publishes a page's links before it acks the page's task, and the dispatcher publishes
tasks before it acks the frontier message, so work is always visible somewhere: as a pending or
unacknowledged message of a consumer, or as a new last sequence of a stream. The crawl is drained
when two consecutive snapshots agree on every stream's last sequence and show nothing pending and
nothing unacknowledged on any consumer. A message JetStream gives up on (a poison task, a frontier
message no delivery could admit) is visible too: the advisory it publishes then waits on the
``poison`` consumer until the message is dead-lettered.
"""

from __future__ import annotations

from dataclasses import dataclass

from nats.js import JetStreamContext

from jetcrawl.contract.topology import (
    ADVISORIES_STREAM,
    DEAD_STREAM,
    DISPATCH_CONSUMER,
    FRONTIER_STREAM,
    POISON_CONSUMER,
    RESULTS_STREAM,
    TASKS_PREFIX,
)
from jetcrawl.plumbing.topology import task_stream_infos

WATCHED_STREAMS = (FRONTIER_STREAM, RESULTS_STREAM, DEAD_STREAM)  # and the task streams

SNAPSHOT_EVERY_S = 0.5
# After a snapshot that shows nothing pending, unacked or queued, the one that may confirm it
# comes sooner, so the crawl ends sooner. Drained is still two snapshots that agree, whatever
# their interval: work in flight is always visible in one.
SETTLE_CHECK_S = 0.1
# A snapshot with at most this much left (queued, in flight) means the crawl may be over by the
# next look: the next ones come SETTLE_CHECK_S apart too, for NEARLY_IDLE_FOR_S at most, so a
# crawl that keeps a small backlog for long is not asked ten times a second.
NEARLY_IDLE = 8
NEARLY_IDLE_FOR_S = 2.0
CONSUMERS_PAGE = 256  # consumers nats-server lists per request


@dataclass(frozen=True, slots=True)
class Snapshot:
    last_seqs: tuple[int, ...]  # per WATCHED_STREAMS, then per task stream
    # Pending + unacked on the dispatch and poison consumers, and over every lane; the
    # work queues' message counts (an upper bound) when snapshot() could take its shortcut.
    frontier_backlog: int
    task_backlog: int
    results: int  # messages in CRAWL_RESULTS
    dead: int  # messages in CRAWL_DEAD

    @property
    def idle(self) -> bool:
        return self.frontier_backlog == 0 and self.task_backlog == 0

    def settled_after(self, earlier: Snapshot | None) -> bool:
        return (
            earlier is not None
            and earlier.idle
            and self.idle
            and earlier.last_seqs == self.last_seqs
        )


async def snapshot(js: JetStreamContext, shards: int, previous: Snapshot | None = None) -> Snapshot:
    """JetStream's state now; ``previous`` (the last snapshot) lets it skip the consumers.

    CRAWL_FRONTIER and the task streams are work queues: a message stays until it is acked or
    deleted, so their message counts bound the consumers' pending plus unacknowledged from
    above. They are the backlog, then, while the streams still move (the crawl cannot be
    settled in such a snapshot anyway) or when they are empty (the bound is exact). Otherwise
    the consumers are asked: a task JetStream gave up on stays in its stream, pending on no
    consumer, until the poison consumer has dead-lettered and deleted it. The shortcut saves
    most of a snapshot's API requests, which cost nats-server real CPU at two a second.
    """
    last_seqs = []
    counts = {}
    for stream in WATCHED_STREAMS:
        info = await js.stream_info(stream)
        last_seqs.append(info.state.last_seq)
        counts[stream] = info.state.messages
    tasks = await task_stream_infos(js)
    last_seqs += [info.state.last_seq for info in tasks]
    queued = sum(info.state.messages for info in tasks)
    poison = await js.consumer_info(ADVISORIES_STREAM, POISON_CONSUMER)
    poison_backlog = (poison.num_pending or 0) + (poison.num_ack_pending or 0)
    moving = previous is not None and previous.last_seqs != tuple(last_seqs)
    if moving or counts[FRONTIER_STREAM] == queued == 0:
        frontier_backlog = counts[FRONTIER_STREAM]
        task_backlog = queued
    else:
        dispatch = await js.consumer_info(FRONTIER_STREAM, DISPATCH_CONSUMER)
        frontier_backlog = (dispatch.num_pending or 0) + (dispatch.num_ack_pending or 0)
        task_backlog = sum([await _lanes_backlog(js, info.config.name or "") for info in tasks])
    return Snapshot(
        last_seqs=tuple(last_seqs),
        frontier_backlog=frontier_backlog + poison_backlog,
        task_backlog=task_backlog,
        results=counts[RESULTS_STREAM],
        dead=counts[DEAD_STREAM],
    )


async def _lanes_backlog(js: JetStreamContext, stream: str) -> int:
    """Pending + unacked over the lanes' consumers of task stream ``stream``; a lane no
    consumer takes yet (its shard's owner has not made it) counts all its tasks."""
    info = await js.stream_info(stream, subjects_filter=f"{TASKS_PREFIX}>")
    counts = dict(info.state.subjects or {})
    backlog = 0
    listed = 0
    while True:  # the server lists up to 256 consumers a page
        page = await js.consumers_info(stream, offset=listed)
        for consumer in page:
            subject = consumer.config.filter_subject
            if subject in counts:
                del counts[subject]
                backlog += (consumer.num_pending or 0) + (consumer.num_ack_pending or 0)
        listed += len(page)
        if len(page) < CONSUMERS_PAGE:
            return backlog + sum(counts.values())


class Cadence:
    """How long until the next snapshot of a crawl that is not drained yet."""

    def __init__(self) -> None:
        self._nearly_idle_since: float | None = None

    def next_in(self, snap: Snapshot, now: float) -> float:
        if snap.idle:
            return SETTLE_CHECK_S
        if snap.frontier_backlog + snap.task_backlog > NEARLY_IDLE:
            self._nearly_idle_since = None
            return SNAPSHOT_EVERY_S
        if self._nearly_idle_since is None:
            self._nearly_idle_since = now
        if now - self._nearly_idle_since < NEARLY_IDLE_FOR_S:
            return SETTLE_CHECK_S
        return SNAPSHOT_EVERY_S
