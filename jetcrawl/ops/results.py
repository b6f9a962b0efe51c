"""Reading results back: every record of CRAWL_RESULTS, filtered by job and time, or followed live.

An ephemeral consumer (no acks, in memory, removed when idle) reads from the first record at or
after ``since``; without ``follow`` reading stops at the stream's last record as it was when the
read began. Records that do not decode are counted, not fatal: an export of a million records
does not die on one bad line.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import re
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from jetcrawl.contract.errors import JetcrawlError, MessageError
from jetcrawl.contract.messages import Result
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import RESULTS_PREFIX, RESULTS_STREAM
from jetcrawl.ops.export import format_for, open_sink
from jetcrawl.plumbing.bodies import BodyNotFound, BodyStore
from jetcrawl.plumbing.bus import connect
from jetcrawl.plumbing.pull import pull

log = logging.getLogger(__name__)

FETCH_BATCH = 256
FETCH_WAIT_S = 1.0
_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class BadTime(JetcrawlError):
    def __init__(self, text: str) -> None:
        super().__init__(
            f"cannot read time {text!r}: use an ISO 8601 date-time (2026-11-29T10:00:00Z) "
            "or a duration back from now (90s, 15m, 2h, 1d)"
        )
        self.text = text


def parse_since(text: str, now: float | None = None) -> float:
    """Epoch seconds from ``2026-11-29T10:00:00Z`` or a duration back from now (``15m``)."""
    text = text.strip()
    if match := _RELATIVE.match(text):
        return (now if now is not None else time.time()) - float(match[1]) * _UNIT_S[match[2]]
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise BadTime(text) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


@dataclass(frozen=True, slots=True)
class Query:
    job: str | None = None
    since: float | None = None  # epoch seconds
    follow: bool = False


@dataclass(slots=True)
class ReadStats:
    read: int = 0
    matched: int = 0
    undecodable: int = 0


async def read_results(
    js: JetStreamContext,
    query: Query,
    stats: ReadStats | None = None,
    stop: asyncio.Event | None = None,
) -> AsyncIterator[tuple[Result, bytes]]:
    """Yield ``(record, raw JSON)`` in stream order, until the end or ``stop`` is set."""
    stop = stop or asyncio.Event()
    stats = stats if stats is not None else ReadStats()
    end = (await js.stream_info(RESULTS_STREAM)).state.last_seq
    if end == 0 and not query.follow:
        return
    config = ConsumerConfig(
        ack_policy=AckPolicy.NONE,
        deliver_policy=DeliverPolicy.ALL if query.since is None else DeliverPolicy.BY_START_TIME,
        opt_start_time=(
            None if query.since is None else dt.datetime.fromtimestamp(query.since, dt.UTC)
        ),
        filter_subject=f"{RESULTS_PREFIX}*",
        mem_storage=True,
        inactive_threshold=30.0,
    )
    sub = await js.pull_subscribe(f"{RESULTS_PREFIX}*", stream=RESULTS_STREAM, config=config)
    try:
        while not stop.is_set():
            try:
                msgs = await pull(sub, FETCH_BATCH, FETCH_WAIT_S)
            except TimeoutError:
                if query.follow:
                    continue
                info = await sub.consumer_info()
                if (info.num_pending or 0) == 0:
                    return  # nothing at or after `since` up to the end
                continue
            last_seq = 0
            for msg in msgs:
                last_seq = msg.metadata.sequence.stream
                stats.read += 1
                try:
                    result = Result.from_wire(msg.data)
                except MessageError as e:
                    stats.undecodable += 1
                    log.warning("skipping result record %d: %s", last_seq, e)
                    continue
                if query.job is not None and result.job != query.job:
                    continue
                stats.matched += 1
                yield result, msg.data
            if not query.follow and last_seq >= end:
                return
    finally:
        try:
            await sub.unsubscribe()
        except NatsError as e:
            log.debug("unsubscribe failed: %r", e)


async def export_results(
    settings: Settings,
    query: Query,
    output: Path | None,
    fmt: str | None,
    stop: asyncio.Event | None = None,
) -> tuple[int, int]:
    """Write the matching results to ``output`` (standard output if None); (written, skipped)."""
    fmt = format_for(output, fmt)
    nc = await connect(settings, "jetcrawl-results", give_up_s=settings.command_timeout_s)
    try:
        js = nc.jetstream()
        bodies = await BodyStore.open(js)
        with contextlib.ExitStack() as files:
            stream: BinaryIO = (
                files.enter_context(_open_binary(output))
                if output is not None
                else sys.stdout.buffer
            )
            gzip = output is not None and output.name.endswith(".gz")
            sink = open_sink(stream, fmt, gzip=gzip, user_agent=settings.user_agent)
            async for result, raw in read_results(js, query, stop=stop):
                body = None
                if sink.needs_bodies and result.body_ref:
                    try:
                        body = await bodies.get(result.body_ref)
                    except BodyNotFound:
                        log.warning("body %s of %s is gone", result.body_ref, result.url)
                sink.write(result, raw, body)
                if query.follow:
                    stream.flush()  # a follower sees each record as it comes
            sink.close()
            return sink.written, sink.skipped
    finally:
        await nc.close()


def _open_binary(path: Path) -> BinaryIO:
    return path.open("wb")
