"""robots.txt by RFC 9309: fetched once per origin, cached, matched with protego.

``Robots.check(url)`` answers for a canonical URL from the rules of its origin
(``scheme://host[:port]``), fetching ``/robots.txt`` when the cache has no fresh entry:

    2xx               the file's rules for our product token        "allowed" / "disallowed"
    4xx (not 429),    no rules: everything is allowed               "no_robots"
    3xx left over, too many redirects, a bad redirect
    5xx, 429, network errors, unreadable responses: nothing is       "unavailable"
                      allowed for now; the task is retried later

Entries from a 2xx or a "no_robots" answer live ``FOUND_TTL_S`` (24 h, RFC 9309 section 2.4);
"unavailable" ones only ``UNAVAILABLE_TTL_S``, after which the next check fetches again. When a
refetch finds the file unreachable, the rules last read keep applying (section 2.4 allows a cached
copy to outlive 24 h while the file is unreachable), and the file is tried again after
``UNAVAILABLE_TTL_S``. At most ``MAX_ROBOTS_BYTES`` (500 KiB, the section 2.5 minimum) are
read and up to five redirects followed (section 2.3.1.2). Concurrent checks of one origin share
one fetch. The cache keeps the ``max_origins`` most recently used origins.

Crawl-delay is reported as the file gives it; capping it belongs to politeness.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from protego import Protego

from jetcrawl.contract.settings import Settings
from jetcrawl.worker.errors import FetchError
from jetcrawl.worker.fetcher import Fetcher

__all__ = [
    "FOUND_TTL_S",
    "MAX_ORIGINS",
    "MAX_ROBOTS_BYTES",
    "UNAVAILABLE_TTL_S",
    "Robots",
    "RobotsVerdict",
    "product_token",
]

log = logging.getLogger(__name__)

FOUND_TTL_S = 24 * 3600.0
UNAVAILABLE_TTL_S = 60.0
MAX_ROBOTS_BYTES = 500 * 1024
MAX_ORIGINS = 10_000

VerdictReason = Literal["allowed", "disallowed", "unavailable", "no_robots"]
# Fetch failures that mean "there is no robots.txt to be had here" rather than "try again". A
# robots.txt behind a refused address ("blocked") is one: the pages behind it are refused too.
_NO_ROBOTS_KINDS = frozenset({"too_many_redirects", "bad_redirect", "blocked"})


@dataclass(frozen=True, slots=True)
class RobotsVerdict:
    allowed: bool
    reason: VerdictReason
    crawl_delay_s: float | None
    detail: str = ""  # why robots.txt is unavailable ("dns: ...", "HTTP 503")


_NO_ROBOTS = RobotsVerdict(allowed=True, reason="no_robots", crawl_delay_s=None)


@dataclass(frozen=True, slots=True)
class _Entry:
    """What one origin's robots.txt says: ``rules`` if it was read, else ``verdict`` for all."""

    rules: Protego | None
    verdict: RobotsVerdict  # used when rules is None
    expires_at: float


class _Pending:
    """The checks waiting on one origin's fetch; the lock's holder fetches, the others reuse."""

    __slots__ = ("lock", "waiting")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.waiting = 0


def product_token(user_agent: str) -> str:
    """The robots.txt product token of a User-Agent: its first word before "/" ("jetcrawl")."""
    words = user_agent.split("/", 1)[0].split()
    return words[0] if words else user_agent


def origin_of(canonical_url: str) -> str:
    """``scheme://host[:port]`` of a canonical URL."""
    return canonical_url[: canonical_url.index("/", canonical_url.index("://") + 3)]


class Robots:
    def __init__(
        self,
        settings: Settings,
        fetcher: Fetcher,
        clock: Callable[[], float] = time.monotonic,
        *,
        max_origins: int = MAX_ORIGINS,
    ) -> None:
        self._fetcher = fetcher
        self._clock = clock
        self._token = product_token(settings.user_agent)
        # --- the cache: origin -> entry, least recently used first
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._max_origins = max_origins
        # --- origins being fetched, with the checks waiting for them
        self._pending: dict[str, _Pending] = {}
        self.fetches = 0  # robots.txt requests made (tests and metrics)

    async def check(self, url: str, user_agent: str | None = None) -> RobotsVerdict:
        """Whether robots.txt allows fetching ``url`` (canonical) to the product token of
        ``user_agent`` (a job's own; default: the worker's), the one the request will send."""
        origin = origin_of(url)
        entry = self._fresh(origin)
        if entry is None:
            entry = await self._refresh(origin)
        if entry.rules is None:
            return entry.verdict
        token = self._token if user_agent is None else product_token(user_agent)
        allowed = entry.rules.can_fetch(url, token)
        return RobotsVerdict(
            allowed=allowed,
            reason="allowed" if allowed else "disallowed",
            crawl_delay_s=entry.rules.crawl_delay(token),
        )

    def _fresh(self, origin: str) -> _Entry | None:
        entry = self._entries.get(origin)
        if entry is None or entry.expires_at <= self._clock():
            return None
        self._entries.move_to_end(origin)
        return entry

    async def _refresh(self, origin: str) -> _Entry:
        """A fresh entry for ``origin``: fetched here, or by a concurrent check we wait for."""
        pending = self._pending.get(origin)
        if pending is None:
            pending = self._pending[origin] = _Pending()
        pending.waiting += 1
        try:
            async with pending.lock:
                entry = self._fresh(origin)  # a check before us may have fetched it
                if entry is None:
                    entry = await self._fetch(origin)
                    self._store(origin, entry)
                return entry
        finally:
            pending.waiting -= 1
            if pending.waiting == 0:
                del self._pending[origin]

    async def _fetch(self, origin: str) -> _Entry:
        url = f"{origin}/robots.txt"
        self.fetches += 1
        try:
            status, text, _redirects = await self._fetcher.get_text(url, MAX_ROBOTS_BYTES)
        except FetchError as exc:
            if exc.kind in _NO_ROBOTS_KINDS:
                return self._verdict_entry(_NO_ROBOTS, FOUND_TTL_S)
            log.info("robots.txt of %s unavailable: %s", origin, exc)
            return self._unavailable(origin, f"{exc.kind}: {exc.message}")
        if 200 <= status < 300:
            rules = Protego.parse(text.removeprefix("\ufeff"))
            return _Entry(rules, _NO_ROBOTS, self._clock() + FOUND_TTL_S)
        if status == 429 or status >= 500:
            log.info("robots.txt of %s unavailable: HTTP %d", origin, status)
            return self._unavailable(origin, f"HTTP {status}")
        return self._verdict_entry(_NO_ROBOTS, FOUND_TTL_S)

    def _unavailable(self, origin: str, detail: str) -> _Entry:
        previous = self._entries.get(origin)
        if previous is not None and previous.verdict.reason != "unavailable":
            # Keep the rules last read; look again soon.
            return _Entry(previous.rules, previous.verdict, self._clock() + UNAVAILABLE_TTL_S)
        verdict = RobotsVerdict(
            allowed=False, reason="unavailable", crawl_delay_s=None, detail=detail
        )
        return self._verdict_entry(verdict, UNAVAILABLE_TTL_S)

    def _verdict_entry(self, verdict: RobotsVerdict, ttl_s: float) -> _Entry:
        return _Entry(None, verdict, self._clock() + ttl_s)

    def _store(self, origin: str, entry: _Entry) -> None:
        self._entries[origin] = entry
        self._entries.move_to_end(origin)
        while len(self._entries) > self._max_origins:
            self._entries.popitem(last=False)
