"""``pull``: nats-py's pull-consumer ``fetch`` without a task per message.

nats-py's ``PullSubscription.fetch`` reads every delivered message through ``next_msg``, which
makes a ``uuid4`` name, a task, and (``asyncio.wait_for`` on Python 3.11) a second task for each
one: about 20 us a message, paid by the worker per task, by the dispatcher per frontier message
and by ``jetcrawl crawl`` per result. ``pull`` keeps ``fetch``'s protocol — first whatever an
earlier request left in the subscription's queue, then a ``no_wait`` request for the rest, and
only when that finds nothing a request that waits — and reads the queue directly under one
``asyncio.timeout``. Unlike ``fetch``, the waiting request asks for one message, so a pull
returns as soon as work arrives instead of when the batch fills or the request expires.

It relies on private attributes of nats-py's subscriptions (the pull subscription's core
subscription, request subject and inbox; the core subscription's queue and pending-bytes count),
as ``worker.shards`` already did; tests/test_pull.py runs it against a real server, with status
messages, timeouts and leftovers, so a nats-py that changes them fails there.
"""

from __future__ import annotations

import asyncio

import orjson
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.errors import APIError

__all__ = ["pull"]

# Status headers of a pull request's replies (nats-server's JetStream pull protocol).
_STATUS = "Status"
_HEARTBEAT = "100"
_ENDS_REQUEST = frozenset({"404", "408", "409"})  # no messages, request expired, conflict
_EXPIRES_MARGIN_NS = 100_000  # as nats-py: the server ends the request just before we give up


async def pull(psub: JetStreamContext.PullSubscription, batch: int, wait_s: float) -> list[Msg]:
    """Up to ``batch`` messages of ``psub``; raises ``TimeoutError`` if none came in ``wait_s``.

    Returns as soon as ``batch`` are in or the server says it has no more for now; with nothing
    there, as soon as one message arrives (``wait_s`` is also the waiting request's expiry on the
    server).
    """
    if batch < 1 or wait_s <= 0:
        raise ValueError(f"pull needs batch >= 1 and wait_s > 0, got {batch}, {wait_s}")
    sub: Subscription = psub._sub
    queue: asyncio.Queue[Msg] = sub._pending_queue
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    msgs: list[Msg] = []

    while not queue.empty() and len(msgs) < batch:  # delivered for an earlier request
        _keep(sub, queue.get_nowait(), msgs)
    if len(msgs) >= batch:
        return msgs

    await _request(psub, {"batch": batch - len(msgs), "no_wait": True})
    await _collect(sub, queue, msgs, batch, deadline)
    if msgs:
        return msgs

    # Nothing there: wait for the next message only. A request for the whole batch would hold
    # the caller until the batch filled or the request expired (nats-py's fetch does that), so
    # the first tasks after a quiet spell would wait out the expiry; the caller's next pull takes
    # whatever came with it at once.
    remaining_ns = int((deadline - loop.time()) * 1e9) - _EXPIRES_MARGIN_NS
    if remaining_ns <= 0:
        raise TimeoutError("no messages")
    await _request(psub, {"batch": 1, "expires": remaining_ns})
    await _collect(sub, queue, msgs, 1, deadline)
    if not msgs:
        raise TimeoutError("no messages")
    return msgs


async def _request(psub: JetStreamContext.PullSubscription, request: dict[str, object]) -> None:
    await psub._nc.publish(psub._nms, orjson.dumps(request), psub._deliver)


async def _collect(
    sub: Subscription, queue: asyncio.Queue[Msg], msgs: list[Msg], batch: int, deadline: float
) -> None:
    """Read the request's deliveries until ``batch``, a status that ends it, or the deadline."""
    try:
        async with asyncio.timeout_at(deadline):
            while len(msgs) < batch:
                if not _keep(sub, await queue.get(), msgs):
                    return
    except TimeoutError:
        return


def _keep(sub: Subscription, msg: Msg, msgs: list[Msg]) -> bool:
    """Account for ``msg`` taken off the queue and keep it if it is a message; False if it is
    the status that ends a request."""
    sub._pending_size -= len(msg.data)
    sub._pending_queue.task_done()
    status = msg.headers.get(_STATUS) if msg.headers else None
    if status is None:
        msgs.append(msg)
        return True
    if status == _HEARTBEAT:
        return True
    if status in _ENDS_REQUEST:
        return False
    raise APIError.from_msg(msg)
