"""Reading streams and buckets back in tests: every stored message, with its headers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import orjson
from nats.js import JetStreamContext
from nats.js.api import StreamConfig, StreamInfo
from nats.js.errors import BadRequestError, NotFoundError, ServiceUnavailableError

from jetcrawl.contract.topology import seen_stream, seen_subject_prefix

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Stored:
    seq: int
    subject: str
    data: bytes
    headers: dict[str, str]

    def json(self) -> dict[str, object]:
        return orjson.loads(self.data)  # type: ignore[no-any-return]


async def stored(js: JetStreamContext, stream: str) -> list[Stored]:
    """Every message the stream holds now, in sequence order."""
    info = await js.stream_info(stream)
    out: list[Stored] = []
    if info.state.messages == 0:
        return out
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            msg = await js.get_msg(stream, seq)
        except NotFoundError:
            continue  # deleted or acked out of a work queue
        out.append(Stored(seq, msg.subject or "", msg.data or b"", dict(msg.headers or {})))
    return out


async def seen_keys(js: JetStreamContext, partitions: int = 1) -> set[str]:
    """The fingerprints in the seen set, over its ``partitions`` buckets (KV crawl_seen alone by
    default), read from the streams' subjects: no watcher race."""
    keys: set[str] = set()
    for p in range(partitions):
        prefix = seen_subject_prefix(p, partitions)
        info = await js.stream_info(seen_stream(p, partitions), subjects_filter=f"{prefix}>")
        keys |= {subject[len(prefix) :] for subject in (info.state.subjects or {})}
    return keys


async def eventually(check: Callable[[], Awaitable[bool]], within_s: float = 30.0) -> None:
    """Wait for a server-side state that has no event of its own (stream or consumer counts).

    Polls every 20 ms under a deadline; in-process states are awaited on their own events instead.
    """
    async with asyncio.timeout(within_s):
        while not await check():
            await asyncio.sleep(0.02)


async def read_until(
    read: Callable[[], Awaitable[T]],
    ok: Callable[[T], bool] = lambda _: True,
    within_s: float = 30.0,
    unavailable: tuple[type[BaseException], ...] = (),
) -> T:
    """``eventually`` for a value: ``read`` until ``ok`` holds for what it read, and return that.

    A read that raises one of ``unavailable`` (a cluster electing a leader) counts as not yet.
    """
    last: list[T] = []

    async def check() -> bool:
        try:
            value = await read()
        except unavailable:
            return False
        last[:] = [value]
        return ok(value)

    await eventually(check, within_s)
    return last[0]


async def add_replicated(js: JetStreamContext, config: StreamConfig) -> StreamInfo:
    """Add a replicated stream, again while a young cluster refuses to place it: its meta
    leader can count a peer offline ("no suitable peers for placement") for a moment even
    after the cluster fixture placed its probe stream. A refused create creates nothing."""
    return await read_until(
        lambda: js.add_stream(config), unavailable=(BadRequestError, ServiceUnavailableError)
    )
