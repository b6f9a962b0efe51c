"""``natsinternals``: every private attribute of nats-py that jetcrawl touches, and nowhere else.

``pull.py`` reads a pull subscription's queue itself instead of through ``fetch`` (no task per
message), and ends its requests with an UNSUB of the inbox; nats-py has no public API for either.
These are what that relies on, each as a small typed function here:

    PullSubscription._sub             the core subscription on the inbox      core_subscription
    PullSubscription._nc              the client it belongs to                connection
    PullSubscription._nms             the consumer's next-message subject     next_request_subject
    PullSubscription._deliver         the inbox the requests' replies go to   delivery_inbox
    Subscription._pending_queue       the delivered messages nobody read yet  pending_queue, taken
    Subscription._pending_size        their bytes (``pending_bytes``)         taken
    Subscription._id                  the sid an UNSUB names                  send_unsubscribe
    Client._send_unsubscribe(sid)     UNSUB without dropping the local sub    send_unsubscribe
    Client._server_info               the server's INFO                       in_cluster,
                                                                            tls_required

``RELIED_ON`` states the same as data, and ``check`` verifies it on a live pull subscription,
raising ``NatsInternalsChanged`` naming each attribute that is gone or changed and the installed
nats-py version. pyproject.toml pins nats-py to ``TESTED_SERIES``; tests/test_natsinternals.py
runs ``check`` and every function here against a real nats-server, so an upgrade that changes
one fails there, by name.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext

from jetcrawl.contract.errors import JetcrawlError

__all__ = [
    "RELIED_ON",
    "TESTED_SERIES",
    "Internal",
    "NatsInternalsChanged",
    "check",
    "connection",
    "core_subscription",
    "delivery_inbox",
    "in_cluster",
    "next_request_subject",
    "pending_queue",
    "send_unsubscribe",
    "taken",
]

TESTED_SERIES = "2.16"  # the nats-py minor series check() and its tests were verified with

PullSubscription = JetStreamContext.PullSubscription


# --- the accessors ---------------------------------------------------------------------------


def core_subscription(psub: PullSubscription) -> Subscription:
    """The core subscription on the pull subscription's inbox."""
    return psub._sub


def connection(psub: PullSubscription) -> NATS:
    """The client the pull subscription belongs to."""
    return psub._nc


def next_request_subject(psub: PullSubscription) -> str:
    """``$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>``: where a pull request is published."""
    return psub._nms


def delivery_inbox(psub: PullSubscription) -> str:
    """The inbox a pull request names as its reply subject: its deliveries come there."""
    return psub._deliver


def pending_queue(sub: Subscription) -> asyncio.Queue[Msg]:
    """The subscription's delivered messages that nobody has read yet (bounded by nats-py)."""
    return sub._pending_queue


def taken(sub: Subscription, msg: Msg) -> None:
    """Account for ``msg`` read off :func:`pending_queue` as nats-py's own readers do: its
    bytes leave ``pending_bytes`` and the queue's ``join()`` no longer waits for it."""
    sub._pending_size -= len(msg.data)
    sub._pending_queue.task_done()


async def send_unsubscribe(nc: NATS, sub: Subscription) -> None:
    """Send UNSUB for ``sub`` but keep it registered in the client, so that what the server
    sent before the UNSUB still lands in its queue (``Subscription.unsubscribe`` drops it)."""
    await nc._send_unsubscribe(sub._id)


def in_cluster(nc: NATS) -> bool:
    """Whether the server the client is connected to is part of a cluster (its INFO says so)."""
    return bool(nc._server_info.get("cluster"))


def tls_required(nc: NATS) -> bool:
    """Whether the server the client is connected to requires TLS, so the connection uses it
    (nats-py connects in plain text to a server that does not, whatever the URL says)."""
    return bool(nc._server_info.get("tls_required"))


# --- the contract ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Internal:
    owner: str  # the nats-py class: "PullSubscription", "Subscription" or "Client"
    name: str  # the private attribute
    expected: str  # what it must be, in words for the message
    holds: Callable[[object], bool]  # whether a value is that
    why: str  # what we use it for


def _is(kind: type) -> Callable[[object], bool]:
    return lambda value: isinstance(value, kind)


def _is_unsubscribe(value: object) -> bool:
    """An async method taking the sid as its one positional argument."""
    if not inspect.iscoroutinefunction(value):
        return False
    try:
        inspect.signature(value).bind(0)
    except TypeError:
        return False
    return True


RELIED_ON: tuple[Internal, ...] = (
    Internal("PullSubscription", "_sub", "a Subscription", _is(Subscription), "its deliveries"),
    Internal("PullSubscription", "_nc", "a Client", _is(NATS), "sends its pull requests"),
    Internal("PullSubscription", "_nms", "a str", _is(str), "where pull requests go"),
    Internal("PullSubscription", "_deliver", "a str", _is(str), "a pull request's reply subject"),
    Internal(
        "Subscription", "_pending_queue", "an asyncio.Queue", _is(asyncio.Queue), "pull reads it"
    ),
    Internal("Subscription", "_pending_size", "an int", _is(int), "pending_bytes after a read"),
    Internal("Subscription", "_id", "an int", _is(int), "the sid an UNSUB names"),
    Internal(
        "Client",
        "_send_unsubscribe",
        "an async method taking the sid",
        _is_unsubscribe,
        "ends pull requests and keeps what they delivered",
    ),
    Internal("Client", "_server_info", "a dict", _is(dict), "whether the server is clustered"),
)
# Where check() finds the objects that own the rest: (owner, attribute) -> the owner it holds.
_HOLDS_OWNER = {("PullSubscription", "_sub"): "Subscription", ("PullSubscription", "_nc"): "Client"}


class NatsInternalsChanged(JetcrawlError):
    """The installed nats-py lacks or changed private attributes that jetcrawl relies on."""

    def __init__(self, problems: list[str], installed: str) -> None:
        super().__init__(
            f"nats-py {installed} (jetcrawl is tested with the {TESTED_SERIES} series) changed "
            f"what jetcrawl/plumbing/natsinternals.py relies on:\n  " + "\n  ".join(problems)
        )
        self.problems = problems
        self.installed = installed


_MISSING = object()


def check(psub: PullSubscription) -> None:
    """Raise ``NatsInternalsChanged`` unless every ``RELIED_ON`` attribute of ``psub``, its core
    subscription and its client is there and is what we expect."""
    owners: dict[str, object] = {"PullSubscription": psub}
    problems: list[str] = []
    for internal in RELIED_ON:
        where = f"{internal.owner}.{internal.name}"
        owner = owners.get(internal.owner, _MISSING)
        if owner is _MISSING:
            problems.append(f"{where}: not checked, no {internal.owner} to look at")
            continue
        value = getattr(owner, internal.name, _MISSING)
        if value is _MISSING:
            problems.append(f"{where}: missing (used for: {internal.why})")
        elif not internal.holds(value):
            problems.append(
                f"{where}: now {type(value).__name__}, expected {internal.expected} "
                f"(used for: {internal.why})"
            )
        elif (internal.owner, internal.name) in _HOLDS_OWNER:
            owners[_HOLDS_OWNER[internal.owner, internal.name]] = value
    if problems:
        raise NatsInternalsChanged(problems, version("nats-py"))
