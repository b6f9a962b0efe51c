"""Log lines as text (the default) or as JSON objects joined to traces.

With ``log_format`` ``json`` every line on stderr is one JSON object: time, level, logger,
message, the service and its instance (a worker's id), the exception when there is one, and
``trace_id`` / ``span_id`` when a span is current, so that a log line leads to its trace in
Jaeger. A collector (Loki, Elasticsearch, CloudWatch) reads it without a parser of its own.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson
from opentelemetry.trace import get_current_span

__all__ = ["TEXT_FORMAT", "JsonFormatter", "configure_logging", "set_service"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_FORMATS = ("text", "json")
_service: dict[str, str] = {}  # "service", "instance": known once the command is chosen


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **_service,
        }
        context = get_current_span().get_span_context()
        if context.is_valid:
            line["trace_id"] = f"{context.trace_id:032x}"
            line["span_id"] = f"{context.span_id:016x}"
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line).decode()


def configure_logging(level: str, log_format: str) -> None:
    """The root logger on stderr, as ``log_format`` says (``text`` or ``json``)."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}, got {log_format!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    logging.basicConfig(level=level.upper(), handlers=[handler])


def set_service(service: str, instance: str | None = None) -> None:
    """Name the service (and its instance) in every JSON line from now on."""
    _service["service"] = service
    if instance:
        _service["instance"] = instance
