"""What the sink tests share: items made and published, a sink consumer settled, a sink process.

``python -m jetcrawl sink ...`` runs as a real process (``tests.support.faulty`` for a crash at
a chosen moment); its stderr goes to a file the test reads when it fails.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from jetcrawl.contract.items import Item
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import item_subject
from jetcrawl.plumbing.bus import MSG_ID
from tests.support import faulty
from tests.support.streams import eventually

__all__ = [
    "FAST",
    "SinkProcess",
    "consumer_settled",
    "fast_settings",
    "items_stream",
    "make_item",
    "publish_items",
    "wait_settled",
]

# Short timings: a paused sink retries quickly, a pull returns quickly, and what a killed sink
# left unacked comes again after 3 s (AckWait).
FAST = {
    "JETCRAWL_ACK_WAIT_S": "3",
    "JETCRAWL_SINK_RETRY_FIRST_S": "0.05",
    "JETCRAWL_SINK_RETRY_MAX_S": "0.3",
    "JETCRAWL_SINK_IDLE_S": "0.2",
    "JETCRAWL_SINK_DB_TIMEOUT_S": "3",
    "JETCRAWL_SHARDS": "4",
}


def fast_settings(nats_url: str, **changes: Any) -> Settings:
    env = {**FAST, "JETCRAWL_NATS_URL": nats_url}
    return Settings.from_env(env, **changes)


def make_item(
    n: int,
    *,
    job: str = "shop",
    crawl: int = 1,
    key: str | None = None,
    data: dict[str, Any] | None = None,
) -> Item:
    """Item ``n`` of page ``n // 3`` (three items a page), in crawl ``crawl`` of that page."""
    page = n // 3
    return Item(
        job=job,
        spec_version=1,
        key=key or f"product-{n}",
        fp=f"{page:032x}",
        url=f"http://shop.test/p/{page}",
        crawl_id=f"{job}-{page:032x}-{crawl}",  # a job dedupes apart: its own crawl ids
        source="extract",
        data=data if data is not None else {"name": f"thing {n}", "price": n * 1.5, "crawl": crawl},
        fetched_at=1_800_000_000.0 + crawl,
    )


async def publish_items(
    js: JetStreamContext, items: Iterable[Item], *, msg_ids: bool = True
) -> int:
    """Publish, each with its ``Nats-Msg-Id`` (or none, as a publisher that lost its dedupe
    window would); how many."""
    futures = [
        await js.publish_async(
            item_subject(item.job),
            item.to_wire(),
            headers={MSG_ID: item.msg_id} if msg_ids else None,
        )
        for item in items
    ]
    await asyncio.gather(*futures)
    return len(futures)


async def consumer_settled(js: JetStreamContext, stream: str, consumer: str) -> bool:
    """Every message of ``stream`` delivered to ``consumer`` and acked (or terminated)."""
    try:
        info = await js.consumer_info(stream, consumer)
    except NotFoundError:
        return False
    return (info.num_pending or 0) == 0 and (info.num_ack_pending or 0) == 0


async def wait_settled(
    js: JetStreamContext, stream: str, consumer: str, within_s: float = 30
) -> None:
    async def check() -> bool:
        return await consumer_settled(js, stream, consumer)

    await eventually(check, within_s=within_s)


async def items_stream(js: JetStreamContext) -> None:
    """CRAWL_ITEMS as the topology makes it, for tests that publish before a sink starts."""
    from jetcrawl.plumbing.topology import ensure

    await ensure(js, Settings.from_env(FAST))


class SinkProcess:
    """``jetcrawl sink ARGS`` as a process of its own, optionally crashing on ``fault``."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path, fault: str | None = None):
        self.args = args
        self.env = faulty.environ({**os.environ, **FAST, **env})
        self.log = log
        self.fault = fault
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                *faulty.command(self.fault),
                "sink",
                *self.args,
                env=self.env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=out,
            )

    async def wait(self, within_s: float = 30) -> int:
        assert self.proc is not None
        async with asyncio.timeout(within_s):
            return await self.proc.wait()

    async def kill(self) -> None:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()

    async def stop(self) -> int:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        return await self.wait()

    def output(self) -> str:
        return self.log.read_text(errors="replace")
