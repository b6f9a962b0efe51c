"""The local crawl's progress: a live panel on a terminal (rich), a log line every few seconds
otherwise.

What it shows: pages and rate, the backlog, URLs without a page by cause, dead letters; hosts
that tasks wait on (for their politeness turn, or paused by a Retry-After) and the hand-backs
still due, from the workers' reports (KV ``crawl_workers``); and, once the crawl is down to its
tail, the URLs it still waits on and why. :func:`lines` decides all of it without I/O.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Any

from jetcrawl.contract.messages import WaitingOn, WorkerReport
from jetcrawl.local.drain import Snapshot
from jetcrawl.local.summary import Summary

log = logging.getLogger(__name__)

TAIL_BACKLOG = 16  # at most this many tasks left: show which URLs the crawl waits on
TAIL_SHOWN = 5
CAUSES_SHOWN = 4


@dataclass(frozen=True, slots=True)
class State:
    """What the progress is made of, at one moment."""

    snap: Snapshot
    summary: Summary
    elapsed_s: float
    reports: Sequence[WorkerReport]
    now: float  # unix time


def lines(state: State) -> list[str]:
    summary, snap = state.summary, state.snap
    rate = summary.results / state.elapsed_s if state.elapsed_s > 0 else 0.0
    backlog = snap.task_backlog + snap.frontier_backlog
    ranked = sorted(summary.causes.items(), key=lambda item: (-item[1].count, item[0]))
    errors = ", ".join(f"{kind} {cause.count}" for kind, cause in ranked[:CAUSES_SHOWN]) or "0"
    out = [
        f"pages {summary.results}  rate {rate:.1f}/s  backlog {backlog}  "
        f"no page: {errors}  dead {snap.dead}"
    ]
    waiting = sum(r.hosts_waiting for r in state.reports)
    paused = sum(r.hosts_paused for r in state.reports)
    due = sum(r.handbacks_due for r in state.reports)
    if waiting or due:
        text = f"hosts waiting {waiting}"
        if paused:
            text += f" ({paused} paused by Retry-After)"
        if due:
            last = max((r.furthest_due_at or 0.0) for r in state.reports)
            text += f"  handed back {due}, the last due in {max(0.0, last - state.now):.0f} s"
        out.append(text)
    if 0 < backlog <= TAIL_BACKLOG:
        tail = sorted((w for r in state.reports for w in r.waiting_on), key=lambda w: w.since)
        if tail:
            out.append("waiting on:")
            out += [f"  {w.url}  {_why(w, state.now)}" for w in tail[:TAIL_SHOWN]]
    return out


def _why(w: WaitingOn, now: float) -> str:
    text = f"{w.why} for {max(0.0, now - w.since):.0f} s"
    if w.due is not None:
        text += f", due in {max(0.0, w.due - now):.0f} s"
    return text


class Progress:
    """Shows :func:`lines` live on a terminal, or logs them every ``log_every_s``."""

    def __init__(self, stream: IO[str], log_every_s: float) -> None:
        self._stream = stream
        self._log_every_s = log_every_s
        self._last_log = -log_every_s
        self._live: Any = None  # rich's Live, on a terminal only: loaded when first shown

    def show(self, state: State) -> None:
        text = lines(state)
        if self._stream.isatty():
            self._show_live(text)
        elif state.elapsed_s - self._last_log >= self._log_every_s:
            self._last_log = state.elapsed_s
            log.info("progress: %s", "\n  ".join(text))

    def _show_live(self, text: list[str]) -> None:
        from rich.console import Console
        from rich.live import Live
        from rich.text import Text

        renderable = Text("\n".join(text))
        if self._live is None:
            console = Console(file=self._stream)
            self._live = Live(renderable, console=console, refresh_per_second=4)
            self._live.start()
        else:
            self._live.update(renderable)

    def done(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
