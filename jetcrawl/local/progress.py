"""The local crawl's progress: one updating line on a terminal, a log line every few seconds
otherwise."""

from __future__ import annotations

import logging
from typing import IO

from jetcrawl.local.drain import Snapshot
from jetcrawl.local.summary import Summary

log = logging.getLogger(__name__)

PROGRESS_LOG_EVERY_S = 5.0


class Progress:
    """One updating line on a terminal; a log line every few seconds otherwise."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._last_log = 0.0

    def show(self, snap: Snapshot, summary: Summary, elapsed: float) -> None:
        rate = summary.results / elapsed if elapsed > 0 else 0.0
        errors = summary.by_outcome.get("failed", 0)
        text = (
            f"pages {summary.results}  backlog {snap.task_backlog + snap.frontier_backlog}  "
            f"rate {rate:.1f}/s  errors {errors}  dead {snap.dead}"
        )
        if self._tty:
            self._stream.write(f"\r\x1b[K{text}")
            self._stream.flush()
        elif elapsed - self._last_log >= PROGRESS_LOG_EVERY_S:
            self._last_log = elapsed
            log.info("progress: %s", text)

    def done(self) -> None:
        if self._tty:
            self._stream.write("\n")
            self._stream.flush()
