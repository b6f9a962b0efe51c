"""``jetcrawl results --items``: the items of CRAWL_ITEMS as JSON lines, CSV or Parquet.

The stream keeps every crawl of a page, so the export keeps what a sink keeps: per
``(job, fp, key)`` the item of the latest crawl (``fetched_at``, then stream order), in stream
order. It holds one entry per key in memory until the end. CSV has the item's columns, then one
``data.<field>`` column per top-level field of ``data`` seen in any item (a nested value as JSON
text); JSON lines and Parquet keep ``data`` whole (JSON text in Parquet). Messages that do not
decode are counted and skipped, as ``jetcrawl results`` does.
"""

from __future__ import annotations

import asyncio
import csv
import io
import logging
import sys
from pathlib import Path
from typing import Any

import orjson
from nats.errors import Error as NatsError
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from jetcrawl.contract.errors import MessageError, UsageError
from jetcrawl.contract.items import Item
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import ITEMS_PREFIX, ITEMS_STREAM, item_subject
from jetcrawl.plumbing.bus import connect
from jetcrawl.plumbing.pull import pull
from jetcrawl.sinks.errors import SinkError
from jetcrawl.sinks.rows import COLUMNS, jsonl_line, parquet_table, row

__all__ = ["ITEM_FORMATS", "export_items", "item_format_for", "write_items"]

log = logging.getLogger(__name__)

ITEM_FORMATS = ("jsonl", "csv", "parquet")
FETCH_BATCH = 256
FETCH_WAIT_S = 1.0


def item_format_for(path: Path | None, explicit: str | None) -> str:
    if explicit is not None:
        if explicit not in ITEM_FORMATS:
            raise UsageError(f"--format {explicit}", f"items are written as {ITEM_FORMATS}")
        return explicit
    if path is not None and path.suffix in (".csv", ".parquet"):
        return path.suffix[1:]
    return "jsonl"


async def export_items(
    settings: Settings,
    job: str | None,
    output: Path | None,
    fmt: str | None,
    stop: asyncio.Event | None = None,
) -> tuple[int, int]:
    """Write the latest item of each key to ``output`` (standard output if None);
    (items written, messages read)."""
    fmt = item_format_for(output, fmt)
    if fmt == "parquet" and output is None:
        raise UsageError("--format parquet", "needs --output FILE")
    stop = stop or asyncio.Event()
    nc = await connect(settings, "jetcrawl-results", give_up_s=settings.command_timeout_s)
    latest: dict[tuple[str, str, str], tuple[Item, int]] = {}
    read = 0
    try:
        js = nc.jetstream()
        end = (await js.stream_info(ITEMS_STREAM)).state.last_seq
        subject = item_subject(job) if job else f"{ITEMS_PREFIX}*"
        if end > 0:
            config = ConsumerConfig(
                ack_policy=AckPolicy.NONE,
                deliver_policy=DeliverPolicy.ALL,
                filter_subject=subject,
                mem_storage=True,
                inactive_threshold=30.0,
            )
            sub = await js.pull_subscribe(subject, stream=ITEMS_STREAM, config=config)
            try:
                while not stop.is_set():
                    try:
                        msgs = await pull(sub, FETCH_BATCH, FETCH_WAIT_S)
                    except TimeoutError:
                        if ((await sub.consumer_info()).num_pending or 0) == 0:
                            break
                        continue
                    seq = 0
                    for msg in msgs:
                        seq = msg.metadata.sequence.stream
                        read += 1
                        try:
                            item = Item.from_wire(msg.data)
                        except MessageError as e:
                            log.warning("skipping item message %d: %s", seq, e)
                            continue
                        key = (item.job, item.fp, item.key)
                        kept = latest.get(key)
                        if kept is None or kept[0].fetched_at <= item.fetched_at:
                            latest[key] = (item, seq)
                    if seq >= end:
                        break
            finally:
                try:
                    await sub.unsubscribe()
                except NatsError as e:
                    log.debug("unsubscribe failed: %r", e)
    finally:
        await nc.close()
    rows = sorted(latest.values(), key=lambda kept: kept[1])
    data = write_items(rows, fmt)
    if output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    else:
        await asyncio.to_thread(output.write_bytes, data)
    return len(rows), read


def write_items(rows: list[tuple[Item, int]], fmt: str) -> bytes:
    """``rows`` (item, stream sequence) in ``fmt``, as the bytes of a whole file."""
    if fmt == "jsonl":
        return b"".join(jsonl_line(item, seq) for item, seq in rows)
    if fmt == "csv":
        return _csv([row(item, seq) for item, seq in rows])
    try:
        table = parquet_table([row(item, seq) for item, seq in rows], "--format parquet")
    except SinkError as e:
        raise UsageError(e.where, e.problem) from None
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def _csv(rows: list[dict[str, Any]]) -> bytes:
    fields: dict[str, None] = {}  # data's top-level fields, in order of first sight
    for r in rows:
        fields.update(dict.fromkeys(r["data"]))
    header = [c for c in COLUMNS if c != "data"] + [f"data.{f}" for f in fields]
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(header)
    for r in rows:
        data = r["data"]
        writer.writerow(
            [_cell(r[c]) for c in COLUMNS if c != "data"] + [_cell(data.get(f)) for f in fields]
        )
    return text.getvalue().encode()


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return orjson.dumps(value).decode()
    return value
