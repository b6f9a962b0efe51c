"""Sinks: items and results from JetStream into storage (``jetcrawl sink NAME``).

api.py       the plugin interface: SinkPlugin, Sink, Record (version 1)
errors.py    the exception tree of the sinks
plugins.py   the sinks installed: entry points of group ``jetcrawl.sinks``
service.py   the durable consumers, acks after durability, pauses, dead letters
postgres.py  the PostgreSQL sink (asyncpg): upserts in one transaction per batch
pgschema.py  its tables as ordered migrations, and its upserts
files.py     the file sink: rolling JSON-lines or Parquet files, renamed when complete
rows.py      items as rows: the columns of the files and of ``jetcrawl results --items``
metrics.py   its Prometheus metrics and readiness, for ``--metrics-port``
"""

from jetcrawl.sinks.api import ITEMS, RESULTS, SINK_API_VERSION, Record, Sink, SinkPlugin
from jetcrawl.sinks.errors import SinkError, SinkRejected, SinkUnavailable

__all__ = [
    "ITEMS",
    "RESULTS",
    "SINK_API_VERSION",
    "Record",
    "Sink",
    "SinkError",
    "SinkPlugin",
    "SinkRejected",
    "SinkUnavailable",
]
