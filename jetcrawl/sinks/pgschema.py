"""The PostgreSQL sink's tables, as ordered migrations, and the statements that upsert into them.

Schema ``jetcrawl``: ``schema_version`` (one row per migration applied), ``items`` keyed by
``(job, fp, key)`` and ``results`` keyed by ``(job, fp)``. A migration is plain SQL appended to
:data:`MIGRATIONS`, never edited once released: at start the sink applies, in one transaction
under an advisory lock (two sinks starting together do not race), every one past the version the
database has. A database newer than this jetcrawl is refused rather than written wrongly.

Upserts: a record replaces the stored one only when it comes from another crawl of the page and
is not older (``fetched_at``): a re-crawl replaces, a redelivery changes nothing.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "MIGRATIONS",
    "SCHEMA",
    "UPSERT_ITEM",
    "UPSERT_RESULT",
    "SchemaTooNew",
    "migrate",
]

SCHEMA = "jetcrawl"
_LOCK_KEY = 0x6A6574637261776C  # "jetcrawl": pg_advisory_xact_lock's key for migrations

MIGRATIONS: tuple[str, ...] = (
    # 1: items and results
    f"""
    CREATE TABLE {SCHEMA}.items (
        job          text NOT NULL,
        fp           text NOT NULL,
        key          text NOT NULL,
        url          text NOT NULL,
        crawl_id     text NOT NULL,
        source       text NOT NULL,
        spec_version integer NOT NULL,
        data         jsonb NOT NULL,
        fetched_at   timestamptz,
        trace_id     text,
        stream_seq   bigint NOT NULL,
        written_at   timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (job, fp, key)
    );
    CREATE TABLE {SCHEMA}.results (
        job          text NOT NULL,
        fp           text NOT NULL,
        url          text NOT NULL,
        outcome      text NOT NULL,
        status       integer,
        title        text,
        fetched_at   timestamptz,
        record       jsonb NOT NULL,
        stream_seq   bigint NOT NULL,
        written_at   timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (job, fp)
    );
    """,
)

UPSERT_ITEM = f"""
INSERT INTO {SCHEMA}.items AS t
    (job, fp, key, url, crawl_id, source, spec_version, data, fetched_at, trace_id, stream_seq)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, to_timestamp($9), $10, $11)
ON CONFLICT (job, fp, key) DO UPDATE SET
    url = EXCLUDED.url, crawl_id = EXCLUDED.crawl_id, source = EXCLUDED.source,
    spec_version = EXCLUDED.spec_version, data = EXCLUDED.data, fetched_at = EXCLUDED.fetched_at,
    trace_id = EXCLUDED.trace_id, stream_seq = EXCLUDED.stream_seq, written_at = now()
WHERE t.crawl_id <> EXCLUDED.crawl_id AND t.fetched_at <= EXCLUDED.fetched_at
"""

UPSERT_RESULT = f"""
INSERT INTO {SCHEMA}.results AS t
    (job, fp, url, outcome, status, title, fetched_at, record, stream_seq)
VALUES ($1, $2, $3, $4, $5, $6, to_timestamp($7), $8::jsonb, $9)
ON CONFLICT (job, fp) DO UPDATE SET
    url = EXCLUDED.url, outcome = EXCLUDED.outcome, status = EXCLUDED.status,
    title = EXCLUDED.title, fetched_at = EXCLUDED.fetched_at, record = EXCLUDED.record,
    stream_seq = EXCLUDED.stream_seq, written_at = now()
WHERE t.stream_seq <> EXCLUDED.stream_seq AND t.fetched_at <= EXCLUDED.fetched_at
"""


class SchemaTooNew(Exception):
    """The database's schema is newer than this jetcrawl knows."""

    def __init__(self, found: int, known: int) -> None:
        super().__init__(
            f"its jetcrawl schema is at version {found}, this jetcrawl knows up to {known}: "
            "upgrade jetcrawl"
        )
        self.found = found
        self.known = known


async def migrate(conn: Any) -> tuple[int, int]:
    """Bring the schema to the latest version over ``conn`` (an asyncpg connection);
    (version before, version after)."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {SCHEMA}.schema_version ("
            "version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        before = await conn.fetchval(
            f"SELECT coalesce(max(version), 0) FROM {SCHEMA}.schema_version"
        )
        if before > len(MIGRATIONS):
            raise SchemaTooNew(before, len(MIGRATIONS))
        for version, sql in enumerate(MIGRATIONS[before:], start=before + 1):
            await conn.execute(sql)
            await conn.execute(
                f"INSERT INTO {SCHEMA}.schema_version (version) VALUES ($1)", version
            )
    return before, len(MIGRATIONS)
