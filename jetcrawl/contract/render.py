"""A render: what a worker asks the renderer service and what it answers (NATS request/reply).

A worker sends a ``RenderRequest`` on ``RENDER_SUBJECT`` (renderers take turns through the queue
group ``RENDER_QUEUE``) with the task's trace context in its headers, and waits for the
``RenderReply`` up to the request's ``timeout_s`` plus a margin. The request carries the HTML
the worker fetched, so the document is not fetched twice; every other request the page makes
is fetched by the renderer under the rules (robots.txt for ``user_agent``, ``delay_s`` between
requests to the page's host, the SSRF guard, no other host) and listed in the reply. An empty
request is a readiness probe, answered with an empty reply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Self

import orjson

from jetcrawl.contract.errors import MessageError
from jetcrawl.contract.wire import WIRE_VERSION, json_object, typed

__all__ = [
    "RENDER_QUEUE",
    "RENDER_SUBJECT",
    "SUBREQUEST_VERDICTS",
    "RenderReply",
    "RenderRequest",
    "SubRequest",
]

RENDER_SUBJECT: Final = "crawl.render"
RENDER_QUEUE: Final = "renderers"
# What became of a request the page made: fetched, or refused and why.
SUBREQUEST_VERDICTS = (
    "fetched",
    "robots",  # robots.txt disallows it for the User-Agent sent
    "ssrf",  # the SSRF guard refused its address
    "other_host",  # not the page's host: never fetched by a render
    "resource_type",  # an image, font or media file: not needed for links
    "method",  # not a GET: a render reads, it never posts
    "failed",  # no response (timeout, connection refused, ...)
    "over_limit",  # the render's time or request budget was spent
)


@dataclass(frozen=True, slots=True)
class RenderRequest:
    url: str  # canonical, the page's URL (its host is the only one the render may reach)
    html: str  # the served document, decoded
    user_agent: str
    delay_s: float  # between the starts of two requests to the page's host
    timeout_s: float  # the whole render; then the page is closed and the render fails
    proxy: str | None = None  # a proxy URL as the policy gives it (${VARIABLE} credentials)

    def to_wire(self) -> bytes:
        return orjson.dumps(
            {
                "v": WIRE_VERSION,
                "url": self.url,
                "html": self.html,
                "user_agent": self.user_agent,
                "delay_s": self.delay_s,
                "timeout_s": self.timeout_s,
                "proxy": self.proxy,
            }
        )

    @classmethod
    def from_wire(cls, data: bytes) -> Self:
        obj = json_object(data)
        timeout_s = float(typed(obj, "timeout_s", (int, float)))
        delay_s = float(typed(obj, "delay_s", (int, float)))
        if timeout_s <= 0 or delay_s < 0:
            raise MessageError("wrong_type", "timeout_s must be > 0 and delay_s >= 0")
        return cls(
            url=typed(obj, "url", str),
            html=typed(obj, "html", str),
            user_agent=typed(obj, "user_agent", str),
            delay_s=delay_s,
            timeout_s=timeout_s,
            proxy=typed(obj, "proxy", str, optional=True),
        )


@dataclass(frozen=True, slots=True)
class SubRequest:
    url: str
    verdict: str  # one of SUBREQUEST_VERDICTS
    status: int | None = None  # of a fetched one


@dataclass(frozen=True, slots=True)
class RenderReply:
    url: str
    dom: str | None  # the page's DOM as serialised after the render; None when it failed
    requests: tuple[SubRequest, ...]
    elapsed_ms: float
    error: str | None = None  # "timeout: ...", "too_large: ...", "browser: ..."

    def to_wire(self) -> bytes:
        return orjson.dumps(
            {
                "v": WIRE_VERSION,
                "url": self.url,
                "dom": self.dom,
                "requests": [[r.url, r.verdict, r.status] for r in self.requests],
                "elapsed_ms": self.elapsed_ms,
                "error": self.error,
            }
        )

    @classmethod
    def from_wire(cls, data: bytes) -> Self:
        obj = json_object(data)
        requests = []
        for entry in typed(obj, "requests", list):
            if not (
                isinstance(entry, list)
                and len(entry) == 3
                and isinstance(entry[0], str)
                and entry[1] in SUBREQUEST_VERDICTS
                and (entry[2] is None or isinstance(entry[2], int))
            ):
                raise MessageError("wrong_type", f"requests entry {str(entry)[:100]}")
            requests.append(SubRequest(entry[0], entry[1], entry[2]))
        dom = typed(obj, "dom", str, optional=True)
        error = typed(obj, "error", str, optional=True)
        if (dom is None) == (error is None):
            raise MessageError("wrong_type", "a reply has a dom or an error, not both")
        return cls(
            url=typed(obj, "url", str),
            dom=dom,
            requests=tuple(requests),
            elapsed_ms=float(typed(obj, "elapsed_ms", (int, float))),
            error=error,
        )
