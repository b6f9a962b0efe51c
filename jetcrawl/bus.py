"""Talking to NATS: one way to connect, and pipelined JetStream publishing.

``connect`` sets the client up for long-lived services: reconnect forever, a short ping
interval so a dead server is noticed in seconds (nats-py's default is two minutes), and
callbacks that log instead of printing. ``Outbox`` pipelines publishes (``publish_async``) and
waits for all their acks at once — about ten times the throughput of awaiting each publish —
with a deadline, because nats-py's publish futures have none of their own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass

import nats
from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.api import PubAck

from jetcrawl.errors import JetcrawlError
from jetcrawl.settings import Settings

log = logging.getLogger(__name__)

MSG_ID = "Nats-Msg-Id"
EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
PUBLISH_TIMEOUT_S = 10.0


class BusError(JetcrawlError):
    """NATS could not be reached or refused a request."""


class PublishFailed(BusError):
    def __init__(self, subject: str, cause: BaseException) -> None:
        super().__init__(f"publish to {subject} failed: {cause!r}")
        self.subject = subject
        self.cause = cause


async def connect(settings: Settings, name: str) -> NATS:
    """A connection that reconnects forever and notices a dead server within a few pings."""

    async def on_error(e: Exception) -> None:
        log.warning("nats error (%s): %r", name, e)

    async def on_disconnect() -> None:
        log.warning("nats disconnected (%s)", name)

    async def on_reconnect() -> None:
        log.info("nats reconnected (%s)", name)

    try:
        return await nats.connect(
            servers=[url.strip() for url in settings.nats_url.split(",") if url.strip()],
            name=name,
            user=settings.nats_user or None,
            password=str(settings.nats_password) or None,
            connect_timeout=int(max(1, settings.nats_connect_timeout_s)),
            ping_interval=int(max(1, settings.nats_ping_interval_s)),
            max_outstanding_pings=settings.nats_max_outstanding_pings,
            max_reconnect_attempts=-1,
            reconnect_time_wait=1,
            error_cb=on_error,
            disconnected_cb=on_disconnect,
            reconnected_cb=on_reconnect,
        )
    except (TimeoutError, NatsError, OSError) as e:
        raise BusError(f"cannot connect to NATS at {settings.nats_url}: {e!r}") from e


@dataclass(frozen=True, slots=True)
class Outgoing:
    subject: str
    payload: bytes
    headers: Mapping[str, str] | None = None


class Outbox:
    """Pipelined JetStream publishes, awaited together."""

    def __init__(self, js: JetStreamContext, timeout_s: float = PUBLISH_TIMEOUT_S) -> None:
        self._js = js
        self._timeout_s = timeout_s

    async def send(self, messages: list[Outgoing]) -> list[PubAck | PublishFailed]:
        """Publish all, then wait for every ack; one entry per message, in order."""
        futures: list[asyncio.Future[PubAck] | PublishFailed] = []
        for m in messages:
            try:
                futures.append(
                    await self._js.publish_async(
                        m.subject, m.payload, headers=dict(m.headers) if m.headers else None
                    )
                )
            except (NatsError, OSError) as e:
                futures.append(PublishFailed(m.subject, e))
        pending = [f for f in futures if isinstance(f, asyncio.Future)]
        if pending:
            _, late = await asyncio.wait(pending, timeout=self._timeout_s)
            for late_future in late:
                late_future.cancel()
        out: list[PubAck | PublishFailed] = []
        for m, outcome in zip(messages, futures, strict=True):
            if isinstance(outcome, PublishFailed):
                out.append(outcome)
            elif outcome.cancelled():
                out.append(PublishFailed(m.subject, TimeoutError("no ack in time")))
            elif (exc := outcome.exception()) is not None:
                out.append(PublishFailed(m.subject, exc))
            else:
                out.append(outcome.result())
        return out
