"""Retry as a pure function of the failure and the attempt.

A failure is a fetch error's kind or a response's status. Worth another attempt: timeouts,
connection and DNS errors (the transient kinds of :mod:`jetcrawl.worker.errors`), robots.txt
unavailable, 5xx, 408 and 429. Anything else (other 4xx, robots denials, non-HTML, too large,
blocked, bad redirects) is recorded once. ``attempt`` is the task's attempt number, 1 for the
first: JetStream's delivery count less the politeness hand-backs
(:mod:`jetcrawl.worker.politeness`), which are not attempts.

The delay doubles per attempt from ``base_s`` up to ``max_s``, with full jitter in its upper half;
a server's ``Retry-After`` (429, 503) raises it to at least what the server asked, capped. A URL
has a budget in attempts (``max_attempts``) and in time (``budget_s``, from its first attempt):
a retry that would begin past the budget is not made, so one dripping server costs a crawl a
few minutes of tail, not ten.
"""

from __future__ import annotations

import email.utils
import math
import random
from dataclasses import dataclass

from jetcrawl.plumbing.backoff import backoff_s
from jetcrawl.worker.errors import TRANSIENT_KINDS

__all__ = ["RETRY_STATUSES", "Backoff", "retry_after_s", "retry_delay", "retryable"]

RETRY_STATUSES = frozenset({408, 429})  # and every 5xx
ROBOTS_UNAVAILABLE = "robots_unavailable"
# A soft block is retried only when its job's policy says on_block: retry (worker/crawl.py).
SOFT_BLOCK = "soft_block"
RETRY_KINDS = TRANSIENT_KINDS | {ROBOTS_UNAVAILABLE, SOFT_BLOCK}


@dataclass(frozen=True, slots=True)
class Backoff:
    max_attempts: int  # the last attempt's number (the tasks' max_deliver)
    base_s: float = 1.0
    max_s: float = 60.0
    budget_s: float = math.inf  # no retry begins later than this after the first attempt


def retryable(*, kind: str | None = None, status: int | None = None) -> bool:
    """Whether a failure of this kind (fetch error) or status (response) may pass on retry."""
    if kind is not None:
        return kind in RETRY_KINDS
    return status is not None and (status in RETRY_STATUSES or 500 <= status < 600)


def retry_delay(
    attempt: int,
    backoff: Backoff,
    *,
    kind: str | None = None,
    status: int | None = None,
    retry_after: float | None = None,
    spent_s: float = 0.0,
    rng: random.Random | None = None,
) -> float | None:
    """Seconds to wait before the next attempt, or None when this failure is final;
    ``spent_s``: time since the URL's first attempt began."""
    if not retryable(kind=kind, status=status) or attempt >= backoff.max_attempts:
        return None
    delay = backoff_s(attempt, backoff.base_s, backoff.max_s, jitter=0.5, rng=rng)
    if retry_after is not None:
        delay = max(delay, retry_after)
    if spent_s + delay > backoff.budget_s:
        return None
    return delay


def retry_after_s(value: str | None, now: float, cap_s: float) -> float | None:
    """A ``Retry-After`` header (delay-seconds or an HTTP-date) as seconds from ``now``, capped.

    ``now`` is epoch seconds; a date in the past is 0; an unreadable value is None.
    """
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return min(float(value), cap_s)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; a bare one is read as such
        return None
    return min(max(0.0, when.timestamp() - now), cap_s)
