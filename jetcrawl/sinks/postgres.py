"""``jetcrawl sink postgres``: items and results upserted into PostgreSQL with asyncpg.

One connection, one transaction per batch; the batch is durable when the transaction commits,
and only then is it acked. asyncpg's errors are translated here, once: a connection that is
refused, reset, closed, timed out or told the server is shutting down is
:class:`~jetcrawl.sinks.errors.SinkUnavailable` (the service pauses and retries), a value the
database cannot store (a NUL character in JSON text, say) is
:class:`~jetcrawl.sinks.errors.SinkRejected`, and a wrong password, user or database at start is
a :class:`~jetcrawl.sinks.errors.SinkError` (exit 2). An unreachable database at start is waited
for: the sink is a service. The DSN's password is in no log line and no repr (:func:`masked`).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import orjson

from jetcrawl.contract.settings import Secret, Settings
from jetcrawl.sinks.api import ITEMS, RESULTS, SINK_API_VERSION, Record, SinkPlugin
from jetcrawl.sinks.errors import SinkError, SinkRejected, SinkUnavailable
from jetcrawl.sinks.pgschema import SCHEMA, UPSERT_ITEM, UPSERT_RESULT, SchemaTooNew, migrate

if TYPE_CHECKING:
    import asyncpg

__all__ = ["PLUGIN", "PostgresSink", "masked"]

log = logging.getLogger(__name__)

_SCHEMES = ("postgresql", "postgres")


def masked(dsn: str) -> str:
    """``dsn`` with its password (in the authority or a ``password=`` parameter) as ``***``."""
    parts = urlsplit(dsn)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user, sep, _ = userinfo.partition(":")
        netloc = f"{user}:***@{hostport}" if sep else f"{user}@{hostport}"
    query = "&".join(
        "password=***" if pair.split("=", 1)[0].lower() == "password" else pair
        for pair in parts.query.split("&")
        if pair
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def server_of(dsn: str) -> str:
    """host:port/database of ``dsn``: how an error names the database."""
    parts = urlsplit(dsn)
    host = parts.hostname or "localhost"
    return f"{host}:{parts.port or 5432}{parts.path or '/'}"


class PostgresSink:
    """Upserts batches of items and results; see the module docstring."""

    def __init__(self, dsn: Secret, timeout_s: float) -> None:
        if urlsplit(dsn).scheme not in _SCHEMES:
            raise SinkError("--dsn", "not a postgresql:// URL (postgresql://user:pass@host/db)")
        self._dsn = dsn
        self._timeout_s = timeout_s
        self._conn: asyncpg.Connection | None = None

    def __repr__(self) -> str:
        return f"PostgresSink({masked(self._dsn)!r})"

    def describe(self) -> str:
        return f"PostgreSQL at {masked(self._dsn)}"

    async def open(self) -> None:
        conn = await self._connection()
        try:
            before, after = await migrate(conn)
        except SchemaTooNew as e:
            raise SinkError(f"PostgreSQL at {server_of(self._dsn)}", str(e)) from None
        except Exception as e:
            import asyncpg

            if isinstance(e, asyncpg.InsufficientPrivilegeError):  # no CREATE on the database
                raise SinkError(
                    f"PostgreSQL at {server_of(self._dsn)}",
                    f"cannot create or migrate schema {SCHEMA}: {_first_line(e)}",
                ) from None
            raise await self._translated(e) from e
        if before != after:
            log.info(
                "PostgreSQL at %s: schema migrated from version %d to %d",
                server_of(self._dsn),
                before,
                after,
            )

    async def write(self, records: Sequence[Record]) -> Sequence[Record]:
        if not records:
            return records
        items = [_item_row(r) for r in records if r.kind == ITEMS]
        results = [_result_row(r) for r in records if r.kind == RESULTS]
        conn = await self._connection()
        try:
            async with conn.transaction():
                if items:
                    await conn.executemany(UPSERT_ITEM, items)
                if results:
                    await conn.executemany(UPSERT_RESULT, results)
        except Exception as e:
            raise await self._translated(e) from e
        return records

    async def flush(self) -> Sequence[Record]:
        return ()  # nothing held: every write commits

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            try:
                await conn.close(timeout=self._timeout_s)
            except Exception:  # a dead server: let the connection go without its goodbye
                conn.terminate()

    async def _connection(self) -> asyncpg.Connection:
        if self._conn is not None and not self._conn.is_closed():
            return self._conn
        import asyncpg

        where = f"PostgreSQL at {server_of(self._dsn)}"
        try:
            self._conn = await asyncpg.connect(
                str(self._dsn), timeout=self._timeout_s, command_timeout=self._timeout_s
            )
        except (
            asyncpg.InvalidAuthorizationSpecificationError,  # wrong user or password
            asyncpg.InvalidCatalogNameError,  # no such database
        ) as e:
            raise SinkError(where, _first_line(e)) from None
        except Exception as e:
            raise await self._translated(e) from e
        return self._conn

    async def _translated(self, e: Exception) -> Exception:
        """``e`` as a sink error, or ``e`` itself when it is a bug; a broken connection is
        dropped, to be made anew on the next write."""
        import asyncpg

        where = f"PostgreSQL at {server_of(self._dsn)}"
        if isinstance(e, asyncpg.DataError | asyncpg.ProgramLimitExceededError):
            return SinkRejected(where, _first_line(e))
        broken = self._conn is None or self._conn.is_closed()
        if broken or isinstance(
            e,
            OSError
            | TimeoutError
            | asyncpg.PostgresConnectionError
            | asyncpg.OperatorInterventionError
            | asyncpg.InsufficientResourcesError,
        ):
            if self._conn is not None:
                self._conn.terminate()
                self._conn = None
            return SinkUnavailable(where, _first_line(e) or type(e).__name__)
        return e


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def _item_row(record: Record) -> tuple[Any, ...]:
    item = record.item
    assert item is not None
    return (
        item.job,
        item.fp,
        item.key,
        item.url,
        item.crawl_id,
        item.source,
        item.spec_version,
        orjson.dumps(dict(item.data)).decode(),
        item.fetched_at,
        item.trace_id,
        record.seq,
    )


def _result_row(record: Record) -> tuple[Any, ...]:
    result = record.result
    assert result is not None
    return (
        result.job,
        result.fp,
        result.url,
        result.outcome,
        result.status,
        result.title,
        result.fetched_at,
        record.raw.decode(),
        record.seq,
    )


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dsn",
        help="postgresql://user:password@host:port/database (default: JETCRAWL_SINK_DSN)",
    )


def _create(args: argparse.Namespace, settings: Settings) -> PostgresSink:
    dsn = Secret(args.dsn) if args.dsn else settings.sink_dsn
    if not dsn:
        raise SinkError("--dsn", "no database given (--dsn, or JETCRAWL_SINK_DSN)")
    return PostgresSink(dsn, settings.sink_db_timeout_s)


PLUGIN = SinkPlugin(
    api_version=SINK_API_VERSION,
    summary="upsert items and results into PostgreSQL",
    kinds=frozenset({ITEMS, RESULTS}),
    add_arguments=_add_arguments,
    create=_create,
)
