"""A job's proxies: which one a request goes through, and which are benched for failing.

``ProxyPool.pick(host)`` chooses among the proxies not benched: ``sticky`` gives a host the same
proxy while that one is healthy (rendezvous hashing over host and proxy, so benching one proxy
moves only its own hosts), ``round_robin`` takes the next in turn. A proxy that fails a request
(it refuses the connection, times out, answers 407 or cannot reach the site) is benched for
``backoff_s(failures, bench_s)``: the bench doubles with each failure in a row and a success
ends the streak. With every proxy benched there is none to use: the request waits for a retry.

Credentials come from the environment: a URL's ``${VARIABLE}`` password is resolved when the
pool is built. Only ``Proxy.label`` (``scheme://host:port``, no credentials) is ever logged.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from jetcrawl.contract.errors import SettingsError
from jetcrawl.plumbing.backoff import backoff_s

__all__ = ["PROXY_FAILURE_STATUSES", "Proxy", "ProxyPool", "resolve"]

log = logging.getLogger(__name__)

PROXY_FAILURE_STATUSES = frozenset({407})  # the proxy refused us, not the site
MAX_BENCH_S = 3600.0
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True, slots=True)
class Proxy:
    label: str  # scheme://host:port: what logs, metrics and tests see
    url: str = field(repr=False)  # with its credentials resolved: for the request only
    source: str = field(default="", repr=False)  # as the policy gives it (${VARIABLE} kept)


def resolve(url: str, env: Mapping[str, str] | None = None) -> Proxy:
    """The proxy ``url`` names, its ``${VARIABLE}`` references read from ``env``."""
    env = os.environ if env is None else env
    parts = urlsplit(url)
    label = f"{parts.scheme}://{parts.hostname}:{parts.port or _default_port(parts.scheme)}"

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in env:
            raise SettingsError(f"proxy {label}", f"environment variable {name} is not set")
        return env[name]

    return Proxy(label, _ENV_REF.sub(value, url), url)


class ProxyPool:
    def __init__(
        self,
        urls: Sequence[str],
        rotation: str,
        bench_s: float,
        env: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # --- configuration
        self.proxies = tuple(resolve(url, env) for url in urls)
        self._sticky = rotation == "sticky"
        self._bench_s = bench_s
        self._clock = clock
        # --- health: failures in a row, and until when a proxy is benched
        self._failures: Counter[str] = Counter()
        self._benched_until: dict[str, float] = {}
        # --- rotation and what each proxy carried (for tests and metrics)
        self._next = 0
        self.used: Counter[str] = Counter()
        self.benchings = 0

    def pick(self, host: str) -> Proxy | None:
        """The proxy for a request to ``host``; None when every one is benched."""
        now = self._clock()
        healthy = [p for p in self.proxies if self._benched_until.get(p.label, 0.0) <= now]
        if not healthy:
            return None
        if self._sticky:
            chosen = max(healthy, key=lambda p: _score(host, p.label))
        else:
            chosen = healthy[self._next % len(healthy)]
            self._next += 1
        self.used[chosen.label] += 1
        return chosen

    def failed(self, proxy: Proxy, why: str) -> None:
        self._failures[proxy.label] += 1
        bench = backoff_s(self._failures[proxy.label], self._bench_s, MAX_BENCH_S)
        self._benched_until[proxy.label] = self._clock() + bench
        self.benchings += 1
        log.warning("proxy %s benched for %.1f s: %s", proxy.label, bench, why)

    def succeeded(self, proxy: Proxy) -> None:
        if self._failures.pop(proxy.label, None):
            self._benched_until.pop(proxy.label, None)
            log.info("proxy %s is healthy again", proxy.label)

    def benched(self) -> list[str]:
        now = self._clock()
        return [label for label, until in self._benched_until.items() if until > now]

    def soonest_back_s(self) -> float:
        """How long until a benched proxy may be tried again (0 when one is healthy)."""
        now = self._clock()
        waits = [max(0.0, self._benched_until.get(p.label, 0.0) - now) for p in self.proxies]
        return min(waits, default=0.0)


def _score(host: str, label: str) -> int:
    digest = hashlib.blake2b(f"{host}\0{label}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def _default_port(scheme: str) -> int:
    return {"http": 80, "https": 443, "socks5": 1080}.get(scheme, 0)
