"""jetcrawl/bus.py Outbox: pipelined publishes, and with a linger, one write for many callers."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.client import Client as NATS
from nats.errors import ConnectionClosedError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, PubAck, StreamConfig
from nats.js.errors import APIError, NoStreamResponseError

from jetcrawl.plumbing.bus import MSG_ID, Outbox, Outgoing, PublishFailed, _pub_ack
from tests.support.streams import eventually

LONG_LINGER_S = 2.0  # far longer than a stream-info round trip, even on a loaded machine


async def _stream(js: JetStreamContext) -> None:
    await js.add_stream(StreamConfig(name="T", subjects=["t.>"]))


async def test_a_linger_holds_concurrent_sends_and_writes_them_together(
    nc: NATS, js: JetStreamContext
) -> None:
    await _stream(js)
    outbox = Outbox(nc, linger_s=LONG_LINGER_S)
    sends = [
        asyncio.create_task(
            outbox.send([Outgoing(f"t.{n}", b"x", {MSG_ID: f"id-{n}-{k}"}) for k in range(3)])
        )
        for n in range(4)
    ]
    await asyncio.sleep(0)  # every caller has queued its messages
    assert (await js.stream_info("T")).state.messages == 0, "held until the linger ends"
    results = await asyncio.gather(*sends)
    acks = [ack for result in results for ack in result]
    assert not [a for a in acks if isinstance(a, PublishFailed)]
    assert sorted(a.seq for a in acks if not isinstance(a, PublishFailed)) == list(range(1, 13))
    assert (await js.stream_info("T")).state.messages == 12


async def test_acks_through_a_lingering_outbox_reach_the_consumer(
    nc: NATS, js: JetStreamContext
) -> None:
    await _stream(js)
    for n in range(5):
        await js.publish(f"t.{n}", b"x")
    sub = await js.pull_subscribe(
        "t.>", durable="c", config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=60)
    )
    msgs = await sub.fetch(5, timeout=5)
    outbox = Outbox(nc, linger_s=0.01)
    await asyncio.gather(
        *(outbox.ack(m) for m in msgs[:3]), outbox.nak(msgs[3], delay=30), outbox.term(msgs[4])
    )

    async def settled() -> bool:
        info = await js.consumer_info("T", "c")
        return info.num_ack_pending == 1 and info.ack_floor.stream_seq == 3

    await eventually(settled)  # the nak'ed one waits out its delay; the rest are done


@pytest.mark.parametrize("linger_s", [0.0, 0.01])
async def test_a_rejected_publish_fails_its_message_only(
    nc: NATS, js: JetStreamContext, linger_s: float
) -> None:
    await _stream(js)
    outbox = Outbox(nc, linger_s=linger_s)
    ok, no_stream, wrong_seq = await outbox.send(
        [
            Outgoing("t.a", b"x"),
            Outgoing("nowhere.a", b"x"),
            Outgoing("t.b", b"x", {"Nats-Expected-Last-Subject-Sequence": "99"}),
        ]
    )
    assert not isinstance(ok, PublishFailed) and ok.seq == 1
    assert isinstance(no_stream, PublishFailed)
    assert isinstance(no_stream.cause, NoStreamResponseError)
    assert isinstance(wrong_seq, PublishFailed) and isinstance(wrong_seq.cause, APIError)


@pytest.mark.parametrize("linger_s", [0.0, 0.01])
async def test_a_closed_connection_fails_sends_and_acks_instead_of_hanging(
    nc: NATS, js: JetStreamContext, linger_s: float
) -> None:
    await _stream(js)
    await js.publish("t.a", b"x")
    sub = await js.pull_subscribe("t.>", durable="c")
    [msg] = await sub.fetch(1, timeout=5)
    outbox = Outbox(nc, timeout_s=5, linger_s=linger_s)
    await nc.close()
    async with asyncio.timeout(4):
        [failed] = await outbox.send([Outgoing("t.b", b"x")])
        assert isinstance(failed, PublishFailed)
        with pytest.raises(ConnectionClosedError):
            await outbox.ack(msg)


@pytest.mark.parametrize("linger_s", [0.0, 0.01])
async def test_a_publish_nobody_acks_fails_after_the_timeout_and_the_rest_are_kept(
    nc: NATS, js: JetStreamContext, linger_s: float
) -> None:
    await _stream(js)

    async def silent(msg: object) -> None:  # takes the message and never answers
        return None

    await nc.subscribe("quiet.>", cb=silent)
    outbox = Outbox(nc, timeout_s=0.4, linger_s=linger_s)
    started = asyncio.get_running_loop().time()
    async with asyncio.timeout(5):
        stored, unanswered = await outbox.send([Outgoing("t.a", b"x"), Outgoing("quiet.a", b"x")])
    waited = asyncio.get_running_loop().time() - started
    assert isinstance(stored, PubAck) and stored.seq == 1
    assert isinstance(unanswered, PublishFailed) and isinstance(unanswered.cause, TimeoutError)
    assert 0.4 <= waited < 0.4 * 1.25 + 1.0  # one timeout and at most a quarter more
    assert outbox._expiry is None and not outbox._waiting  # nothing left to look after


@pytest.mark.parametrize(
    "reply",
    [
        {"stream": "T", "seq": 7},
        {"stream": "T", "seq": 7, "duplicate": True},
        {"stream": "T", "seq": 7, "domain": "hub", "duplicate": False},
        {"stream": "T", "seq": 7, "batch": "b1", "count": 3},  # not a plain ack: nats-py reads it
        {"stream": "T", "seq": 7, "val": "12"},
    ],
)
def test_a_reply_reads_as_nats_py_reads_it(reply: dict[str, object]) -> None:
    assert _pub_ack(dict(reply)) == PubAck.from_response(dict(reply))
