"""Talking to NATS: one way to connect, and pipelined JetStream publishing.

``connect`` sets the client up for long-lived services: reconnect forever, a short ping
interval so a dead server is noticed in seconds (nats-py's default is two minutes), and
callbacks that log instead of printing. ``Outbox`` pipelines publishes and waits for all
their acks at once — about ten times the throughput of awaiting each publish — under a
deadline. Every publish goes through ``Outbox.send``, which is where trace context is injected.
With a linger, the Outbox also gathers what concurrent callers send (and their acks of delivered
messages, ``Outbox.ack``) for that long and writes it in one go: one socket write and one server
read for many pages instead of several each.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import nats
import orjson
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js.api import PubAck
from nats.js.errors import APIError, NoStreamResponseError
from opentelemetry.trace import Span, Tracer, get_current_span, set_span_in_context

from jetcrawl.contract.errors import JetcrawlError
from jetcrawl.contract.settings import Settings, redact_urls
from jetcrawl.otel.propagation import TRACEPARENT, inject
from jetcrawl.otel.spans import end_producer, producer_span
from jetcrawl.plumbing.natsinternals import tls_required
from jetcrawl.plumbing.tls import TlsFiles, describe_tls_error

log = logging.getLogger(__name__)

MSG_ID = "Nats-Msg-Id"
EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
TTL = "Nats-TTL"
PUBLISH_TIMEOUT_S = 10.0
# Overdue acks are looked for this many times per timeout: a publish fails after 1 to 1.25
# timeouts without an ack.
EXPIRY_CHECKS_PER_TIMEOUT = 4
KV_SUBJECT_PREFIX = "$KV."
_PLAIN_ACK = frozenset({"stream", "seq", "domain", "duplicate"})  # a PubAck's fields, unbatched


RECONNECT_WAIT_S = 1.0  # between two connects to one server
NO_TLS = "the server does not offer it"


class BusError(JetcrawlError):
    """NATS could not be reached or refused a request."""


class PublishFailed(BusError):
    def __init__(self, subject: str, cause: BaseException) -> None:
        super().__init__(f"publish to {subject} failed: {cause!r}")
        self.subject = subject
        self.cause = cause


async def connect(settings: Settings, name: str, *, give_up_s: float | None = None) -> NATS:
    """A connection that reconnects forever and notices a dead server within a few pings.

    Services leave ``give_up_s`` None: they keep trying to connect, and log each failure. A
    command passes its ``command_timeout_s``: its first connect is tried for about that long,
    quietly, and then a ``BusError`` names the URL and the last cause.
    """
    client: list[NATS] = []
    failures: list[Exception] = []
    shown = redact_urls(settings.nats_url)
    servers = [url.strip() for url in settings.nats_url.split(",") if url.strip()]
    tls = _tls(settings, servers)
    attempt: list[asyncio.Timeout] = []  # the connect under way

    async def on_error(e: Exception) -> None:
        if isinstance(e, ssl.SSLError) and not client:
            # nats-py would wait forever for the socket whose TLS upgrade failed to close
            # (start_tls leaves the stream's close unsignalled): end this attempt now.
            attempt[-1].reschedule(loop.time())
            failures.append(e)  # said in the BusError, or logged, in the loop below
            return
        if give_up_s is not None and not client:
            failures.append(e)  # said once, in the BusError, if the command gives up
            return
        log.warning("nats error (%s, %s): %r", name, shown, e)

    async def on_disconnect() -> None:
        if client and (client[0].is_closed or client[0].is_draining):
            return  # our own close()
        log.warning("nats disconnected (%s, %s)", name, shown)

    async def on_reconnect() -> None:
        log.info("nats reconnected (%s, %s)", name, shown)

    loop = asyncio.get_running_loop()
    deadline = None if give_up_s is None else loop.time() + give_up_s
    while True:
        timeout_s = settings.nats_connect_timeout_s
        if deadline is not None:
            timeout_s = min(timeout_s, max(0.5, deadline - loop.time()))
        try:
            async with asyncio.timeout(None) as timeout:
                attempt.append(timeout)
                nc = await nats.connect(
                    servers=servers,
                    name=name,
                    **tls,
                    inbox_prefix=inbox_prefix(settings),
                    user=settings.nats_user or None,
                    password=str(settings.nats_password) or None,
                    connect_timeout=max(1, round(timeout_s)),
                    ping_interval=int(max(1, settings.nats_ping_interval_s)),
                    max_outstanding_pings=settings.nats_max_outstanding_pings,
                    # A command tries each server twice per round (nats-py: 0 would mean forever).
                    max_reconnect_attempts=-1 if deadline is None else 1,
                    reconnect_time_wait=RECONNECT_WAIT_S,
                    error_cb=on_error,
                    disconnected_cb=on_disconnect,
                    reconnected_cb=on_reconnect,
                )
        except (TimeoutError, NatsError, OSError) as e:
            failures.append(e)
            refused = next((f for f in failures if isinstance(f, ssl.SSLError)), None)
            if deadline is None and refused is not None:
                failures.clear()
                log.warning("nats (%s, %s): %s; trying again", name, shown, _cause([refused]))
                await asyncio.sleep(RECONNECT_WAIT_S)
                continue
            # A refused certificate will not be accepted by trying again.
            if deadline is None or loop.time() >= deadline or refused is not None:
                raise BusError(f"cannot connect to NATS at {shown}: {_cause(failures)}") from e
            continue
        if tls and not tls_required(nc):  # TLS was asked for, and nats-py went on without it
            await nc.close()
            if deadline is None:
                log.warning("nats (%s, %s): TLS: %s; trying again", name, shown, NO_TLS)
                await asyncio.sleep(RECONNECT_WAIT_S)
                continue
            raise BusError(f"cannot connect to NATS at {shown}: TLS: {NO_TLS}")
        if deadline is not None:
            nc.options["max_reconnect_attempts"] = -1  # connected: from now on, as a service
        client.append(nc)
        return nc


def _tls(settings: Settings, servers: list[str]) -> dict[str, Any]:
    """nats-py's TLS options: a verifying context when a TLS file is set or a URL says tls://.

    nats-py itself upgrades to TLS whenever a server requires it, with a default context; ours
    adds the CA and the client certificate of the settings.
    """
    files = TlsFiles.nats(settings)
    if not files.configured and not any(url.startswith("tls://") for url in servers):
        return {}
    return {"tls": files.ssl_context()}


def inbox_prefix(settings: Settings) -> str:
    """Where this client's replies come: ``_INBOX_<user>`` for a NATS user, so that each user
    may subscribe to its own replies only (nats/accounts.conf); nats-py's default without one."""
    return f"_INBOX_{settings.nats_user}" if settings.nats_user else "_INBOX"


def _cause(failures: list[Exception]) -> str:
    """The most telling of the failures, in words: a TLS failure, then an OS error (refused,
    unreachable, no such name) over the "no servers available" that nats-py says after it."""
    for e in reversed(failures):
        if isinstance(e, ssl.SSLError):
            return describe_tls_error(e)
    for e in reversed(failures):
        if isinstance(e, ConnectionRefusedError):
            return "connection refused (is nats-server running there?)"
        if isinstance(e, socket.gaierror):
            return f"name not resolved ({e.strerror})"
        if isinstance(e, OSError):
            return e.strerror or str(e)
        if isinstance(e, TimeoutError):
            return "no answer (timed out)"
    e = failures[-1]
    return str(e) or type(e).__name__


@dataclass(frozen=True, slots=True)
class Outgoing:
    subject: str
    payload: bytes
    headers: Mapping[str, str] | None = None


class Outbox:
    """Pipelined JetStream publishes, awaited together.

    Each publish is a core publish with its own reply subject under one wildcard subscription;
    the replies (a ``PubAck`` or a JetStream API error) resolve per-message futures. nats-py's own
    ``publish_async`` cannot be used: its reply handler raises API errors (such as the "wrong last
    sequence" of a KV create) inside the callback instead of setting them on the future, so the
    future never completes (nats-io/nats.py#985; tests/upstream/nats_publish_async.py shows it,
    and its test fails once a release fixes it).

    Tracing: a message whose headers carry no ``traceparent`` gets the current span's context —
    through a ``publish <subject>`` PRODUCER span, child of the current span and ended on the
    ack, when the Outbox has a tracer. Without a current span nothing is added. Writes to KV
    buckets are state, not messages, and never carry trace context. ``propagate=False`` is for a
    service whose tracing is off, where no span is ever current: it saves looking for one on
    every message.
    """

    def __init__(
        self,
        nc: NATS,
        timeout_s: float = PUBLISH_TIMEOUT_S,
        tracer: Tracer | None = None,
        linger_s: float = 0.0,
        propagate: bool = True,
    ) -> None:
        self._nc = nc
        self._timeout_s = timeout_s
        self._tracer = tracer
        self._propagate = propagate
        self._linger_s = linger_s
        self._prefix = ""
        self._tokens = itertools.count()
        # token -> (the publish's future, loop time its ack is due by); one timer looks for
        # overdue ones while any is waiting (cheaper than an asyncio.wait per send)
        self._waiting: dict[str, tuple[asyncio.Future[PubAck], float]] = {}
        self._expiry: asyncio.TimerHandle | None = None
        self._subscribed = False
        # With a linger: what waits for the next write, and the task that writes it.
        self._queued: list[tuple[Callable[[], Awaitable[None]], asyncio.Future[None]]] = []
        self._writer: asyncio.Task[None] | None = None

    @property
    def max_payload(self) -> int:
        """The largest message the server takes (its INFO), headers and payload."""
        return self._nc.max_payload

    async def ack(self, msg: Msg) -> None:
        """``msg.ack()``, written with the next batch of publishes."""
        await self._write(msg.ack)

    async def nak(self, msg: Msg, delay: float | None = None) -> None:
        """``msg.nak(delay)``, written with the next batch of publishes."""
        await self._write(lambda: msg.nak(delay=delay))

    async def term(self, msg: Msg) -> None:
        """``msg.term()``, written with the next batch of publishes."""
        await self._write(msg.term)

    async def _write(self, publish: Callable[[], Awaitable[None]]) -> None:
        """Run ``publish`` now, or (with a linger) with the next write; raises what it raises."""
        if self._linger_s <= 0:
            await publish()
            return
        written: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queued.append((publish, written))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_after_linger())
        await written

    async def _write_after_linger(self) -> None:
        while self._queued:  # a publish that yields (a full buffer) lets more be queued
            await asyncio.sleep(self._linger_s)
            queued, self._queued = self._queued, []
            # nats-py buffers each publish and writes the buffer once this loop turn yields.
            for publish, written in queued:
                try:
                    await publish()
                except Exception as e:  # handed to the caller that queued it
                    if not written.done():
                        written.set_exception(e)
                else:
                    if not written.done():
                        written.set_result(None)

    async def send(self, messages: list[Outgoing]) -> list[PubAck | PublishFailed]:
        """Publish all, then wait for every ack; one entry per message, in order."""
        if not self._subscribed:
            self._prefix = f"{self._nc.new_inbox()}."
            try:
                await self._nc.subscribe(f"{self._prefix}*", cb=self._on_reply)
            except (NatsError, OSError) as e:  # closed, or reconnecting with a full buffer
                return [PublishFailed(m.subject, e) for m in messages]
            self._subscribed = True
        loop = asyncio.get_running_loop()
        due = loop.time() + self._timeout_s
        futures: list[asyncio.Future[PubAck]] = []
        spans: list[Span | None] = []
        for m in messages:
            token = str(next(self._tokens))
            future: asyncio.Future[PubAck] = loop.create_future()
            self._waiting[token] = (future, due)
            futures.append(future)
            span, headers = self._traced(m)
            spans.append(span)
            publish = self._publisher(m, f"{self._prefix}{token}", headers)
            if self._linger_s <= 0:
                try:
                    await publish()
                except (NatsError, OSError) as e:
                    self._waiting.pop(token, None)
                    future.set_exception(e)
            else:
                self._queued.append((publish, self._failing(token)))
        if self._linger_s > 0 and self._queued and (self._writer is None or self._writer.done()):
            self._writer = asyncio.create_task(self._write_after_linger())
        if self._waiting and self._expiry is None:
            self._expiry = loop.call_later(
                self._timeout_s / EXPIRY_CHECKS_PER_TIMEOUT, self._expire_overdue
            )
        out: list[PubAck | PublishFailed] = []
        for m, future in zip(messages, futures, strict=True):
            try:
                out.append(await future)
            except Exception as e:  # set here: the write, the reply or the expiry failed it
                out.append(PublishFailed(m.subject, e))
        for span, result in zip(spans, out, strict=True):
            if span is not None:
                end_producer(span, result.cause if isinstance(result, PublishFailed) else None)
        return out

    def _publisher(
        self, m: Outgoing, reply: str, headers: Mapping[str, str] | None
    ) -> Callable[[], Awaitable[None]]:
        def publish() -> Awaitable[None]:
            return self._nc.publish(
                m.subject, m.payload, reply=reply, headers=dict(headers) if headers else None
            )

        return publish

    def _failing(self, token: str) -> asyncio.Future[None]:
        """A future whose exception (a failed write) fails the publish waiting on ``token``."""
        written: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def fail_publish(done: asyncio.Future[None]) -> None:
            if done.cancelled() or done.exception() is None:
                return
            waiting = self._waiting.pop(token, None)
            if waiting is not None and not waiting[0].done():
                waiting[0].set_exception(done.exception())  # type: ignore[arg-type]

        written.add_done_callback(fail_publish)
        return written

    def _traced(self, m: Outgoing) -> tuple[Span | None, Mapping[str, str] | None]:
        """The message's PRODUCER span (if one is made) and its headers with trace context."""
        if (
            not self._propagate
            or m.subject.startswith(KV_SUBJECT_PREFIX)
            or (m.headers and TRACEPARENT in m.headers)
        ):
            return None, m.headers
        if self._tracer is None or not get_current_span().get_span_context().is_valid:
            return None, inject(m.headers)
        span = producer_span(
            self._tracer,
            m.subject,
            parent=None,
            message_id=m.headers.get(MSG_ID) if m.headers else None,
            body_size=len(m.payload),
        )
        return span, inject(m.headers, set_span_in_context(span))

    def _expire_overdue(self) -> None:
        """Fail the publishes whose ack is overdue; look again while any is waiting."""
        self._expiry = None
        now = asyncio.get_running_loop().time()
        overdue = [token for token, (_, due) in self._waiting.items() if due <= now]
        for token in overdue:
            future, _ = self._waiting.pop(token)
            if not future.done():
                future.set_exception(TimeoutError("no ack in time"))
        if self._waiting:
            self._expiry = asyncio.get_running_loop().call_later(
                self._timeout_s / EXPIRY_CHECKS_PER_TIMEOUT, self._expire_overdue
            )

    async def _on_reply(self, msg: Msg) -> None:
        waiting = self._waiting.pop(msg.subject[len(self._prefix) :], None)
        if waiting is None or waiting[0].done():
            return
        future = waiting[0]
        if msg.headers and msg.headers.get("Status") == "503":
            future.set_exception(NoStreamResponseError())
            return
        try:
            resp = orjson.loads(msg.data)
        except orjson.JSONDecodeError as e:
            future.set_exception(e)
            return
        error = resp.get("error")
        if error is not None:
            future.set_exception(
                APIError(
                    code=error.get("code"),
                    err_code=error.get("err_code"),
                    description=error.get("description"),
                )
            )
        else:
            future.set_result(_pub_ack(resp))


def _pub_ack(resp: dict[str, Any]) -> PubAck:
    """The ``PubAck`` of a reply: the fields a plain publish's ack has, set directly.

    ``PubAck.from_response`` walks the dataclass's fields for every reply (a large share of what
    an Outbox spends on one); a reply with more than those (a batch's or a counter's) goes
    through it still.
    """
    if "stream" in resp and "seq" in resp and resp.keys() <= _PLAIN_ACK:
        return PubAck(
            stream=resp["stream"],
            seq=resp["seq"],
            domain=resp.get("domain"),
            duplicate=resp.get("duplicate"),
        )
    return PubAck.from_response(resp)
