"""The sink plugin interface, version 1: what ``jetcrawl sink NAME`` loads and drives.

A sink is found by ``NAME`` in the entry-point group ``jetcrawl.sinks``; the entry point is a
:class:`SinkPlugin`. The service (:mod:`jetcrawl.sinks.service`) owns everything JetStream: the
durable consumers, decoding, acks, dead letters, retries and stopping. The sink only stores:

- ``open()`` once before the first write (connect, create or migrate a schema);
- ``write(records)``: store them, and return the records that are now durable — these, some
  of them, or earlier ones that it held (a file sink returns a file's records when it closes
  the file). The service acks exactly what is returned, and keeps the others alive until they
  are. It also calls ``write([])`` when no record came for a while, so a sink can close what it
  holds by age;
- ``flush()`` at stop: make everything held durable and return it; ``close()`` then.

Raise :class:`~jetcrawl.sinks.errors.SinkUnavailable` when the storage is down: the service
keeps the records, retries the same write with backoff and acks nothing meanwhile. Raise
:class:`~jetcrawl.sinks.errors.SinkRejected` for records the storage refuses for their content:
the service writes them one by one and dead-letters the refused ones. Anything else is a bug and
stops the service. A record may come twice (a redelivery after a crash): storing it again must
change nothing.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from jetcrawl.contract.items import Item
from jetcrawl.contract.messages import Result
from jetcrawl.contract.settings import Settings

__all__ = ["ITEMS", "RESULTS", "SINK_API_VERSION", "Record", "Sink", "SinkPlugin"]

SINK_API_VERSION = 1  # the major version of this interface; a plugin for another is refused
ITEMS = "items"  # stream CRAWL_ITEMS, subjects crawl.items.<job>
RESULTS = "results"  # stream CRAWL_RESULTS, subjects crawl.results.<shard>


@dataclass(frozen=True, slots=True)
class Record:
    """One decoded message: an item or a result, with where it sits in its stream."""

    kind: str  # ITEMS or RESULTS
    seq: int  # its stream sequence: the same on every redelivery
    raw: bytes  # the message as published
    item: Item | None = None  # set when kind is ITEMS
    result: Result | None = None  # set when kind is RESULTS


class Sink(Protocol):
    def describe(self) -> str:
        """Where it writes, for logs: a server or a directory, never a password."""

    async def open(self) -> None: ...

    async def write(self, records: Sequence[Record]) -> Sequence[Record]: ...

    async def flush(self) -> Sequence[Record]: ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class SinkPlugin:
    """What an entry point in ``jetcrawl.sinks`` names."""

    api_version: int  # SINK_API_VERSION of the jetcrawl it was written for
    summary: str  # one line for ``jetcrawl sink --help``
    kinds: frozenset[str]  # what it stores: ITEMS, RESULTS or both
    add_arguments: Callable[[argparse.ArgumentParser], None]  # its own flags
    # A sink from the parsed flags (its own, and ``job``: None for every job) and the settings;
    # raise SinkError for a flag it cannot use: said in one line, exit status 2.
    create: Callable[[argparse.Namespace, Settings], Sink]
