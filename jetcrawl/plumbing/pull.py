"""``pull``: nats-py's pull-consumer ``fetch`` without a task per message.

nats-py's ``PullSubscription.fetch`` reads every delivered message through ``next_msg``, which
makes a ``uuid4`` name, a task, and (``asyncio.wait_for`` on Python 3.11) a second task for each
one: a cost paid by the worker per task, by the dispatcher per frontier message
and by ``jetcrawl crawl`` per result. ``pull`` keeps ``fetch``'s protocol — first whatever an
earlier request left in the subscription's queue, then a ``no_wait`` request for the rest, and
only when that finds nothing a request that waits — and reads the queue directly under one
``asyncio.timeout``. Unlike ``fetch``, the waiting request asks for one message, so a pull
returns as soon as work arrives instead of when the batch fills or the request expires.

A consumer that stops cuts its pull short (``Cut``) and ends its requests with
``end_requests`` (``hand_back`` also naks what they delivered late), so a shard changes hands or a
service stops without waiting out a request's expiry.

What it needs of nats-py beyond the public API (the pull subscription's core subscription,
request subject and inbox; the core subscription's queue and pending-bytes count; the client's
unsubscribe command and server INFO) it gets through ``natsinternals``, whose contract test names
what an upgrade changed; tests/test_pull.py runs it against a real server and a cluster, with
status messages, timeouts, leftovers and cuts.
"""

from __future__ import annotations

import asyncio
import contextlib

import orjson
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.errors import APIError

from jetcrawl.plumbing.natsinternals import (
    connection,
    core_subscription,
    delivery_inbox,
    in_cluster,
    next_request_subject,
    pending_queue,
    send_unsubscribe,
    taken,
)

__all__ = ["Cut", "Pulled", "end_requests", "hand_back", "pull"]

# Status headers of a pull request's replies (nats-server's JetStream pull protocol).
_STATUS = "Status"
_HEARTBEAT = "100"
_ENDS_REQUEST = frozenset({"404", "408", "409"})  # no messages, request expired, conflict
_EXPIRES_MARGIN_NS = 100_000  # as nats-py: the server ends the request just before we give up
_EXPIRED_MARGIN_S = 0.1  # past a request's expiry, its last deliveries have arrived


class Pulled(list[Msg]):
    """The messages a pull took, and whether the server said it had no more for now
    (``drained``). A short batch that the deadline or a cut ended is not drained: the server
    may still be delivering to it, late, as a busy machine's server does."""

    __slots__ = ("drained",)

    def __init__(self) -> None:
        super().__init__()
        self.drained = False


class Cut:
    """Cuts the pulls of one subscription short from another task, as a stopping consumer wants.

    One ``Cut`` per subscription, whose pulls take turns (it holds the pull in progress).

    After ``set()``, the pull in progress returns what it has at once (``TimeoutError`` if that
    is nothing), and a later pull sends no request. Nothing is lost: what the server delivers
    afterwards stays in the subscription's queue, for :func:`end_requests`, which also reads
    ``requests_end``: when the last request a pull with this cut sent has surely expired.
    """

    __slots__ = ("_timeout", "is_set", "requests_end")

    def __init__(self) -> None:
        self.is_set = False
        self.requests_end = float("-inf")  # loop time
        self._timeout: asyncio.Timeout | None = None  # the pull in progress's deadline

    def set(self) -> None:
        self.is_set = True
        if self._timeout is not None and not self._timeout.expired():
            self._timeout.reschedule(asyncio.get_running_loop().time())


async def pull(
    psub: JetStreamContext.PullSubscription, batch: int, wait_s: float, cut: Cut | None = None
) -> Pulled:
    """Up to ``batch`` messages of ``psub``; raises ``TimeoutError`` if none came in ``wait_s``.

    Returns as soon as ``batch`` are in or the server says it has no more for now (``drained``);
    with nothing there, as soon as one message arrives (``wait_s`` is also the waiting request's
    expiry on the server), or when ``cut`` is set.
    """
    if batch < 1 or wait_s <= 0:
        raise ValueError(f"pull needs batch >= 1 and wait_s > 0, got {batch}, {wait_s}")
    sub = core_subscription(psub)
    queue = pending_queue(sub)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    msgs = Pulled()

    while not queue.empty() and len(msgs) < batch:  # delivered for an earlier request
        _keep(sub, queue.get_nowait(), msgs)
    if len(msgs) >= batch:
        return msgs
    if cut is None or not cut.is_set:
        await _request(psub, {"batch": batch - len(msgs), "no_wait": True}, loop.time(), cut)
        msgs.drained = await _collect(sub, queue, msgs, batch, deadline, cut)
    if msgs:
        return msgs
    if cut is not None and cut.is_set:
        raise TimeoutError("cut short")

    # Nothing there: wait for the next message only. A request for the whole batch would hold
    # the caller until the batch filled or the request expired (nats-py's fetch does that), so
    # the first tasks after a quiet spell would wait out the expiry; the caller's next pull takes
    # whatever came with it at once.
    remaining_ns = int((deadline - loop.time()) * 1e9) - _EXPIRES_MARGIN_NS
    if remaining_ns <= 0:
        raise TimeoutError("no messages")
    await _request(psub, {"batch": 1, "expires": remaining_ns}, deadline, cut)
    await _collect(sub, queue, msgs, 1, deadline, cut)
    if not msgs:
        raise TimeoutError("no messages")
    msgs.drained = True  # there was none a moment ago: this one is new
    return msgs


async def end_requests(psub: JetStreamContext.PullSubscription, cut: Cut) -> list[Msg]:
    """End ``psub``'s pull requests; return the messages they delivered that no pull took.

    A pull returns before its request ends on the server (as soon as it has work, or when cut),
    and the request goes on delivering to the subscription's inbox until it expires: a consumer
    that leaves must take those messages, or they sit unacknowledged until AckWait. nats-server
    gives a waiting request a message only while its inbox has interest, so on a single server,
    unsubscribing the inbox and one round trip (the server has then taken the unsubscribe, and
    sent everything it sent before it) end every request at once. A message the server picked
    in the instant the unsubscribe landed is lost on the way and comes back after AckWait: late,
    never lost. In a cluster the unsubscribe reaches the consumer's leader later than the round
    trip tells, so there this waits until the last request (of the pulls with ``cut``) expired
    instead, and takes what came. Pull no more from ``psub`` afterwards; unsubscribe it.
    """
    sub = core_subscription(psub)
    nc = connection(psub)
    if in_cluster(nc):
        delay = cut.requests_end - asyncio.get_running_loop().time()
        if delay > 0:
            await asyncio.sleep(delay)  # no event says that a request expired server-side
    else:
        await send_unsubscribe(nc, sub)
        await nc.flush()
    queue = pending_queue(sub)
    msgs: list[Msg] = []
    while not queue.empty():
        with contextlib.suppress(APIError):  # a status that is no message
            _keep(sub, queue.get_nowait(), msgs)
    return msgs


async def hand_back(psub: JetStreamContext.PullSubscription, cut: Cut) -> int:
    """:func:`end_requests`, and hand what they delivered late back to JetStream (``nak``), for
    the next consumer at once; returns how many. For a consumer that stops taking work."""
    late = await end_requests(psub, cut)
    await asyncio.gather(*(msg.nak() for msg in late))
    return len(late)


async def _request(
    psub: JetStreamContext.PullSubscription,
    request: dict[str, object],
    expires_at: float,
    cut: Cut | None,
) -> None:
    if cut is not None:
        cut.requests_end = max(cut.requests_end, expires_at + _EXPIRED_MARGIN_S)
    await connection(psub).publish(
        next_request_subject(psub), orjson.dumps(request), delivery_inbox(psub)
    )


async def _collect(
    sub: Subscription,
    queue: asyncio.Queue[Msg],
    msgs: list[Msg],
    batch: int,
    deadline: float,
    cut: Cut | None,
) -> bool:
    """Read the request's deliveries until ``batch``, a status that ends it (True), the deadline
    or the cut."""
    try:
        async with asyncio.timeout_at(deadline) as timeout:
            if cut is not None:
                if cut.is_set:  # while the request went out
                    return False
                cut._timeout = timeout
            while len(msgs) < batch:
                if not _keep(sub, await queue.get(), msgs):
                    return True
    except TimeoutError:
        return False
    finally:
        if cut is not None:
            cut._timeout = None
    return False


def _keep(sub: Subscription, msg: Msg, msgs: list[Msg]) -> bool:
    """Account for ``msg`` taken off the queue and keep it if it is a message; False if it is
    the status that ends a request."""
    taken(sub, msg)
    status = msg.headers.get(_STATUS) if msg.headers else None
    if status is None:
        msgs.append(msg)
        return True
    if status == _HEARTBEAT:
        return True
    if status in _ENDS_REQUEST:
        return False
    raise APIError.from_msg(msg)
