"""The local crawl's service processes: forked from the command, or started as new interpreters.

``jetcrawl crawl`` runs one dispatcher and N workers as processes of their own: the very
``jetcrawl dispatcher`` and ``jetcrawl worker`` that compose runs, through the CLI's main (the
``entry`` the command passes). Started as new interpreters, each one imports its code again
(aiohttp, nats-py, aetcd, selectolax), a sizable share of a short crawl's CPU (bench/RESULTS.md).
So where it is safe, the command imports that code once and forks its services
(:class:`Prefork`) first thing, before it has a second thread or an event loop: each names itself
``jc-<role>`` (for ``ps``, ``top`` and the bench), says it is ready and waits on a socket pair
until the command sends it its arguments, environment and log file (:class:`Launch`), once the
servers are up. Where it is not (not Linux,
a thread already running, ``JETCRAWL_LOCAL_FORK=false``), each service is started as
``python -m jetcrawl <role>`` (:func:`spawn`). Either way the command holds a :class:`Service`:
a pid, an exit code, signals and an awaitable exit.

Every child dies with the command, even on ``kill -9`` (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import importlib
import logging
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import ForkProcess
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self

from jetcrawl.local.embedded import libc_prctl, parent_death_hook

__all__ = ["Launch", "Prefork", "Service", "fork_safe", "process_name", "spawn"]

log = logging.getLogger(__name__)

ROLES = ("dispatcher", "worker")
# What a forked service runs: the CLI's main, given by the CLI (this module sits below it).
Entry = Callable[[list[str]], int]
# What the services import that the command does not: imported once, before the fork.
PRELOAD = (
    "aiohttp.client",  # not the LazyLoader placeholder that defer_aiohttp() leaves
    "jetcrawl.dispatcher",
    "jetcrawl.worker",
    "jetcrawl.registry",
    "jetcrawl.plumbing.health",
    "jetcrawl.plumbing.metrics",
    "jetcrawl.otel",
    "uvloop",
)
READY_TIMEOUT_S = 10.0  # for a forked service to say it is ready
READY = "ready"
UNUSED_EXIT_S = 1.0  # for a service never launched to return once told
NAME_PREFIX = "jc-"  # /proc/<pid>/comm of a forked service: jc-dispatcher, jc-worker
_PR_SET_NAME = 15
_DIE_WITH_US = parent_death_hook()


class Service(Protocol):
    """A running service process as the command sees it (``asyncio.subprocess.Process`` is one)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...

    async def wait(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Launch:
    """What a service is started with: ``jetcrawl`` arguments, its environment, its log file."""

    role: str
    argv: tuple[str, ...]  # e.g. ("--log-level", "INFO", "worker")
    env: Mapping[str, str]
    log_path: Path


def fork_safe() -> bool:
    """Whether forking this process now is safe: Linux, no thread but this one, and no event
    loop running (on Python 3.11 a child would inherit it as its running loop)."""
    return (
        sys.platform.startswith("linux")
        and threading.active_count() == 1
        and asyncio._get_running_loop() is None
    )


def process_name(role: str) -> str:
    """The ``/proc/<pid>/comm`` of a forked service (at most 15 bytes, the kernel's limit)."""
    return f"{NAME_PREFIX}{role}"[:15]


async def spawn(launch: Launch) -> Service:
    """``python -m jetcrawl ARGV`` as a new interpreter, its output into the log file."""
    with launch.log_path.open("wb") as log_file:  # the child holds its own descriptor
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "jetcrawl",
            *launch.argv,
            env=dict(launch.env),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log_file,
            stderr=asyncio.subprocess.STDOUT,
            preexec_fn=_DIE_WITH_US,
        )


@dataclass(slots=True)
class _Slot:
    role: str
    process: ForkProcess
    conn: Connection  # ours: a socket pair with the child
    launched: bool = False


class Prefork:
    """Service processes forked now, each started later by :meth:`launch` or ended by ``close``.

    ``Prefork.start(roles, entry)`` returns None where forking is not safe; the caller spawns
    instead. A context manager: leaving it ends every service not launched (launched ones belong to
    whoever launched them).
    """

    def __init__(self, slots: list[_Slot]) -> None:
        self._slots = slots

    @classmethod
    def start(cls, roles: Sequence[str], entry: Entry) -> Prefork | None:
        for role in roles:
            if role not in ROLES:
                raise ValueError(f"not a service: {role!r}")
        if not fork_safe():
            return None
        for module in PRELOAD:
            importlib.import_module(module)
        # What exists now is shared with the children: kept out of every cycle collection, so
        # neither side's collector walks (and copies) the other's pages.
        gc.freeze()
        context = multiprocessing.get_context("fork")
        parent = os.getpid()
        slots: list[_Slot] = []
        for role in roles:
            theirs, ours = context.Pipe()
            # The child closes every end of ours it inherits (its own and its elder siblings').
            inherited = (*(slot.conn for slot in slots), ours)
            process = context.Process(
                target=_serve,
                args=(role, parent, theirs, inherited, entry),
                name=process_name(role),
                daemon=True,
            )
            try:
                process.start()
            except OSError as e:  # out of processes or memory: spawn them later instead
                log.warning("cannot fork a %s (%s); spawning the services", role, e)
                ours.close()
                cls(slots).close()
                return None
            finally:
                theirs.close()
            slots.append(_Slot(role, process, ours))
        prefork = cls(slots)
        # Each says when it is named and bound to our life: from then on ps, the bench and the
        # tests see its role, and a kill -9 of this command takes it along.
        if not all(_ready(slot.conn) for slot in slots):
            log.warning("a forked service did not start; spawning them instead")
            prefork.close()
            return None
        log.debug("forked %d services: %s", len(slots), ", ".join(roles))
        return prefork

    def launch(self, launch: Launch) -> Service:
        """Start the next waiting ``launch.role`` service with ``launch``."""
        slot = next((s for s in self._slots if s.role == launch.role and not s.launched), None)
        if slot is None:
            raise LookupError(f"no forked {launch.role} is waiting")
        slot.launched = True
        with contextlib.suppress(OSError):  # it died: its exit code tells the caller
            slot.conn.send(launch)
        slot.conn.close()
        return Forked(slot.process)

    def waiting(self, role: str) -> int:
        return sum(1 for s in self._slots if s.role == role and not s.launched)

    def close(self) -> None:
        """End the services never launched, and reap them (idempotent; blocks up to a second)."""
        unused = [slot for slot in self._slots if not slot.launched]
        for slot in unused:
            slot.launched = True
            with contextlib.suppress(OSError):
                slot.conn.send(None)  # "not needed": it returns at once
            slot.conn.close()
        for slot in unused:
            slot.process.join(UNUSED_EXIT_S)
            if slot.process.exitcode is None:
                slot.process.kill()
                slot.process.join()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _ready(conn: Connection) -> bool:
    try:
        return conn.poll(READY_TIMEOUT_S) and conn.recv() == READY
    except (EOFError, OSError):
        return False


class Forked:
    """A launched forked service: the :class:`Service` of a ``multiprocessing`` process."""

    def __init__(self, process: ForkProcess) -> None:
        assert process.pid is not None
        self._process = process
        self._pid = process.pid
        self._ended: asyncio.Future[None] | None = None

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode  # reaps it once it has ended

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:  # not reaped yet, so the pid is still ours
            os.kill(self._pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    async def wait(self) -> int:
        if self.returncode is None:
            if self._ended is None:
                loop = asyncio.get_running_loop()
                ended = self._ended = loop.create_future()
                sentinel = self._process.sentinel  # readable once the process has ended

                def on_end() -> None:
                    loop.remove_reader(sentinel)
                    if not ended.done():
                        ended.set_result(None)

                loop.add_reader(sentinel, on_end)
            await asyncio.shield(self._ended)
        self._process.join()
        code = self._process.exitcode
        assert code is not None
        return code


# ---------------------------------------------------------------- in the child


def _serve(
    role: str, parent: int, conn: Connection, inherited: tuple[Connection, ...], entry: Entry
) -> None:
    """A forked service: wait for its launch, then be ``entry(argv)`` (``jetcrawl <role>``)
    until it ends."""
    _name_this_process(process_name(role))
    if _DIE_WITH_US is not None:
        _DIE_WITH_US()
    if os.getppid() != parent:
        return  # the command died before PR_SET_PDEATHSIG was set
    for other in inherited:
        other.close()
    # Until launched, Ctrl-C is the command's to handle: it ends this one with close().
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        conn.send(READY)
        launch = conn.recv()
    except (EOFError, OSError):
        return  # the command is gone, or has closed its end
    finally:
        conn.close()
    if launch is None:
        return
    _become(launch)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(entry(list(launch.argv)))


def _become(launch: Launch) -> None:
    """Take on the launch's environment, and write stdout and stderr to its log file."""
    os.environ.clear()
    os.environ.update(launch.env)
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(launch.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    root = logging.getLogger()
    for handler in root.handlers[:]:  # the command's: main() configures the service's own
        root.removeHandler(handler)


def _name_this_process(name: str) -> None:
    if _PRCTL is not None:
        _PRCTL(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


_PRCTL = libc_prctl()  # resolved before any fork: the child makes one call
