"""Items as rows: the columns a file sink and an export write, as JSON lines, CSV or Parquet.

Every format has the same columns: the item's fields, its ``data`` (a JSON object; JSON text in
Parquet), and ``stream_seq``, its sequence in CRAWL_ITEMS. Parquet needs pyarrow, an optional
extra (``pip install 'jetcrawl[parquet]'``); without it, asking for Parquet is a one-line error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from jetcrawl.contract.items import Item
from jetcrawl.sinks.errors import SinkError

__all__ = ["COLUMNS", "jsonl_line", "parquet_table", "pyarrow_modules", "row"]

COLUMNS = (
    "job",
    "fp",
    "key",
    "url",
    "crawl_id",
    "source",
    "spec_version",
    "fetched_at",
    "trace_id",
    "data",
    "stream_seq",
)


def row(item: Item, seq: int) -> dict[str, Any]:
    """The item as one row, ``data`` still an object."""
    obj = item.to_obj()
    del obj["v"]
    obj["stream_seq"] = seq
    return obj


def jsonl_line(item: Item, seq: int) -> bytes:
    return orjson.dumps(row(item, seq)) + b"\n"


def pyarrow_modules(what: str) -> tuple[Any, Any]:
    """``(pyarrow, pyarrow.parquet)``, or a ``SinkError`` naming ``what`` asked for them."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise SinkError(what, "Parquet needs pyarrow: pip install 'jetcrawl[parquet]'") from None
    return pyarrow, pyarrow.parquet


def parquet_table(rows: Sequence[dict[str, Any]], what: str) -> Any:
    """A pyarrow Table of ``rows`` (from :func:`row`), ``data`` as JSON text."""
    pa, _ = pyarrow_modules(what)
    schema = pa.schema(
        [
            ("job", pa.string()),
            ("fp", pa.string()),
            ("key", pa.string()),
            ("url", pa.string()),
            ("crawl_id", pa.string()),
            ("source", pa.string()),
            ("spec_version", pa.int32()),
            ("fetched_at", pa.timestamp("us", tz="UTC")),
            ("trace_id", pa.string()),
            ("data", pa.string()),
            ("stream_seq", pa.int64()),
        ]
    )
    columns: dict[str, list[Any]] = {name: [] for name in COLUMNS}
    for r in rows:
        for name in COLUMNS:
            value = r[name]
            if name == "data":
                value = orjson.dumps(value).decode()
            elif name == "fetched_at":
                value = int(value * 1_000_000)
            columns[name].append(value)
    arrays = [pa.array(columns[name], type=schema.field(name).type) for name in COLUMNS]
    return pa.Table.from_arrays(arrays, schema=schema)
