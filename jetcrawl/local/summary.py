"""What a local crawl did, for its last lines: counts, and why URLs gave no page.

A cause is a failed fetch's error kind (``dns``, ``refused``, ``blocked``, ``timeout``, ...), a
robots.txt denial, or an HTTP error status; each is counted with its first example, and
:func:`fix_for` says what to change where a flag can (the SSRF guard's ``--allow-net``).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

from jetcrawl.contract.messages import ResultHead

__all__ = ["Cause", "Summary", "fix_for"]

TOP_CAUSES = 5
# "SSRF guard refused 127.0.0.2:8080 (loopback)", as the worker's fetcher words it
_REFUSED = re.compile(r"refused \[?([0-9A-Fa-f:.]+?)\]?:\d+ \((\w+)\)")
_SHARED_NETS = tuple(
    ipaddress.ip_network(cidr)
    for cidr in (
        *("127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"),
        *("::1/128", "fc00::/7", "fe80::/10"),
    )
)


@dataclass(slots=True)
class Cause:
    count: int
    url: str  # the first URL that failed so
    message: str  # and what its record says


@dataclass(slots=True)
class Summary:
    results: int = 0
    duplicates: int = 0
    by_outcome: dict[str, int] = field(default_factory=dict)
    by_status_class: dict[str, int] = field(default_factory=dict)
    dead_letters: int = 0
    dead_reasons: dict[str, int] = field(default_factory=dict)  # "stage/reason" -> count
    seconds: float = 0.0
    restarts: int = 0  # services that died and were started again
    causes: dict[str, Cause] = field(default_factory=dict)  # why URLs gave no page, by cause

    @property
    def fetched(self) -> int:
        return self.by_outcome.get("fetched", 0)

    def count(self, head: ResultHead) -> None:
        """One URL's first result."""
        self.results += 1
        self.by_outcome[head.outcome] = self.by_outcome.get(head.outcome, 0) + 1
        if head.status is not None:
            key = f"{head.status // 100}xx"
            self.by_status_class[key] = self.by_status_class.get(key, 0) + 1
        cause = _cause(head)
        if cause is not None:
            kind, message = cause
            if kind in self.causes:
                self.causes[kind].count += 1
            else:
                self.causes[kind] = Cause(1, head.url, message)

    def cause_lines(self, top: int = TOP_CAUSES) -> list[str]:
        """The commonest causes, each with its count, one example, and the fix if there is one:
        ``blocked 3: http://127.0.0.2/: SSRF guard refused ... (pass --allow-net 127.0.0.0/8)``."""
        ranked = sorted(self.causes.items(), key=lambda item: (-item[1].count, item[0]))
        lines = []
        for kind, cause in ranked[:top]:
            fix = fix_for(kind, cause.message)
            lines.append(
                f"{kind} {cause.count}: {cause.url}: {cause.message}" + (f" ({fix})" if fix else "")
            )
        if len(ranked) > top:
            lines.append(f"... and {len(ranked) - top} more causes")
        return lines

    def line(self) -> str:
        rate = self.results / self.seconds if self.seconds else 0.0
        parts = [f"crawled {self.results} URLs in {self.seconds:.1f} s ({rate:.1f}/s)"]
        if self.by_outcome:
            parts.append(", ".join(f"{k} {v}" for k, v in sorted(self.by_outcome.items())))
        if self.by_status_class:
            statuses = ", ".join(f"{k} {v}" for k, v in sorted(self.by_status_class.items()))
            parts.append(f"status {statuses}")
        dead = sum(self.dead_reasons.values()) or self.dead_letters
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(self.dead_reasons.items()))
        parts.append(f"dead letters {dead}" + (f" ({reasons})" if reasons else ""))
        parts.append(f"duplicate results {self.duplicates}")
        if self.restarts:
            parts.append(f"services restarted {self.restarts}")
        return "; ".join(parts)


def _cause(head: ResultHead) -> tuple[str, str] | None:
    """Why this URL gave no page (kind, message), or None if it gave one."""
    if head.outcome in ("failed", "blocked", "skipped"):
        error = head.error
        return (error.kind, error.message) if error else ("failed", "no error recorded")
    if head.outcome == "robots_disallowed":
        return "robots_disallowed", "robots.txt disallows it"
    if head.status is not None and head.status >= 400:
        return f"http_{head.status}", f"the server answered HTTP {head.status}"
    return None


def fix_for(kind: str, message: str) -> str | None:
    """The flag that would let such a URL through, where one would."""
    if kind == "unwanted_type":
        return "a job spec's content_types (e.g. '*/*') reads it"
    if kind != "blocked":
        return None
    match = _REFUSED.search(message)
    if match is None:
        return "pass --allow-net CIDR to let the crawl reach that network"
    try:
        ip = ipaddress.ip_address(match.group(1))
    except ValueError:
        return "pass --allow-net CIDR to let the crawl reach that network"
    if match.group(2) == "mesh_endpoint":
        return "that is the mesh's own NATS or etcd: never crawled"
    net = next((n for n in _SHARED_NETS if ip in n), None)
    if net is None:
        net = ipaddress.ip_network(f"{ip}/{ip.max_prefixlen}")
    return f"{ip} is {match.group(2).replace('_', ' ')}: pass --allow-net {net}"
