"""Services that crash on cue, for the fault tests; the product carries no hook for them.

``python -m tests.support.faulty FAULT ARGS...`` is ``jetcrawl ARGS...`` with one method of the real
service wrapped to exit at once with code 137 (as a SIGKILL'd process would, no cleanup) at the
moment FAULT names:

    dispatcher.after_seen     once a batch's seen marks are made, before its tasks are published
    worker.after_result       once a task's records are stored, before its ack
    worker.exit_on_url:TEXT   about to fetch a URL containing TEXT, every time (a poison task)
    sink.before_ack:N         the Nth time a sink made records durable, before their acks
    sink.in_transaction:N     inside the postgres sink's Nth batch, before it commits

``jetcrawl crawl`` forks its services after the wrap, so they crash alike. A service it spawns
as a new interpreter instead (``JETCRAWL_LOCAL_FORK=false``, or no fork possible) runs unwrapped:
the test that expects the crash then fails, it cannot pass by mistake.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parents[2]  # where ``tests`` is importable from
EXIT_CODE = 137

log = logging.getLogger("tests.support.faulty")


def command(fault: str | None = None) -> list[str]:
    """The start of a ``jetcrawl`` command line, crashing on ``fault`` when one is given."""
    if fault is None:
        return [sys.executable, "-m", "jetcrawl"]
    _check(fault)
    return [sys.executable, "-m", "tests.support.faulty", fault]


def environ(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with this repo on ``PYTHONPATH``, for a :func:`command` started anywhere."""
    paths = [str(ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    return {**env, "PYTHONPATH": os.pathsep.join(paths)}


def _crash(why: str) -> NoReturn:
    log.error("fault injected: exiting with %d %s", EXIT_CODE, why)
    os._exit(EXIT_CODE)


def _after_seen(_: str) -> None:
    from jetcrawl.dispatcher.service import Dispatcher

    admit = Dispatcher._admit

    async def admit_then_crash(self: Dispatcher, *args: Any, **kwargs: Any) -> Any:
        await admit(self, *args, **kwargs)
        _crash("after the seen marks, before the tasks")

    Dispatcher._admit = admit_then_crash  # type: ignore[method-assign]


def _after_result(_: str) -> None:
    from jetcrawl.worker.crawl import TaskProcessor

    publish = TaskProcessor._publish

    async def publish_then_crash(self: TaskProcessor, *args: Any, **kwargs: Any) -> Any:
        failed = await publish(self, *args, **kwargs)
        if failed is None:  # stored: _finish would ack next
            _crash("after the result, before the ack")
        return failed

    TaskProcessor._publish = publish_then_crash  # type: ignore[method-assign]


def _exit_on_url(text: str) -> None:
    from jetcrawl.worker.fetcher import Fetcher

    fetch = Fetcher.fetch

    async def crash_on_url(self: Fetcher, url: str, *args: Any, **kwargs: Any) -> Any:
        if text in url:
            _crash(f"before fetching {url}")
        return await fetch(self, url, *args, **kwargs)

    Fetcher.fetch = crash_on_url  # type: ignore[method-assign]


def _sink_before_ack(count: str) -> None:
    from jetcrawl.sinks.service import SinkService

    ack = SinkService._ack
    left = [int(count)]

    async def ack_or_crash(self: SinkService, durable: Any) -> None:
        if durable:
            left[0] -= 1
            if left[0] <= 0:
                _crash(f"with {len(durable)} records durable, before their acks")
        await ack(self, durable)

    SinkService._ack = ack_or_crash  # type: ignore[method-assign]


def _sink_in_transaction(count: str) -> None:
    from asyncpg.connection import Connection

    executemany = Connection.executemany
    left = [int(count)]

    async def executemany_or_crash(self: Connection, *args: Any, **kwargs: Any) -> Any:
        done = await executemany(self, *args, **kwargs)
        left[0] -= 1
        if left[0] <= 0:
            _crash("inside a batch's transaction, before its commit")
        return done

    Connection.executemany = executemany_or_crash  # type: ignore[method-assign]


FAULTS: dict[str, Callable[[str], None]] = {
    "dispatcher.after_seen": _after_seen,
    "worker.after_result": _after_result,
    "worker.exit_on_url:": _exit_on_url,  # a prefix: the text follows it
    "sink.before_ack:": _sink_before_ack,
    "sink.in_transaction:": _sink_in_transaction,
}


def _check(fault: str) -> tuple[Callable[[str], None], str]:
    for name, inject in FAULTS.items():
        if fault == name or (name.endswith(":") and fault.startswith(name)):
            return inject, fault[len(name) :]
    raise ValueError(f"no such fault {fault!r}; faults: {', '.join(FAULTS)}")


def main(argv: list[str]) -> int:
    fault, *args = argv
    inject, arg = _check(fault)
    inject(arg)
    from jetcrawl.cli import main as jetcrawl

    return jetcrawl(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
