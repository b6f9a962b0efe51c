"""jetcrawl/plumbing/natsinternals.py: the contract with nats-py's private attributes.

Every accessor runs against a real nats-server, after ``check`` has looked at the attributes it
reads: an upgrade of nats-py that renames, removes or retypes one fails here with a message that
names it and the installed version; one that keeps the name but changes what it means fails the
accessor's own test.
"""

from __future__ import annotations

import asyncio
import re
import tomllib
from collections.abc import AsyncIterator
from importlib.metadata import version
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.aio.subscription import Subscription
from nats.errors import NoRespondersError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

from jetcrawl.local.embedded import NatsCluster
from jetcrawl.plumbing.natsinternals import (
    RELIED_ON,
    TESTED_SERIES,
    Internal,
    NatsInternalsChanged,
    check,
    connection,
    core_subscription,
    delivery_inbox,
    in_cluster,
    next_request_subject,
    pending_queue,
    send_unsubscribe,
    taken,
    tls_required,
)
from tests.support.streams import add_replicated

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


@pytest.fixture
async def psub(js: JetStreamContext) -> AsyncIterator[JetStreamContext.PullSubscription]:
    """A pull subscription on stream P (subjects p.>), consumer c; checked before any test."""
    await js.add_stream(StreamConfig(name="P", subjects=["p.>"]))
    sub = await js.pull_subscribe(
        "p.>", durable="c", config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=60)
    )
    check(sub)  # a missing or changed attribute fails here, by name, before any accessor runs
    yield sub
    await sub.unsubscribe()


def test_nats_py_is_pinned_to_the_series_the_contract_was_checked_with() -> None:
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    [pin] = [d for d in dependencies if d.startswith("nats-py")]
    major, minor = TESTED_SERIES.split(".")
    assert pin == f"nats-py>={TESTED_SERIES},<{major}.{int(minor) + 1}", (
        f"pyproject pins {pin!r}: pin nats-py to the series natsinternals.TESTED_SERIES "
        f"({TESTED_SERIES}), the one this contract test was run with"
    )
    assert version("nats-py").startswith(f"{TESTED_SERIES}."), version("nats-py")


async def test_the_installed_nats_py_has_everything_we_rely_on(
    psub: JetStreamContext.PullSubscription,
) -> None:
    check(psub)  # the fixture did too; here it is the test
    assert {i.owner for i in RELIED_ON} == {"PullSubscription", "Subscription", "Client"}


async def test_the_parts_of_a_pull_subscription(
    nc: NATS, psub: JetStreamContext.PullSubscription
) -> None:
    assert connection(psub) is nc
    sub = core_subscription(psub)
    assert isinstance(sub, Subscription) and sub.subject == delivery_inbox(psub)
    assert next_request_subject(psub) == "$JS.API.CONSUMER.MSG.NEXT.P.c"


async def test_a_request_to_the_subject_delivers_to_the_inbox_queue_and_taking_counts(
    nc: NATS, js: JetStreamContext, psub: JetStreamContext.PullSubscription
) -> None:
    await js.publish("p.0", b"hello")
    sub = core_subscription(psub)
    queue = pending_queue(sub)
    assert queue.empty()
    await nc.publish(
        next_request_subject(psub), b'{"batch": 1, "no_wait": true}', delivery_inbox(psub)
    )
    async with asyncio.timeout(5):
        msg = await queue.get()  # the delivery, read as pull reads it
    assert msg.data == b"hello" and msg.subject == "p.0"
    assert psub.pending_bytes == len(b"hello"), "read off the queue, not yet taken"
    taken(sub, msg)
    assert psub.pending_msgs == 0 and psub.pending_bytes == 0
    async with asyncio.timeout(5):
        await queue.join()  # nothing is left unfinished: an unsubscribe's drain would not wait
    await msg.ack()


async def test_send_unsubscribe_ends_interest_but_keeps_what_was_sent_before(
    nc: NATS, psub: JetStreamContext.PullSubscription
) -> None:
    sub = core_subscription(psub)
    queue = pending_queue(sub)
    inbox = delivery_inbox(psub)
    await nc.publish(inbox, b"before")
    await send_unsubscribe(nc, sub)
    with pytest.raises(NoRespondersError):  # the server knows no interest in the inbox now
        await nc.request(inbox, b"after", timeout=5)
    async with asyncio.timeout(5):
        assert (await queue.get()).data == b"before", "the subscription still takes it"
    assert queue.empty()


async def test_a_single_server_is_not_a_cluster(nc: NATS) -> None:
    assert in_cluster(nc) is False


async def test_a_cluster_member_says_it_is_in_a_cluster(nats_cluster: NatsCluster) -> None:
    client = await nats.connect(nats_cluster.urls[0], connect_timeout=5)
    try:
        assert in_cluster(client) is True
        # and check() passes on a clustered client too
        js = client.jetstream()
        await add_replicated(js, StreamConfig(name="P", subjects=["p.>"], num_replicas=3))
        check(await js.pull_subscribe("p.>", durable="c"))
    finally:
        await client.close()


# --- the contract fails loudly --------------------------------------------------------------


def _owner(psub: JetStreamContext.PullSubscription, internal: Internal) -> object:
    return {
        "PullSubscription": psub,
        "Subscription": core_subscription(psub),
        "Client": connection(psub),
    }[internal.owner]


def _says(internal: Internal, how: str) -> re.Pattern[str]:
    return re.compile(
        rf"nats-py {re.escape(version('nats-py'))} \(jetcrawl is tested with the "
        rf"{re.escape(TESTED_SERIES)} series\).*\n  "
        rf"{internal.owner}\.{internal.name}: {how}",
        re.DOTALL,
    )


@pytest.mark.parametrize("internal", RELIED_ON, ids=lambda i: f"{i.owner}.{i.name}")
async def test_a_missing_attribute_fails_the_check_naming_it_and_the_version(
    psub: JetStreamContext.PullSubscription, internal: Internal, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = _owner(psub, internal)
    # An instance's attribute, or a method of its class (as _send_unsubscribe).
    holder = owner if internal.name in vars(owner) else type(owner)
    monkeypatch.delattr(holder, internal.name)
    with pytest.raises(NatsInternalsChanged, match=_says(internal, "missing")) as raised:
        check(psub)
    assert len(raised.value.problems) >= 1 and raised.value.installed == version("nats-py")


@pytest.mark.parametrize("internal", RELIED_ON, ids=lambda i: f"{i.owner}.{i.name}")
async def test_a_changed_attribute_fails_the_check_naming_it_and_the_version(
    psub: JetStreamContext.PullSubscription, internal: Internal, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_owner(psub, internal), internal.name, 1.5, raising=False)
    with pytest.raises(NatsInternalsChanged, match=_says(internal, "now float, expected")):
        check(psub)


async def test_a_missing_owner_is_said_and_its_attributes_are_not_guessed(
    psub: JetStreamContext.PullSubscription, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(psub, "_sub")
    with pytest.raises(NatsInternalsChanged) as raised:
        check(psub)
    assert raised.value.problems[0].startswith("PullSubscription._sub: missing")
    assert "Subscription._pending_queue: not checked, no Subscription to look at" in str(
        raised.value
    )


async def test_tls_required_is_what_the_server_says(nc: NATS) -> None:
    assert tls_required(nc) is False  # the TLS servers of tests/test_tls.py say True
