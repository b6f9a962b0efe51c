"""A thin etcd client: aetcd underneath, a deadline on every call, our own errors and record types.

aetcd 1.0 sets no call deadlines (a call to a paused or black-holed etcd waits forever), has no
keepalive loop and never restarts a watch after an error. This module fixes the first at the one
place every call passes through: each call runs under ``asyncio.timeout(timeout_s)`` and aetcd's and
gRPC's exceptions are translated into the ``RegistryError`` tree there (see ``errors.py``). The
keepalive loop and the watch restart live in ``registry.py``, which owns the policy.

gRPC's reconnect backoff defaults to growing up to 120 s, which would keep a client away for minutes
after etcd comes back; the channel here caps it at ``RECONNECT_BACKOFF_MAX_MS``. (Not
``grpc.min_reconnect_backoff_ms``: gRPC also uses it as the connect timeout, and a small one fails
connections to a slow but live etcd.)

gRPC's fork handlers are turned off (``GRPC_ENABLE_FORK_SUPPORT=false`` unless the environment
says otherwise) before aetcd imports grpc. With them on, a child forked to exec a service while a
client here is busy restarts gRPC's poller thread, and when subprocess closes the inherited
descriptors before the exec, the child dies of SIGSEGV or SIGABRT, or logs an epoll error into the
service's log (grpc/grpc#43055, grpcio >= 1.81). No jetcrawl process uses gRPC across a fork: the
crawl command forks its services before it first talks to etcd. Whoever imports grpc before this
module keeps gRPC's own default.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
from collections.abc import AsyncIterator, Awaitable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self, TypeVar
from urllib.parse import urlsplit

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")  # before grpc is imported: see above

import aetcd

from jetcrawl.registry.errors import (
    EtcdRequestError,
    EtcdTimeout,
    EtcdUnavailable,
    RegistryError,
    RevisionCompacted,
)

__all__ = ["Change", "Entry", "Etcd", "Listing"]

log = logging.getLogger(__name__)

RECONNECT_BACKOFF_FIRST_MS = 100
RECONNECT_BACKOFF_MAX_MS = 1000
CHANNEL_OPTIONS = {
    "grpc.initial_reconnect_backoff_ms": RECONNECT_BACKOFF_FIRST_MS,
    "grpc.max_reconnect_backoff_ms": RECONNECT_BACKOFF_MAX_MS,
}

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Entry:
    """A key as etcd stores it; ``lease`` is 0 for a key without a lease."""

    key: str
    value: bytes
    mod_revision: int
    lease: int

    @classmethod
    def from_kv(cls, kv: Any) -> Entry:
        return cls(
            key=bytes(kv.key).decode(),
            value=bytes(kv.value),
            mod_revision=int(kv.mod_revision),
            lease=int(kv.lease),
        )


@dataclass(frozen=True, slots=True)
class Listing:
    """All keys under a prefix as of ``revision``."""

    entries: tuple[Entry, ...]
    revision: int


@dataclass(frozen=True, slots=True)
class Change:
    """``key`` was put (``entry`` is its new state) or deleted (``entry`` None) at ``revision``."""

    key: str
    revision: int
    entry: Entry | None

    @classmethod
    def put(cls, entry: Entry) -> Change:
        return cls(entry.key, entry.mod_revision, entry)

    @classmethod
    def delete(cls, key: str, revision: int) -> Change:
        return cls(key, revision, None)


class Etcd:
    """One connection to etcd at ``url`` (``http://host:port``); an async context manager."""

    def __init__(self, url: str, timeout_s: float) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise RegistryError(f"etcd url {url!r}: expected http://host:port (aetcd has no TLS)")
        self.url = url
        self.timeout_s = timeout_s
        self._client = aetcd.Client(
            host=parts.hostname, port=parts.port or 2379, options=CHANNEL_OPTIONS
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the channel; idempotent. Open watches end."""
        with contextlib.suppress(RegistryError):
            await self._call("close", self._client.close())

    # --- leases

    async def grant_lease(self, ttl_s: float) -> int:
        """A new lease of ``ttl_s`` (rounded up to whole seconds, etcd's unit); returns its id."""
        lease = await self._call("grant lease", self._client.lease(math.ceil(ttl_s)))
        return int(lease.id)

    async def keep_alive(self, lease: int) -> int:
        """Refresh ``lease`` once; returns its TTL in seconds, ``<= 0`` when the lease is gone."""
        reply = await self._call("keep alive", self._client.refresh_lease(lease))
        if reply is None:
            raise EtcdUnavailable("keep alive", "the keepalive stream closed without an answer")
        return int(reply.TTL)

    async def revoke_lease(self, lease: int) -> bool:
        """Revoke ``lease`` and delete its keys; False if etcd no longer knows the lease."""
        try:
            await self._call("revoke lease", self._client.revoke_lease(lease))
        except EtcdRequestError as exc:
            if "lease not found" in exc.detail:
                return False
            raise
        return True

    # --- keys

    async def get_prefix(self, prefix: str) -> Listing:
        result = await self._call("get prefix", self._client.get_prefix(prefix.encode()))
        return Listing(
            entries=tuple(Entry.from_kv(kv) for kv in result.kvs),
            revision=int(result.header.revision),
        )

    async def put(self, key: str, value: bytes, lease: int = 0) -> Entry:
        """Put ``key``; returns the stored entry (its ``mod_revision`` is the put's revision)."""
        result = await self._call("put", self._client.put(key.encode(), value, lease=lease))
        return Entry(key, value, int(result.header.revision), lease)

    async def create(self, key: str, value: bytes, lease: int) -> tuple[bool, Entry]:
        """Create ``key`` only if absent (create revision 0), in one transaction.

        Returns ``(True, the new entry)``, or ``(False, the entry that holds the key)``.
        """
        txn = self._client.transactions
        ok, responses = await self._call(
            "create",
            self._client.transaction(
                compare=[txn.create(key.encode()) == 0],
                success=[txn.put(key.encode(), value, lease=lease)],
                failure=[txn.get(key.encode())],
            ),
        )
        if ok:
            revision = int(responses[0].response_put.header.revision)
            return True, Entry(key, value, revision, lease)
        (_, holder), *_ = responses[0]
        return False, Entry.from_kv(holder)

    async def delete_if(self, key: str, mod_revision: int) -> int | None:
        """Delete ``key`` only if it was last written at ``mod_revision``.

        Returns the revision of the deletion, or None when the key is gone or was rewritten.
        """
        txn = self._client.transactions
        ok, responses = await self._call(
            "delete",
            self._client.transaction(
                compare=[txn.mod(key.encode()) == mod_revision],
                success=[txn.delete(key.encode())],
                failure=[],
            ),
        )
        if not ok:
            return None
        return int(responses[0].response_delete_range.header.revision)

    @contextlib.asynccontextmanager
    async def watch_prefix(self, prefix: str, start_revision: int) -> AsyncIterator[_Changes]:
        """Changes under ``prefix`` from ``start_revision`` on, for as long as the stream lives.

        Iterating raises ``EtcdUnavailable`` when the stream breaks and ``RevisionCompacted`` when
        ``start_revision`` is too old; aetcd does not resume, so the caller lists again and
        watches anew. Only creating the watch is under the call deadline, not waiting for changes.
        """
        watch = await self._call(
            "watch",
            self._client.watch_prefix(prefix.encode(), start_revision=start_revision),
        )
        changes = _Changes(watch.__aiter__())
        try:
            yield changes
        finally:
            await changes.aclose()
            with contextlib.suppress(RegistryError):
                await self._call("cancel watch", watch.cancel())

    # --- the boundary

    async def _call(self, operation: str, call: Awaitable[T]) -> T:
        with _translated(f"{operation} at {self.url}", self.timeout_s):
            async with asyncio.timeout(self.timeout_s):
                return await call


class _Changes:
    """Async iterator of ``Change`` over one aetcd watch stream."""

    def __init__(self, events: AsyncIterator[Any]) -> None:
        self._events = events

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Change:
        with _translated("watch", timeout_s=math.inf):
            event = await anext(self._events)
        entry = Entry.from_kv(event.kv)
        if event.kind == aetcd.EventKind.DELETE:
            return Change.delete(entry.key, entry.mod_revision)
        return Change.put(entry)

    async def aclose(self) -> None:
        aclose = getattr(self._events, "aclose", None)
        if aclose is not None:
            with _translated("watch", timeout_s=math.inf):
                await aclose()


@contextlib.contextmanager
def _translated(operation: str, timeout_s: float) -> Iterator[None]:
    """Turn aetcd's and gRPC's exceptions (and our deadline) into the ``RegistryError`` tree."""
    try:
        yield
    except TimeoutError:
        raise EtcdTimeout(operation, timeout_s) from None
    except (aetcd.ConnectionTimeoutError, aetcd.WatchTimeoutError):
        raise EtcdTimeout(operation, timeout_s) from None
    except aetcd.ConnectionFailedError as exc:
        raise EtcdUnavailable(operation, _detail(exc)) from exc
    except aetcd.RevisionCompactedError as exc:
        raise RevisionCompacted(operation, int(exc.compacted_revision)) from exc
    except aetcd.ClientError as exc:
        raise EtcdRequestError(operation, _detail(exc)) from exc
    except aetcd.rpc.AioRpcError as exc:  # from paths aetcd does not wrap (watch cancel, close)
        code = exc.code()
        if code in (aetcd.rpc.StatusCode.UNAVAILABLE, aetcd.rpc.StatusCode.CANCELLED):
            raise EtcdUnavailable(operation, str(exc.details())) from exc
        if code == aetcd.rpc.StatusCode.DEADLINE_EXCEEDED:
            raise EtcdTimeout(operation, timeout_s) from exc
        raise EtcdRequestError(operation, str(exc.details())) from exc


def _detail(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
