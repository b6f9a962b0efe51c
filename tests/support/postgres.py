"""A real PostgreSQL server for the sink tests: ``initdb`` and ``postgres`` in a temporary
directory, on a free loopback port, stopped and started again on the same data (an outage).

The binaries come from Debian's ``postgresql`` package (``.ci/run`` installs it): on PATH, else
under ``/usr/lib/postgresql/<version>/bin``, where Debian keeps them. PostgreSQL refuses to run
as root, so as root both run as the ``postgres`` user (``nobody`` if there is none) through
``setpriv``, over a data directory made for that user outside pytest's root-only temp tree.
Readiness is its log line "ready to accept connections", awaited under a deadline, as for the
other servers (:class:`~jetcrawl.local.embedded.process.ServerProcess`). ``stop()`` is a fast
shutdown (SIGINT: SIGTERM would wait for every client to leave); ``kill()`` is SIGKILL.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from jetcrawl.local.embedded.process import (
    LOOPBACK,
    READY_TIMEOUT_S,
    STOP_TIMEOUT_S,
    ServerProcess,
    free_ports,
)
from tests.support.tools import require

__all__ = ["PASSWORD", "USER", "PostgresServer", "postgres_bin_dir"]

USER = "jetcrawl"
PASSWORD = "s3cret-pg-password"  # the tests look for it in logs: it must never show
DATABASE = "postgres"
DEBIAN_BIN_DIRS = "/usr/lib/postgresql/*/bin"
_RUN_AS = ("postgres", "nobody")
_ENTRY = re.compile(r"\[(?P<pid>\d+)\] (?P<level>[A-Z]+):  ")


def postgres_bin_dir() -> Path:
    """Where ``initdb`` and ``postgres`` are; skips the test without them (fails it on CI)."""
    found = shutil.which("postgres")
    if found is not None and shutil.which("initdb") is not None:
        return Path(found).resolve().parent
    versions = sorted(
        Path("/").glob(DEBIAN_BIN_DIRS.lstrip("/")),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    for bin_dir in reversed(versions):
        if (bin_dir / "postgres").exists() and (bin_dir / "initdb").exists():
            return bin_dir
    return Path(require("postgres", "the PostgreSQL sink is tested against a real server")).parent


class PostgresServer(ServerProcess):
    """One PostgreSQL cluster in a fresh directory, reachable as ``dsn`` (with a password)."""

    def __init__(
        self,
        log_path: Path,
        *,
        bin_dir: Path | None = None,
        port: int | None = None,
        ready_timeout_s: float = READY_TIMEOUT_S * 2,
        stop_timeout_s: float = STOP_TIMEOUT_S,
    ) -> None:
        super().__init__(
            "postgres", log_path, ready_timeout_s=ready_timeout_s, stop_timeout_s=stop_timeout_s
        )
        self.bin_dir = bin_dir or postgres_bin_dir()
        self.port = port if port is not None else free_ports(1)[0]
        self._account = _unprivileged_account() if os.geteuid() == 0 else None
        self.data_dir = Path(tempfile.mkdtemp(prefix="jetcrawl-pg-")) / "data"
        self._postmaster: str | None = None  # the server's pid, once its log says it starts
        if self._account is not None:
            os.chown(self.data_dir.parent, self._account.pw_uid, self._account.pw_gid)

    def dsn(self, password: str = PASSWORD, database: str = DATABASE) -> str:
        return f"postgresql://{USER}:{password}@{LOOPBACK}:{self.port}/{database}"

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def _as_owner(self, command: list[str]) -> list[str]:
        if self._account is None:
            return command
        uid, gid = self._account.pw_uid, self._account.pw_gid
        return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *command]

    def _command(self) -> list[str]:
        return self._as_owner(
            [
                str(self.bin_dir / "postgres"),
                "-D", str(self.data_dir),
                "-p", str(self.port),
                "-c", f"listen_addresses={LOOPBACK}",
                "-c", "unix_socket_directories=",
                "-c", "fsync=off",  # a test's data needs to outlive the process, not the machine
                "-c", "full_page_writes=off",
                "-c", "max_connections=30",
                "-c", "shared_buffers=16MB",
            ]
        )  # fmt: skip

    def _prepare(self) -> None:
        self._postmaster = None
        if (self.data_dir / "PG_VERSION").exists():
            return  # a restart: same data
        password_file = self.data_dir.parent / "password"
        password_file.write_text(PASSWORD + "\n")
        if self._account is not None:
            os.chown(password_file, self._account.pw_uid, self._account.pw_gid)
        done = subprocess.run(
            self._as_owner(
                [
                    str(self.bin_dir / "initdb"),
                    "-D", str(self.data_dir),
                    "-U", USER,
                    f"--pwfile={password_file}",
                    "--auth=scram-sha-256",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--no-sync",
                ]
            ),
            capture_output=True,
            text=True,
            timeout=60,
        )  # fmt: skip
        if done.returncode != 0:
            raise self._error(f"initdb failed ({done.returncode}): {done.stderr.strip()}")

    def _parse(self, line: str) -> None:
        entry = _ENTRY.search(line)
        if entry and "starting PostgreSQL" in line:
            self._postmaster = entry["pid"]
        if "ready to accept connections" in line:
            self._ready = True

    def _is_fatal(self, line: str) -> bool:
        """A PANIC, or a FATAL of the server itself: a client's FATAL ("the database system
        is starting up", a wrong password) ends that client's session only."""
        entry = _ENTRY.search(line)
        if entry is None:
            return False
        if entry["level"] == "PANIC":
            return True
        return entry["level"] == "FATAL" and self._postmaster in (None, entry["pid"])

    async def stop(self) -> None:
        await self._terminate(signal.SIGINT)  # fast shutdown: clients are cut off

    def remove(self) -> None:
        """Delete the data directory (the server stopped)."""
        shutil.rmtree(self.data_dir.parent, ignore_errors=True)


def _unprivileged_account() -> pwd.struct_passwd:
    for name in _RUN_AS:
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise RuntimeError(f"none of the users {_RUN_AS} exists to run PostgreSQL as (not as root)")
