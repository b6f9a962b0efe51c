"""The synthetic site before it has ports: its URLs, what answers them, and its exact crawl.

A ``Site`` is drawn once from a seed (``tree.py`` for the benchmark, ``levels.py`` for the tests)
and holds no port: a ``Loc`` is a host index and a canonical path+query. Given the hosts'
authorities (``"127.0.0.N:PORT"``, one per host), ``responses`` renders every answer and
``expected`` says what a correct crawl finds: a BFS from the seeds over the drawn links that does
not expand robots-disallowed URLs. Both servers answer from ``responses`` (the tests'
``MultiHostSite`` in-process, the benchmark's ``bench.siteserver`` processes), so the two suites
crawl pages written by one renderer and are checked by one answer.

Links are written in every form a crawler must canonicalize: absolute, scheme-relative, rooted,
relative (to the page or its ``<base href>``), with dot segments, ``#fragments``, tracking
parameters, the query unsorted, an upper-case scheme, a percent-encoded digit; or not http at all
(``raw``: ``mailto:``, ``javascript:``, ``tel:``, ``#top``, the empty href).

``expected(..., skip_binaries=True)`` is the crawl of a crawler that does not follow links whose
path ends in one of ``BINARY_EXTENSIONS`` (as Scrapy's LinkExtractor does by default, comparing
the lower-case path's end): it fetches
neither those URLs nor anything only they lead to.
"""

from __future__ import annotations

import html
import posixpath
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "BINARY_EXTENSIONS",
    "DISALLOWED_PREFIX",
    "ROBOTS_TXT",
    "TRACKING_PARAMS",
    "Entry",
    "Expected",
    "Kind",
    "Link",
    "Loc",
    "Scope",
    "Site",
    "is_binary",
]

ROBOTS_TXT = b"User-agent: *\nDisallow: /private/\n"
DISALLOWED_PREFIX = "/private/"
TRACKING_PARAMS = frozenset({"utm_source", "utm_medium", "utm_campaign", "fbclid", "gclid"})
# Every extension the sites give their non-HTML files; each is in Scrapy's IGNORED_EXTENSIONS
# and in jetcrawl's default list (tests/test_filetypes.py), which a default crawl skips.
BINARY_EXTENSIONS = (".pdf", ".png", ".jpg", ".gif", ".webp", ".zip", ".tar.gz", ".mp4")
DIRECTORIES = 8  # the "dotted" form climbs out of /sD/ with D = host % DIRECTORIES

# page: public HTML; file: not HTML, never parsed; private: HTML under DISALLOWED_PREFIX;
# hidden: HTML that only private pages link.
Kind = Literal["page", "file", "redirect", "missing", "private", "hidden"]
Form = Literal["absolute", "scheme-relative", "rooted", "relative", "dotted"]
Scope = Literal["host", "any"]


@dataclass(frozen=True, slots=True, order=True)
class Loc:
    """A URL before ports are known: host index and canonical path+query."""

    host: int
    key: str

    @property
    def path(self) -> str:
        return self.key.partition("?")[0]

    @property
    def query(self) -> str:
        return self.key.partition("?")[2]


@dataclass(frozen=True, slots=True)
class Link:
    """One ``<a href>``: where it points (None: not an http link) and how the href is written."""

    target: Loc | None  # None: written verbatim as ``raw``
    form: Form = "rooted"
    fragment: str = ""
    tracking: tuple[tuple[str, str], ...] = ()
    unsorted: bool = False
    upper_scheme: bool = False
    escaped_digit: bool = False
    raw: str = ""


@dataclass(slots=True)
class Entry:
    """What one URL answers."""

    loc: Loc
    kind: Kind
    links: list[Link] = field(default_factory=list)  # HTML pages only
    base: str | None = None  # an HTML page's <base href> (a directory path)
    text: str = ""  # an HTML page's paragraphs, as HTML
    level: int = -1  # the depth a levelled drawing put a public page at; -1 otherwise
    status: int = 200
    redirect: Loc | None = None  # a redirect's target ...
    absolute: bool = False  # ... and whether its Location is a URL (else a path)
    content_type: str = ""  # a file's type and bytes
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class Expected:
    """The correct crawl, as canonical URLs."""

    seeds: tuple[str, ...]
    fetchable: dict[str, int]  # URL -> the status the server answers, in BFS order
    disallowed: frozenset[str]  # robots-blocked URLs that fetched pages link
    html_pages: frozenset[str]  # the fetchable URLs whose links a crawler extracts
    links: frozenset[str]  # every canonical http URL fetched pages and redirects point at
    page_links: frozenset[str]  # ... that fetched HTML pages point at (redirects left out)
    depths: dict[str, int]  # every URL above -> its BFS link depth (seeds 0), by depth

    @property
    def reachable(self) -> frozenset[str]:
        return frozenset(self.fetchable) | self.disallowed


def is_binary(loc: Loc) -> bool:
    """Whether a link to ``loc`` is one a crawler skipping binaries by extension drops."""
    return loc.path.lower().endswith(BINARY_EXTENSIONS)


class Site:
    """A drawn site: ``entries`` by location, crawled from ``seeds``."""

    def __init__(
        self,
        hosts: int,
        entries: dict[Loc, Entry],
        seeds: tuple[Loc, ...],
        delays_s: dict[int, float] | None = None,
    ) -> None:
        self.hosts = hosts
        self.entries = entries
        self.seeds = seeds
        self.delays_s = delays_s or {}  # host -> the fixed delay of each of its answers

    # ------------------------------------------------------------------ the answer

    def url(self, loc: Loc, authorities: list[str]) -> str:
        return f"http://{authorities[loc.host]}{loc.key}"

    def expected(
        self,
        authorities: list[str],
        seeds: Iterable[Loc] | None = None,
        scope: Scope = "any",
        max_depth: int | None = None,
        skip_binaries: bool = False,
    ) -> Expected:
        """The crawl from ``seeds`` (default: the site's) over the links, not expanding
        robots-disallowed URLs, nor pages at ``max_depth``; scope "host" drops every link to
        another host than the one it is on; ``skip_binaries`` drops every link whose path ends in
        one of ``BINARY_EXTENSIONS``."""
        depth: dict[Loc, int] = {}
        queue: deque[Loc] = deque()
        for loc in self.seeds if seeds is None else seeds:
            if loc not in depth:
                depth[loc] = 0
                queue.append(loc)
        starts = tuple(depth)
        fetchable: dict[str, int] = {}
        disallowed: set[str] = set()
        html_pages: set[str] = set()
        links: set[str] = set()
        page_links: set[str] = set()
        while queue:
            loc = queue.popleft()
            url = self.url(loc, authorities)
            if loc.path.startswith(DISALLOWED_PREFIX):
                disallowed.add(url)
                continue
            entry = self.entries.get(loc)
            fetchable[url] = entry.status if entry is not None else 404
            if entry is None:
                continue
            if entry.kind in ("page", "hidden"):
                html_pages.add(url)
            if max_depth is not None and depth[loc] >= max_depth:
                continue
            for target in self.outlinks(entry):
                if scope == "host" and target.host != loc.host:
                    continue
                if skip_binaries and is_binary(target):
                    continue
                links.add(self.url(target, authorities))
                if entry.redirect is None:
                    page_links.add(self.url(target, authorities))
                if target not in depth:
                    depth[target] = depth[loc] + 1
                    queue.append(target)
        return Expected(
            seeds=tuple(self.url(loc, authorities) for loc in starts),
            fetchable=fetchable,
            disallowed=frozenset(disallowed),
            html_pages=frozenset(html_pages),
            links=frozenset(links),
            page_links=frozenset(page_links),
            depths={
                self.url(loc, authorities): d
                for loc, d in sorted(depth.items(), key=lambda item: item[1])
            },
        )

    def outlinks(self, entry: Entry) -> list[Loc]:
        if entry.redirect is not None:
            return [entry.redirect]
        return [link.target for link in entry.links if link.target is not None]

    # ------------------------------------------------------------------ serving

    def responses(self, authorities: list[str]) -> dict[tuple[int, str], tuple[int, str, bytes]]:
        """(host, request target) -> (status, content type or Location, body), pre-rendered."""
        out: dict[tuple[int, str], tuple[int, str, bytes]] = {}
        for host in range(self.hosts):
            out[host, "/robots.txt"] = (200, "text/plain", ROBOTS_TXT)
        for loc, entry in self.entries.items():
            key = (loc.host, loc.key)
            if entry.kind in ("page", "private", "hidden"):
                out[key] = (200, "text/html; charset=utf-8", self.render(entry, authorities))
            elif entry.kind == "file":
                out[key] = (200, entry.content_type, entry.body)
            elif entry.kind == "redirect":
                assert entry.redirect is not None
                target = entry.redirect.key
                if entry.absolute:
                    target = self.url(entry.redirect, authorities)
                out[key] = (entry.status, target, b"")
            else:
                out[key] = (404, "text/html; charset=utf-8", b"<html><body>gone</body></html>")
        return out

    def render(self, entry: Entry, authorities: list[str]) -> bytes:
        base = f'<base href="{entry.base}">' if entry.base else ""
        items = "\n".join(
            f'<li><a href="{html.escape(self._href(entry, link, authorities))}">link {n}</a></li>'
            for n, link in enumerate(entry.links)
        )
        title = f"Page {entry.loc.host}-{html.escape(entry.loc.key)}"
        return (
            f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{title}</title>{base}'
            f'</head>\n<body><h1 id="top">{title}</h1>\n{entry.text}\n<ul>\n{items}\n</ul>\n'
            f"</body></html>\n"
        ).encode()

    def _href(self, entry: Entry, link: Link, authorities: list[str]) -> str:
        if link.target is None:
            return link.raw
        target = link.target
        path, _, query = target.key.partition("?")
        if link.unsorted and "&" in query:
            query = "&".join(reversed(query.split("&")))
        if link.tracking:
            extra = "&".join(f"{k}={v}" for k, v in link.tracking)
            query = f"{query}&{extra}" if query else extra
        if link.escaped_digit:
            digit = next((i for i, c in enumerate(path) if c.isdigit()), None)
            if digit is not None:
                path = f"{path[:digit]}%{ord(path[digit]):02X}{path[digit + 1 :]}"
        authority = authorities[target.host]
        match link.form:
            case "absolute":
                scheme = "HTTP" if link.upper_scheme else "http"
                href = f"{scheme}://{authority}{path}"
            case "scheme-relative":
                href = f"//{authority}{path}"
            case "relative":
                directory = entry.base or posixpath.dirname(entry.loc.path)
                href = posixpath.relpath(path, directory or "/")
                if path.endswith("/"):  # relpath says "." or ".." for a directory
                    href = href.rstrip("/") + "/"
            case "dotted":
                href = f"/s{target.host % DIRECTORIES}/../.{path}"
            case _:
                href = path
        if query:
            href = f"{href}?{query}"
        if link.fragment:
            href = f"{href}#{link.fragment}"
        return href
