"""``jetcrawl sink files``: items into rolling JSON-lines or Parquet files in one directory.

A file gathers records until it holds ``sink_file_max_records``, ``sink_file_max_bytes`` (of
JSON) or is ``sink_file_max_age_s`` old, whichever comes first; then it is written under a
hidden temporary name (``.items-shop-000007.jsonl.part``), fsynced, renamed to its final name
(``items-shop-000007.jsonl``) and the directory fsynced. Only then are its records returned as
durable, and acked. A kill -9 loses nothing: the records of the file not yet renamed were never
acked and come again, and a leftover temporary file is deleted at start. Nor does a restart
double anything: a crash between a rename and the acks redelivers records of the newest files
(one write may finish several), so at start the sink reads the stream sequences of as many of
the newest records as may be unacked at once (``sink_max_pending``) and skips those.

One sink process per directory: a lock file refuses a second. A full or failing disk is
:class:`~jetcrawl.sinks.errors.SinkUnavailable` (the service pauses and retries the file).
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import fcntl
import logging
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import orjson

from jetcrawl.contract.settings import Settings
from jetcrawl.sinks.api import ITEMS, SINK_API_VERSION, Record, SinkPlugin
from jetcrawl.sinks.errors import SinkError, SinkUnavailable
from jetcrawl.sinks.rows import jsonl_line, parquet_table, pyarrow_modules, row

__all__ = ["FORMATS", "PLUGIN", "FileSink"]

log = logging.getLogger(__name__)

FORMATS = ("jsonl", "parquet")
LOCK_NAME = ".jetcrawl-sink.lock"
PART_SUFFIX = ".part"
# A full disk, a disk gone or a quota: the same write can succeed later.
_TRANSIENT = frozenset({errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EROFS})


class FileSink:
    """Rolling files of items; see the module docstring."""

    def __init__(
        self,
        directory: Path,
        fmt: str,
        job: str | None,
        *,
        max_records: int,
        max_bytes: int,
        max_age_s: float,
        max_pending: int,
    ) -> None:
        if fmt not in FORMATS:
            raise SinkError("--format", f"unknown format {fmt!r}; use one of {FORMATS}")
        if fmt == "parquet":
            pyarrow_modules("--format parquet")
        # where and how
        self._dir = directory
        self._fmt = fmt
        self._prefix = f"items-{job or 'all'}-"
        self._names = re.compile(rf"^{re.escape(self._prefix)}(\d+)\.{fmt}$")
        self._max_records = max_records
        self._max_bytes = max_bytes
        self._max_age_s = max_age_s
        self._max_pending = max_pending  # the consumer's unacked records at most
        # the file being gathered: its records (by stream sequence), their JSON size, its start
        self._number = 0
        self._gathered: dict[int, Record] = {}
        self._bytes = 0
        self._started = 0.0
        # in files written, not yet returned as durable (a later file of the same write failed)
        self._unreturned: dict[int, Record] = {}
        # the stream sequences of the newest files written before this process: skipped
        self._written_before: frozenset[int] = frozenset()
        self._lock: IO[bytes] | None = None

    def describe(self) -> str:
        return f"{self._fmt} files {self._prefix}*.{self._fmt} in {self._dir}"

    async def open(self) -> None:
        where = f"--dir {self._dir}"
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
            self._lock = (self._dir / LOCK_NAME).open("ab")
        except OSError as e:
            raise SinkError(where, e.strerror or str(e)) from None
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            self._lock = None
            raise SinkError(where, "another file sink writes to this directory") from None
        for part in self._dir.glob(f".{self._prefix}*{PART_SUFFIX}"):
            log.info("removing %s: a file a stopped sink had not finished", part)
            part.unlink()
        numbers = {int(m[1]): p for p in self._dir.iterdir() if (m := self._names.match(p.name))}
        self._number = max(numbers, default=0)
        # At most max_pending records were unacked at the crash, all in the newest files:
        # read back that many, newest first.
        seen: set[int] = set()
        for number in sorted(numbers, reverse=True):
            if len(seen) >= self._max_pending:
                break
            seen.update(self._sequences(numbers[number]))
        self._written_before = frozenset(seen)

    async def write(self, records: Sequence[Record]) -> Sequence[Record]:
        durable: list[Record] = []
        for record in records:
            if record.kind != ITEMS:
                continue
            if record.seq in self._written_before:
                durable.append(record)  # in a file already: its ack was lost
                continue
            if record.seq in self._gathered or record.seq in self._unreturned:
                continue  # the same write again, after a pause
            assert record.item is not None
            if not self._gathered:
                self._started = time.monotonic()
            self._gathered[record.seq] = record
            self._bytes += len(jsonl_line(record.item, record.seq))
            if len(self._gathered) >= self._max_records or self._bytes >= self._max_bytes:
                await self._roll()
        if self._gathered and time.monotonic() - self._started >= self._max_age_s:
            await self._roll()
        durable.extend(self._unreturned.values())
        self._unreturned.clear()
        return durable

    async def flush(self) -> Sequence[Record]:
        if self._gathered:
            await self._roll()
        return await self.write(())

    async def _roll(self) -> None:
        """Write the gathered records as the next file; they are returned by the next write."""
        for record in await asyncio.to_thread(self._write_file):
            self._unreturned[record.seq] = record

    async def close(self) -> None:
        if self._lock is not None:
            self._lock.close()  # and with it the lock
            self._lock = None

    def _write_file(self) -> list[Record]:
        """Write what is gathered as the next file: temporary name, fsync, rename, fsync."""
        records = sorted(self._gathered.values(), key=lambda r: r.seq)
        number = self._number + 1
        final = self._dir / f"{self._prefix}{number:06d}.{self._fmt}"
        part = self._dir / f".{final.name}{PART_SUFFIX}"
        try:
            self._write(part, records)
            os.replace(part, final)
            _fsync_dir(self._dir)
        except OSError as e:
            part.unlink(missing_ok=True)
            if e.errno in _TRANSIENT:
                raise SinkUnavailable(f"--dir {self._dir}", e.strerror or str(e)) from None
            raise
        self._number = number
        self._gathered.clear()
        self._bytes = 0
        return records

    def _write(self, path: Path, records: list[Record]) -> None:
        if self._fmt == "jsonl":
            with path.open("wb") as f:
                for r in records:
                    assert r.item is not None
                    f.write(jsonl_line(r.item, r.seq))
                f.flush()
                os.fsync(f.fileno())
            return
        _, pq = pyarrow_modules("--format parquet")
        rows = []
        for r in records:
            assert r.item is not None
            rows.append(row(r.item, r.seq))
        table = parquet_table(rows, "--format parquet")
        with path.open("wb") as f:
            pq.write_table(table, f)
            f.flush()
            os.fsync(f.fileno())

    def _sequences(self, path: Path) -> list[int]:
        """The stream sequences in a finished file."""
        if self._fmt == "jsonl":
            with path.open("rb") as f:
                return [orjson.loads(line)["stream_seq"] for line in f if line.strip()]
        _, pq = pyarrow_modules("--format parquet")
        return [
            int(s) for s in pq.read_table(path, columns=["stream_seq"])["stream_seq"].to_pylist()
        ]


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", type=Path, required=True, help="write the files into this directory")
    p.add_argument("--format", choices=FORMATS, default="jsonl", help="default: jsonl")


def _create(args: argparse.Namespace, settings: Settings) -> FileSink:
    if settings.sink_file_max_records + settings.sink_batch > settings.sink_max_pending:
        raise SinkError(
            "sink_file_max_records",
            f"a file of {settings.sink_file_max_records} records and a batch of "
            f"{settings.sink_batch} must fit in sink_max_pending ({settings.sink_max_pending})",
        )
    return FileSink(
        args.dir,
        args.format,
        args.job,
        max_records=settings.sink_file_max_records,
        max_bytes=settings.sink_file_max_bytes,
        max_age_s=settings.sink_file_max_age_s,
        max_pending=settings.sink_max_pending,
    )


PLUGIN = SinkPlugin(
    api_version=SINK_API_VERSION,
    summary="write items into rolling JSON-lines or Parquet files",
    kinds=frozenset({ITEMS}),
    add_arguments=_add_arguments,
    create=_create,
)
