"""Is the crawl done? An exact answer from a snapshot of JetStream state.

A worker publishes a page's links before it acks the page's task, and the dispatcher publishes
tasks before it acks the frontier message, so work is always visible somewhere: as a message in
a work queue (CRAWL_FRONTIER, CRAWL_TASKS: a message stays there until it is acked, so its count
is what waits plus what is in flight), or as a new last sequence of a stream. The crawl is
drained when two consecutive snapshots agree on every stream's last sequence and both work
queues are empty. The queues' counts need no consumer: task consumers are per lane and made on
demand, so a task may sit in a lane whose consumer does not exist yet, or was removed while idle.
A message JetStream gives up on (a poison task, a frontier message no delivery could admit)
stays in its queue, and its advisory waits on the ``poison`` consumer, until the dispatcher
dead-letters and deletes it; a paused job's tasks stay queued, so its crawl is not done.
"""

from __future__ import annotations

from dataclasses import dataclass

from nats.js import JetStreamContext

from jetcrawl.contract.topology import (
    ADVISORIES_STREAM,
    DEAD_STREAM,
    FRONTIER_STREAM,
    POISON_CONSUMER,
    RESULTS_STREAM,
    TASKS_STREAM,
)

WATCHED_STREAMS = (FRONTIER_STREAM, TASKS_STREAM, RESULTS_STREAM, DEAD_STREAM)

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


@dataclass(frozen=True, slots=True)
class Snapshot:
    last_seqs: tuple[int, ...]  # per WATCHED_STREAMS
    # The work queues' message counts (waiting and in flight); the frontier's counts the
    # advisories still pending on the poison consumer too.
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


async def snapshot(js: JetStreamContext) -> Snapshot:
    """JetStream's state now: four stream infos and the poison consumer's."""
    last_seqs = []
    counts = {}
    for stream in WATCHED_STREAMS:
        info = await js.stream_info(stream)
        last_seqs.append(info.state.last_seq)
        counts[stream] = info.state.messages
    poison = await js.consumer_info(ADVISORIES_STREAM, POISON_CONSUMER)
    poison_backlog = (poison.num_pending or 0) + (poison.num_ack_pending or 0)
    return Snapshot(
        last_seqs=tuple(last_seqs),
        frontier_backlog=counts[FRONTIER_STREAM] + poison_backlog,
        task_backlog=counts[TASKS_STREAM],
        results=counts[RESULTS_STREAM],
        dead=counts[DEAD_STREAM],
    )


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
