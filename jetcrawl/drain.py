"""Is the crawl done? An exact answer from a snapshot of JetStream state.

A worker publishes a page's links before it acks the page's task, and the dispatcher publishes
tasks before it acks the frontier message, so work is always visible somewhere: as a pending or
unacknowledged message of a consumer, or as a new last sequence of a stream. The crawl is drained
when two consecutive snapshots agree on every stream's last sequence and show nothing pending and
nothing unacknowledged on any consumer. A poison task is visible too: the advisory JetStream
publishes when it gives up on the task waits on the ``poison`` consumer until it is dead-lettered.
"""

from __future__ import annotations

from dataclasses import dataclass

from nats.js import JetStreamContext

from jetcrawl.topology import (
    ADVISORIES_STREAM,
    DEAD_STREAM,
    DISPATCH_CONSUMER,
    FRONTIER_STREAM,
    POISON_CONSUMER,
    RESULTS_STREAM,
    TASKS_STREAM,
    shard_consumer,
)

WATCHED_STREAMS = (FRONTIER_STREAM, TASKS_STREAM, RESULTS_STREAM, DEAD_STREAM)


@dataclass(frozen=True, slots=True)
class Snapshot:
    last_seqs: tuple[int, ...]  # per WATCHED_STREAMS
    frontier_backlog: int  # pending + unacked on the dispatch and poison consumers
    task_backlog: int  # pending + unacked over every shard consumer
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


async def snapshot(js: JetStreamContext, shards: int) -> Snapshot:
    last_seqs = []
    counts = {}
    for stream in WATCHED_STREAMS:
        info = await js.stream_info(stream)
        last_seqs.append(info.state.last_seq)
        counts[stream] = info.state.messages
    dispatch = await js.consumer_info(FRONTIER_STREAM, DISPATCH_CONSUMER)
    poison = await js.consumer_info(ADVISORIES_STREAM, POISON_CONSUMER)
    task_backlog = 0
    for shard in range(shards):
        info = await js.consumer_info(TASKS_STREAM, shard_consumer(shard))
        task_backlog += (info.num_pending or 0) + (info.num_ack_pending or 0)
    return Snapshot(
        last_seqs=tuple(last_seqs),
        frontier_backlog=(dispatch.num_pending or 0)
        + (dispatch.num_ack_pending or 0)
        + (poison.num_pending or 0)
        + (poison.num_ack_pending or 0),
        task_backlog=task_backlog,
        results=counts[RESULTS_STREAM],
        dead=counts[DEAD_STREAM],
    )
