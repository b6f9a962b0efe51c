"""jetcrawl/drain.py: the snapshot's shortcut through stream counts never hides a settled crawl."""

from __future__ import annotations

import dataclasses

import pytest
from nats.js import JetStreamContext

from jetcrawl.drain import snapshot
from jetcrawl.embedded import NatsServer
from jetcrawl.settings import Settings
from jetcrawl.topology import TASKS_STREAM, ensure, shard_consumer, task_subject
from tests.streams import eventually


async def test_a_task_jetstream_gave_up_on_counts_only_while_the_streams_move(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    settings = Settings(nats_url=nats_server.url, task_max_deliver=1, max_deferrals=0)
    await ensure(js, settings)
    await js.publish(task_subject(0), b"a task nobody will finish")
    sub = await js.pull_subscribe_bind(durable=shard_consumer(0), stream=TASKS_STREAM)
    [msg] = await sub.fetch(1, timeout=5)
    await msg.nak()  # its one delivery is spent: it stays in the work queue, pending nowhere
    with pytest.raises(TimeoutError):  # a pull request makes the server notice (and give up)
        await sub.fetch(1, timeout=1)

    async def given_up() -> bool:
        info = await js.consumer_info(TASKS_STREAM, shard_consumer(0))
        return (info.num_pending, info.num_ack_pending) == (0, 0)

    await eventually(given_up)
    exact = await snapshot(js, settings.shards)
    assert exact.task_backlog == 0, "no consumer has it: the crawl can settle (once poisoned)"
    still = await snapshot(js, settings.shards, previous=exact)
    assert still.task_backlog == 0, "nothing moved: the consumers are asked"
    moved = dataclasses.replace(exact, last_seqs=tuple(s - 1 for s in exact.last_seqs))
    bound = await snapshot(js, settings.shards, previous=moved)
    assert bound.task_backlog == 1 and not bound.idle, "while streams move, the stream count"
