"""The local crawl's progress lines: counts, causes, hosts waiting, and the tail's URLs."""

from __future__ import annotations

import dataclasses
import io
import logging

import pytest

from jetcrawl.contract.messages import WaitingOn, WorkerReport
from jetcrawl.local.drain import Snapshot
from jetcrawl.local.progress import Progress, State, lines
from jetcrawl.local.summary import Cause, Summary

NOW = 1_800_000_000.0


def report(worker: str, **changes: object) -> WorkerReport:
    fields: dict[str, object] = {
        "worker": worker,
        "at": NOW,
        "held": 0,
        "waiting": 0,
        "handed_back": 0,
        "handbacks_due": 0,
        "furthest_due_at": None,
    }
    return WorkerReport(**(fields | changes))  # type: ignore[arg-type]


def state(backlog: int, *reports: WorkerReport) -> State:
    summary = Summary(results=120, by_outcome={"fetched": 117, "failed": 3})
    summary.causes = {"dns": Cause(2, "http://a.invalid/", "x"), "timeout": Cause(1, "u", "y")}
    snap = Snapshot((1, 2, 3, 4), frontier_backlog=0, task_backlog=backlog, results=120, dead=1)
    return State(snap, summary, elapsed_s=10.0, reports=reports, now=NOW)


def test_counts_and_causes_first() -> None:
    assert lines(state(40)) == [
        "pages 120  rate 12.0/s  backlog 40  no page: dns 2, timeout 1  dead 1"
    ]


def test_hosts_waiting_and_hand_backs_from_the_reports() -> None:
    shown = lines(
        state(
            40,
            report("w1", hosts_waiting=3, hosts_paused=1),
            report("w2", hosts_waiting=2, handbacks_due=4, furthest_due_at=NOW + 31),
        )
    )
    assert shown[1] == (
        "hosts waiting 5 (1 paused by Retry-After)  handed back 4, the last due in 31 s"
    )


def test_the_tail_names_the_urls_it_waits_on_longest_first() -> None:
    slow = WaitingOn("http://slow.test/drip", "fetching", since=NOW - 45)
    retry = WaitingOn("http://b.test/x", "retry 2 after timeout", since=NOW - 8, due=NOW + 12)
    shown = lines(state(2, report("w1", hosts_waiting=1, waiting_on=(retry, slow))))
    assert shown[-3:] == [
        "waiting on:",
        "  http://slow.test/drip  fetching for 45 s",
        "  http://b.test/x  retry 2 after timeout for 8 s, due in 12 s",
    ]
    assert "waiting on:" not in lines(state(40, report("w1", waiting_on=(slow,)))), "not a tail"


def test_without_a_terminal_it_logs_every_few_seconds(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="jetcrawl.local.progress")
    progress = Progress(io.StringIO(), log_every_s=5.0)
    for elapsed in (0.0, 2.0, 5.5):
        progress.show(dataclasses.replace(state(40), elapsed_s=elapsed))
    assert [r.message.split("  ")[0] for r in caplog.records] == ["progress: pages 120"] * 2
