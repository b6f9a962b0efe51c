"""jetcrawl/local/drain.py: the snapshot's shortcut through stream counts never hides a settled
crawl, and a lane without a consumer is never taken for an empty one; the cadence of snapshots."""

from __future__ import annotations

import dataclasses

import pytest
from nats.js import JetStreamContext

from jetcrawl.contract.messages import DEFAULT_JOB, DEFAULT_PRIORITY
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import (
    TASKS_STREAM,
    lane_config,
    task_subject,
)
from jetcrawl.local.drain import (
    NEARLY_IDLE,
    NEARLY_IDLE_FOR_S,
    SETTLE_CHECK_S,
    SNAPSHOT_EVERY_S,
    Cadence,
    Snapshot,
    snapshot,
)
from jetcrawl.local.embedded import NatsServer
from jetcrawl.plumbing.topology import ensure
from tests.support.streams import eventually


async def test_a_task_jetstream_gave_up_on_counts_only_while_the_streams_move(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    settings = Settings(nats_url=nats_server.url, task_max_deliver=1, max_deferrals=0)
    await ensure(js, settings)
    await js.publish(task_subject(0), b"a task nobody will finish")
    lane = lane_config(settings, 0, DEFAULT_PRIORITY, DEFAULT_JOB)
    await js.add_consumer(TASKS_STREAM, lane)
    sub = await js.pull_subscribe_bind(durable=lane.durable_name or "", stream=TASKS_STREAM)
    [msg] = await sub.fetch(1, timeout=5)
    await msg.nak()  # its one delivery is spent: it stays in the work queue, pending nowhere
    with pytest.raises(TimeoutError):  # a pull request makes the server notice (and give up)
        await sub.fetch(1, timeout=1)

    async def given_up() -> bool:
        info = await js.consumer_info(TASKS_STREAM, lane.durable_name or "")
        return (info.num_pending, info.num_ack_pending) == (0, 0)

    await eventually(given_up)
    exact = await snapshot(js, settings.shards)
    assert exact.task_backlog == 0, "no consumer has it: the crawl can settle (once poisoned)"
    still = await snapshot(js, settings.shards, previous=exact)
    assert still.task_backlog == 0, "nothing moved: the consumers are asked"
    moved = dataclasses.replace(exact, last_seqs=tuple(s - 1 for s in exact.last_seqs))
    bound = await snapshot(js, settings.shards, previous=moved)
    assert bound.task_backlog == 1 and not bound.idle, "while streams move, the stream count"


async def test_a_task_in_a_lane_without_a_consumer_is_work_left(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    """A lane's consumer is made by its shard's owner when it sees the lane, and removed by
    the server when idle: a task published meanwhile is in no consumer's counts."""
    settings = Settings(nats_url=nats_server.url)
    await ensure(js, settings)
    empty = await snapshot(js, settings.shards)
    again = await snapshot(js, settings.shards, previous=empty)
    assert empty.idle and again.settled_after(empty), "the negative case: settled"
    await js.publish(task_subject(3, 0, "urgent"), b"a task of a lane nobody pulls yet")
    # another lane of the shard has a consumer, with nothing for it
    await js.add_consumer(TASKS_STREAM, lane_config(settings, 3, 1, "urgent"))
    first = await snapshot(js, settings.shards)
    again = await snapshot(js, settings.shards, previous=first)
    assert first.task_backlog == again.task_backlog == 1, "the consumers are asked, and the lane"
    assert not again.settled_after(first), "same sequences, but a task is queued"


def _left(tasks: int, frontier: int = 0) -> Snapshot:
    return Snapshot(
        last_seqs=(1,), frontier_backlog=frontier, task_backlog=tasks, results=0, dead=0
    )


def test_snapshots_come_sooner_when_little_is_left_but_not_for_long() -> None:
    cadence = Cadence()
    assert cadence.next_in(_left(500), 0.0) == SNAPSHOT_EVERY_S  # busy
    assert cadence.next_in(_left(0), 1.0) == SETTLE_CHECK_S  # idle: confirm soon
    # Nearly idle (queued and in flight, frontier included): the crawl may be over any moment.
    assert cadence.next_in(_left(NEARLY_IDLE - 2, 2), 2.0) == SETTLE_CHECK_S
    assert cadence.next_in(_left(3), 2.0 + NEARLY_IDLE_FOR_S / 2) == SETTLE_CHECK_S
    # A small backlog that stays: back to the usual pace.
    assert cadence.next_in(_left(3), 2.0 + NEARLY_IDLE_FOR_S) == SNAPSHOT_EVERY_S
    assert cadence.next_in(_left(NEARLY_IDLE + 1), 10.0) == SNAPSHOT_EVERY_S
    # Work came back, and now little is left again: soon again.
    assert cadence.next_in(_left(1), 11.0) == SETTLE_CHECK_S
