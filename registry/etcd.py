"""The etcd client: aetcd underneath, several endpoints with failover, TLS, a deadline on every
call, our own errors and record types.

aetcd 1.0 sets no call deadlines (a call to a paused or black-holed etcd waits forever), has no
keepalive loop, never restarts a watch after an error, talks to one endpoint and has no TLS. This
module fixes the deadlines, the endpoints and TLS at the one place every call passes through: each
call runs under ``asyncio.timeout(timeout_s)``, and aetcd's and gRPC's exceptions are translated
into the ``RegistryError`` tree there (see ``errors.py``). The keepalive loop and the watch restart
live in ``registry.py``, which owns the policy.

Endpoints (``etcd_url``, comma-separated) are members of one cluster. Calls go to one member at a
time; when it fails (unavailable or no answer in time) the next member becomes the current one, and
a call that failed fast (refused, or its stream cut) is tried there at once within the same
deadline, so a lease's keepalive goes on through another member. Only idempotent calls are: a
``create`` may have been applied before its stream broke, and its caller retries by reading.
aetcd was kept over etcd3aio (whose several endpoints must be IPv4 literals, no host names, and
which retries every call on a deadline, writes included) and over stubs generated anew from
etcd's protos (the same channel and stubs aetcd already has); the choice was made by
tests/test_etcd_cluster.py, which kills the member a worker's client uses.

TLS (``https://`` endpoints, or an ``etcd_tls_ca_file``): aetcd 1.0 only opens insecure channels,
so ``_TlsClient`` opens aetcd's stubs over a verifying ``grpc.aio.secure_channel`` instead.

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
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self, TypeVar
from urllib.parse import urlsplit

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")  # before grpc is imported: see above
# gRPC's own log lines (a failed TLS handshake, each reconnect) would go to the services' stderr
# beside ours; the failures reach our log through the calls, translated below.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import aetcd
import grpc
from aetcd import rpc, watcher

from jetcrawl.contract.settings import Settings, redact_urls
from jetcrawl.plumbing.tls import TlsFiles
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
    """A client of the etcd cluster at ``urls`` (``http(s)://host:port``, comma-separated): one
    member at a time, the next when it fails. An async context manager."""

    def __init__(self, urls: str, timeout_s: float, tls: TlsFiles | None = None) -> None:
        tls = tls if tls is not None and tls.configured else None
        self._members = [_member(url.strip(), tls) for url in urls.split(",") if url.strip()]
        if not self._members:
            raise RegistryError(f"etcd url {urls!r}: no endpoint")
        self._current = 0
        self.timeout_s = timeout_s

    @classmethod
    def from_settings(cls, settings: Settings, timeout_s: float | None = None) -> Etcd:
        """The client of ``settings.etcd_url`` with its TLS files and ``etcd_timeout_s``."""
        return cls(
            settings.etcd_url,
            settings.etcd_timeout_s if timeout_s is None else timeout_s,
            TlsFiles.etcd(settings),
        )

    @property
    def url(self) -> str:
        """The endpoint calls go to now."""
        return self._members[self._current].url

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
        """Close every member's channel; idempotent. Open watches end."""
        for member in self._members:
            with contextlib.suppress(RegistryError):
                await self._on(member, "close", lambda c: c.close())

    # --- leases

    async def grant_lease(self, ttl_s: float) -> int:
        """A new lease of ``ttl_s`` (rounded up to whole seconds, etcd's unit); returns its id."""
        lease = await self._call("grant lease", lambda c: c.lease(math.ceil(ttl_s)))
        return int(lease.id)

    async def keep_alive(self, lease: int) -> int:
        """Refresh ``lease`` once; returns its TTL in seconds, ``<= 0`` when the lease is gone."""
        reply = await self._call("keep alive", lambda c: c.refresh_lease(lease))
        if reply is None:
            raise EtcdUnavailable("keep alive", "the keepalive stream closed without an answer")
        return int(reply.TTL)

    async def revoke_lease(self, lease: int) -> bool:
        """Revoke ``lease`` and delete its keys; False if etcd no longer knows the lease."""
        try:
            await self._call("revoke lease", lambda c: c.revoke_lease(lease))
        except EtcdRequestError as exc:
            if "lease not found" in exc.detail:
                return False
            raise
        return True

    # --- keys

    async def get_prefix(self, prefix: str) -> Listing:
        result = await self._call("get prefix", lambda c: c.get_prefix(prefix.encode()))
        return Listing(
            entries=tuple(Entry.from_kv(kv) for kv in result.kvs),
            revision=int(result.header.revision),
        )

    async def put(self, key: str, value: bytes, lease: int = 0) -> Entry:
        """Put ``key``; returns the stored entry (its ``mod_revision`` is the put's revision)."""
        result = await self._call("put", lambda c: c.put(key.encode(), value, lease=lease))
        return Entry(key, value, int(result.header.revision), lease)

    async def create(self, key: str, value: bytes, lease: int) -> tuple[bool, Entry]:
        """Create ``key`` only if absent (create revision 0), in one transaction.

        Returns ``(True, the new entry)``, or ``(False, the entry that holds the key)``.
        """

        def txn(c: aetcd.Client) -> Awaitable[Any]:
            t = c.transactions
            return c.transaction(
                compare=[t.create(key.encode()) == 0],
                success=[t.put(key.encode(), value, lease=lease)],
                failure=[t.get(key.encode())],
            )

        ok, responses = await self._call("create", txn, again=False)
        if ok:
            revision = int(responses[0].response_put.header.revision)
            return True, Entry(key, value, revision, lease)
        (_, holder), *_ = responses[0]
        return False, Entry.from_kv(holder)

    async def delete_if(self, key: str, mod_revision: int) -> int | None:
        """Delete ``key`` only if it was last written at ``mod_revision``.

        Returns the revision of the deletion, or None when the key is gone or was rewritten.
        """

        def txn(c: aetcd.Client) -> Awaitable[Any]:
            t = c.transactions
            return c.transaction(
                compare=[t.mod(key.encode()) == mod_revision],
                success=[t.delete(key.encode())],
                failure=[],
            )

        ok, responses = await self._call("delete", txn)
        if not ok:
            return None
        return int(responses[0].response_delete_range.header.revision)

    @contextlib.asynccontextmanager
    async def watch_prefix(self, prefix: str, start_revision: int) -> AsyncIterator[_Changes]:
        """Changes under ``prefix`` from ``start_revision`` on, for as long as the stream lives.

        Iterating raises ``EtcdUnavailable`` when the stream breaks (the next call goes to the
        next member) and ``RevisionCompacted`` when ``start_revision`` is too old; aetcd does not
        resume, so the caller lists again and watches anew. Only creating the watch is under the
        call deadline, not waiting for changes.
        """
        member = self._members[self._current]
        watch = await self._call(
            "watch", lambda c: c.watch_prefix(prefix.encode(), start_revision=start_revision)
        )
        changes = _Changes(watch.__aiter__(), lambda: self._failed(member, "the watch broke"))
        try:
            yield changes
        finally:
            await changes.aclose()
            with contextlib.suppress(RegistryError):
                await self._on(member, "cancel watch", lambda c: watch.cancel())

    # --- the boundary

    async def _call(
        self, operation: str, call: Callable[[aetcd.Client], Awaitable[T]], *, again: bool = True
    ) -> T:
        """``call`` on the current member; on an unreachable one, ``again`` on the next members
        within the same deadline."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        tries = len(self._members)
        while True:
            member = self._members[self._current]
            try:
                return await self._on(member, operation, call, deadline)
            except EtcdUnavailable as exc:
                self._failed(member, exc.detail)
                tries -= 1
                # A member that failed fast (refused, or its stream cut) leaves time to try the
                # next; after a timeout the deadline is spent. Only idempotent calls go ``again``.
                failed_fast = not isinstance(exc, EtcdTimeout)
                if not (again and failed_fast and tries > 0 and loop.time() < deadline):
                    raise

    async def _on(
        self,
        member: _Member,
        operation: str,
        call: Callable[[aetcd.Client], Awaitable[T]],
        deadline: float | None = None,
    ) -> T:
        if deadline is None:
            deadline = asyncio.get_running_loop().time() + self.timeout_s
        with _translated(f"{operation} at {member.url}", self.timeout_s):
            async with asyncio.timeout_at(deadline):
                return await call(member.client)

    def _failed(self, member: _Member, why: str) -> None:
        """``member`` failed: calls go to the next one, if it was still the current one."""
        if len(self._members) == 1 or self._members[self._current] is not member:
            return
        self._current = (self._current + 1) % len(self._members)
        log.warning("etcd at %s failed (%s); now using %s", member.url, why, self.url)


@dataclass(frozen=True, slots=True)
class _Member:
    url: str  # as errors and logs show it: without a password
    client: aetcd.Client


def _member(url: str, tls: TlsFiles | None) -> _Member:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RegistryError(
            f"etcd url {redact_urls(url)!r}: expected http://host:port or https://host:port"
        )
    host, port = parts.hostname, parts.port or 2379
    shown = redact_urls(url)
    if parts.scheme == "http" and tls is None:
        return _Member(shown, aetcd.Client(host=host, port=port, options=CHANNEL_OPTIONS))
    if parts.scheme == "http":
        raise RegistryError(f"etcd url {shown!r}: TLS files are set, so use https://")
    ca, key, cert = (tls or TlsFiles("etcd")).pem()
    credentials = grpc.ssl_channel_credentials(ca, key, cert)
    return _Member(shown, _TlsClient(host, port, credentials))


class _TlsClient(aetcd.Client):
    """aetcd's client over a TLS channel: its ``connect`` with a secure channel (aetcd 1.0 opens
    only insecure ones); the stubs and the watcher are made as aetcd makes them."""

    def __init__(self, host: str, port: int, credentials: grpc.ChannelCredentials) -> None:
        super().__init__(host=host, port=port, options=CHANNEL_OPTIONS)
        self._credentials = credentials

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        self.channel = grpc.aio.secure_channel(
            f"{self._host}:{self._port}", self._credentials, options=list(CHANNEL_OPTIONS.items())
        )
        self.kvstub = rpc.KVStub(self.channel)
        self.clusterstub = rpc.ClusterStub(self.channel)
        self.leasestub = rpc.LeaseStub(self.channel)
        self.maintenancestub = rpc.MaintenanceStub(self.channel)
        self._watcher = watcher.Watcher(
            rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata
        )
        self._connected.set()


class _Changes:
    """Async iterator of ``Change`` over one aetcd watch stream; ``on_break`` when it breaks."""

    def __init__(self, events: AsyncIterator[Any], on_break: Callable[[], None]) -> None:
        self._events = events
        self._on_break = on_break

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Change:
        try:
            with _translated("watch", timeout_s=math.inf):
                event = await anext(self._events)
        except EtcdUnavailable:
            self._on_break()
            raise
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
    except aetcd.InternalError as exc:  # gRPC's INTERNAL: a stream cut by a member's death
        raise EtcdUnavailable(operation, _detail(exc)) from exc
    except aetcd.RevisionCompactedError as exc:
        raise RevisionCompacted(operation, int(exc.compacted_revision)) from exc
    except aetcd.ClientError as exc:
        raise EtcdRequestError(operation, _detail(exc)) from exc
    except aetcd.rpc.AioRpcError as exc:  # from paths aetcd does not wrap (watch cancel, close)
        code = exc.code()
        if code in (
            aetcd.rpc.StatusCode.UNAVAILABLE,
            aetcd.rpc.StatusCode.CANCELLED,
            aetcd.rpc.StatusCode.INTERNAL,
        ):
            raise EtcdUnavailable(operation, _detail(Exception(exc.details()))) from exc
        if code == aetcd.rpc.StatusCode.DEADLINE_EXCEEDED:
            raise EtcdTimeout(operation, timeout_s) from exc
        raise EtcdRequestError(operation, str(exc.details())) from exc


def _detail(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if match := _TLS_VERIFY_FAILED.search(text):
        return f"TLS: certificate verify failed: {match.group(1)}"
    return text


# gRPC's words for a server certificate that the CA does not vouch for
_TLS_VERIFY_FAILED = re.compile(r"CERTIFICATE_VERIFY_FAILED: ([^:]+)")
