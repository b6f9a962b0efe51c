"""jetcrawl/pull.py: fetch's protocol on a real server, without a task per message."""

from __future__ import annotations

import asyncio
import os
import signal

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig
from nats.js.errors import ServiceUnavailableError

from jetcrawl.local.embedded import NatsCluster, NatsServer
from jetcrawl.plumbing.natsinternals import delivery_inbox, next_request_subject
from jetcrawl.plumbing.pull import Cut, end_requests, pull
from tests.support.streams import add_replicated, eventually


async def _consumer(js: JetStreamContext, messages: int) -> JetStreamContext.PullSubscription:
    await js.add_stream(StreamConfig(name="P", subjects=["p.>"]))
    for n in range(messages):
        await js.publish(f"p.{n}", str(n).encode())
    return await js.pull_subscribe(
        "p.>", durable="c", config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=60)
    )


async def test_a_batch_comes_whole_and_in_order_then_the_rest(js: JetStreamContext) -> None:
    sub = await _consumer(js, 10)
    first = await pull(sub, 4, 2.0)
    rest = await pull(sub, 100, 2.0)  # fewer than asked: the server's "no messages" ends it
    assert [m.data for m in first + rest] == [str(n).encode() for n in range(10)]
    for m in first + rest:
        await m.ack()
    info = await js.consumer_info("P", "c")
    assert info.num_pending == 0


async def test_drained_says_whether_the_server_ended_a_short_batch(
    nats_server: NatsServer, nc: NATS, js: JetStreamContext
) -> None:
    sub = await _consumer(js, 10)
    whole = await pull(sub, 4, 2.0)
    assert len(whole) == 4 and not whole.drained, "a whole batch says nothing of the rest"
    rest = await pull(sub, 100, 2.0)
    assert len(rest) == 6 and rest.drained, "the server's 'no messages' ended it"

    # Two delivered for an earlier request wait in the queue; then the server answers nothing.
    for n in range(10, 14):
        await js.publish(f"p.{n}", str(n).encode())
    await nc.publish(
        next_request_subject(sub), b'{"batch": 2, "expires": 5000000000}', delivery_inbox(sub)
    )

    async def queued() -> bool:
        await nc.flush()
        return bool(sub.pending_msgs == 2)

    await eventually(queued)
    assert nats_server.pid is not None
    os.kill(nats_server.pid, signal.SIGSTOP)  # a server too busy to answer within the wait
    try:
        short = await pull(sub, 5, 0.3)
    finally:
        os.kill(nats_server.pid, signal.SIGCONT)
    assert [m.data for m in short] == [b"10", b"11"]
    assert not short.drained, "the deadline ended it: more may come late"


async def test_with_nothing_there_it_returns_as_soon_as_work_arrives(
    js: JetStreamContext,
) -> None:
    sub = await _consumer(js, 0)
    waiting = asyncio.create_task(pull(sub, 5, 30.0))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    for n in range(3):
        await js.publish(f"p.{n}", str(n).encode())
    async with asyncio.timeout(5):  # not when the 30 s request expires, nor when 5 are in
        got = await waiting
    rest = await pull(sub, 5, 1.0)  # the others at once, to the next pull
    assert [m.data for m in got + rest] == [b"0", b"1", b"2"]
    assert sub.pending_msgs == 0, "the waiting request asked for one: nothing strays later"


async def test_an_empty_consumer_times_out_with_timeout_error(js: JetStreamContext) -> None:
    sub = await _consumer(js, 0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError):
        await pull(sub, 3, 0.3)
    assert loop.time() - started < 3.0


async def test_leftovers_of_an_earlier_request_come_first_and_count(
    nc: NATS, js: JetStreamContext
) -> None:
    sub = await _consumer(js, 0)
    # A request whose deliveries nobody is reading (as a pull that returned early leaves one).
    await nc.publish(
        next_request_subject(sub), b'{"batch": 3, "expires": 5000000000}', delivery_inbox(sub)
    )
    for n in range(3):
        await js.publish(f"p.{n}", str(n).encode())

    async def queued() -> bool:
        await nc.flush()
        return bool(sub.pending_msgs >= 3)

    await eventually(queued)
    assert sub.pending_msgs == 3 and sub.pending_bytes == 3
    got = await pull(sub, 2, 1.0)
    assert [m.data for m in got] == [b"0", b"1"], "from the queue, no request needed"
    assert sub.pending_msgs == 1 and sub.pending_bytes == 1
    got = await pull(sub, 5, 1.0)
    assert [m.data for m in got] == [b"2"]
    assert sub.pending_bytes == 0


async def test_a_cut_pull_returns_at_once_and_a_pull_after_the_cut_asks_nothing(
    nc: NATS, js: JetStreamContext
) -> None:
    sub = await _consumer(js, 0)
    cut = Cut()
    waiting = asyncio.create_task(pull(sub, 5, 30.0, cut))
    await asyncio.sleep(0.2)  # its request is out and waiting (as in the test above)
    assert not waiting.done()
    cut.set()
    async with asyncio.timeout(5):  # not when the 30 s request expires
        with pytest.raises(TimeoutError):
            await waiting
    await js.publish("p.0", b"0")  # the cut pull's request is still out: it takes this one

    async def queued() -> bool:
        await nc.flush()
        return bool(sub.pending_msgs == 1)

    await eventually(queued)
    assert [m.data for m in await pull(sub, 5, 30.0, cut)] == [b"0"], "the queue still counts"
    async with asyncio.timeout(5):
        with pytest.raises(TimeoutError):
            await pull(sub, 5, 30.0, cut)  # nothing queued, and no request sent


async def test_end_requests_takes_what_came_late_and_ends_the_requests_at_once(
    nc: NATS, js: JetStreamContext
) -> None:
    sub = await _consumer(js, 0)
    # A request for three that expires in 30 s, whose deliveries no pull is reading (as a pull
    # that returned early leaves one).
    await nc.publish(
        next_request_subject(sub), b'{"batch": 3, "expires": 30000000000}', delivery_inbox(sub)
    )
    await js.publish("p.0", b"late")

    async def queued() -> bool:
        await nc.flush()
        return bool(sub.pending_msgs == 1)

    await eventually(queued)
    cut = Cut()
    cut.requests_end = asyncio.get_running_loop().time() + 30.0  # as a pull sets it
    async with asyncio.timeout(5):  # on one server it does not wait for the expiry
        left = await end_requests(sub, cut)
    assert [m.data for m in left] == [b"late"]

    # The request wanted two more, but takes nothing now (the subscription is not even
    # unsubscribed yet): the next consumer gets them at once, not after AckWait (60 s).
    await js.publish("p.1", b"next")
    other = await js.pull_subscribe_bind(durable="c", stream="P")
    async with asyncio.timeout(5):
        got = await pull(other, 5, 10.0)
    assert [m.data for m in got] == [b"next"]
    assert sub.pending_msgs == 0
    await sub.unsubscribe()


async def test_in_a_cluster_end_requests_waits_out_the_requests(
    nats_cluster: NatsCluster,
) -> None:
    nc = await nats.connect(nats_cluster.urls[0], connect_timeout=5)
    try:
        js = nc.jetstream()
        await add_replicated(js, StreamConfig(name="P", subjects=["p.>"], num_replicas=3))
        sub = await js.pull_subscribe(
            "p.>",
            durable="c",
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=60),
        )

        async def consumer_answers() -> bool:
            """Until the R3 consumer has a leader that our node routes to, a pull request has
            no responder (a 503), not "no messages"."""
            try:
                await pull(sub, 1, 0.1)
            except ServiceUnavailableError:
                return False
            except TimeoutError:
                return True
            raise AssertionError("the stream is empty: a pull cannot return messages")

        await eventually(consumer_answers)
        cut = Cut()
        waiting = asyncio.create_task(pull(sub, 5, 30.0, cut))
        loop = asyncio.get_running_loop()

        async def waiting_request_sent() -> bool:
            # The no_wait request's reply came ("no messages"), and the request that waits for
            # one message, expiring in 30 s, went out. Cut before that, the pull sends none and
            # nothing comes (a fixed 0.2 s wait here failed once in a loaded full run).
            return cut.requests_end > loop.time() + 10

        await eventually(waiting_request_sent)
        cut.set()
        with pytest.raises(TimeoutError):
            await waiting
        # The unsubscribe would reach the consumer's leader late: the requests are waited out,
        # so what they deliver meanwhile is taken, not lost until AckWait.
        cut.requests_end = asyncio.get_running_loop().time() + 2.0  # as if the pull waited 2 s
        ending = asyncio.create_task(end_requests(sub, cut))
        await js.publish("p.0", b"meanwhile")
        async with asyncio.timeout(10):
            left = await ending
        assert [m.data for m in left] == [b"meanwhile"]
    finally:
        await nc.close()


@pytest.mark.parametrize(("batch", "wait_s"), [(0, 1.0), (1, 0.0)])
async def test_bad_arguments_are_refused(js: JetStreamContext, batch: int, wait_s: float) -> None:
    sub = await _consumer(js, 0)
    with pytest.raises(ValueError, match="pull needs"):
        await pull(sub, batch, wait_s)
