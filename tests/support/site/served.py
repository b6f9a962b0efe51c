"""The tests' multi-host website: the levelled site (``levels.py``) served in-process by aiohttp.

Host ``i`` (0-based) is an aiohttp server on 127.0.0.{i+2} (Linux routes all of 127/8 to lo), or
on ``addresses[i]`` when given (the partition tests' bridge, tests/support/netns.py), with
an OS-chosen port; ``hosts`` are their ``"127.0.0.N:PORT"``. Everything is drawn from
``random.Random(seed)``: the same seed serves the same site (up to the ports). Each request is
answered from the responses ``model.Site`` renders, looked up by its canonical path and query.

The canonical form of a URL is ``http://127.0.0.N:PORT/path`` plus ``?query`` with its pairs sorted
and tracking parameters removed, no fragment (``canonical()`` below). After ``start()``:

    seeds       [root URL of host 0]
    fetchable   what a crawler obeying robots.txt, starting from ``seeds`` in scope "any" with
                no depth limit, requests and gets a terminal answer for: HTML pages (200, parsed),
                404 URLs, and redirect sources (301/302; each target is a page that is itself in
                the set); and non-HTML resources (200, not parsed) only with
                ``skip_binaries=False``: by default the site's answer is jetcrawl's default
                crawl, which skips links to them by extension (``SKIPS_BINARIES``)
    disallowed  URLs linked from fetched pages that robots.txt disallows: recorded, never fetched
    reachable   fetchable | disallowed, the result set of a correct crawl
    depths      canonical URL -> BFS link depth from the seeds (seeds 0), over ``reachable``
    statuses    fetchable URL -> the status the server answers (200, 301, 302, 404)
    kinds       reachable URL -> "page" | "resource" | "redirect" | "missing" | "disallowed"
    redirects   redirect source URL -> target URL

``reachable_within(d)`` is ``{url : depths[url] <= d}``, exact whatever order a crawler takes
(``levels.py`` says why).

``reachable_from(url, scope="host")`` is the same crawl from another start, restricted to its host
(links to other hosts dropped) or not (scope "any"); ``expected(...)`` gives all the sets for any
seeds, scope, depth limit and ``skip_binaries`` (``False``: a job that fetches everything).

The request log ``requests`` (and ``request_counts``, keyed by ``http://host:port/path?query`` as
requested, robots.txt included) lets a test check that nothing was fetched twice and nothing
disallowed was fetched at all. ``hold(peer)`` keeps the next page request from one client address
unanswered until the test releases it (to put a fault between a fetch and what follows it).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from html.parser import HTMLParser
from types import TracebackType
from typing import Literal, Self
from urllib.parse import parse_qsl, urlencode, urljoin, urlsplit, urlunsplit

from aiohttp import web

from tests.support.site import levels
from tests.support.site.model import DISALLOWED_PREFIX, TRACKING_PARAMS, Expected, Loc, Scope

__all__ = ["Hold", "MultiHostSite", "SiteRequest", "canonical", "extract_links"]

FIRST_HOST_OCTET = 2  # host i listens on 127.0.0.{i + 2}
# A jetcrawl crawl skips links to the site's binaries unless told otherwise (ignored_extensions,
# a job spec's extensions.default): every expected set of a site assumes so unless told otherwise.
SKIPS_BINARIES = True

# How a test names what a URL is: "page" for every HTML page a crawler may fetch.
Kind = Literal["page", "resource", "redirect", "missing", "disallowed"]


@dataclass(frozen=True, slots=True)
class SiteRequest:
    method: str
    url: str  # http://host:port + the request target as sent
    status: int
    at: float  # time.monotonic() when the request arrived
    peer: str = ""  # the client's address: which worker asked, where each has its own


@dataclass(slots=True)
class Hold:
    """The next page request (robots.txt aside) from ``peer``, unanswered until ``release()``."""

    peer: str
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    released: asyncio.Event = field(default_factory=asyncio.Event)
    url: str = ""  # the held request's, once it arrived

    def release(self) -> None:
        self.released.set()


# --- the canonical form and link extraction a crawler is measured against ---------------------


def canonical(url: str, tracking: Collection[str] = TRACKING_PARAMS) -> str | None:
    """``http(s)://host:port/path?sorted-query`` without fragment and ``tracking`` parameters;
    None if not http."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return None
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    query = urlencode(sorted((k, v) for k, v in pairs if k not in tracking))
    return urlunsplit((parts.scheme, parts.netloc.lower(), parts.path or "/", query, ""))


class _LinkParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.base: str | None = None
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if href is None:
            return
        if tag == "base" and self.base is None:
            self.base = href
        elif tag == "a":
            self.hrefs.append(href)


def extract_links(page_html: str, page_url: str) -> list[str]:
    """Every <a href> of a page resolved to an absolute URL (honouring <base href>), in order."""
    parser = _LinkParser()
    parser.feed(page_html)
    parser.close()
    base = urljoin(page_url, parser.base.strip()) if parser.base is not None else page_url
    return [urljoin(base, href.strip()) for href in parser.hrefs]


# --- the served site ---------------------------------------------------------------------------


class MultiHostSite:
    """The website: ``async with MultiHostSite(seed=1) as site`` (see the module docstring)."""

    def __init__(
        self,
        seed: int,
        hosts: int = 3,
        pages_per_host: int = 30,
        addresses: list[str] | None = None,
        skip_binaries: bool = SKIPS_BINARIES,
    ) -> None:
        self.seed = seed
        self.skip_binaries = skip_binaries  # what the expected sets assume by default
        self._site = levels.generate(seed, hosts, pages_per_host)
        self._host_count = hosts
        self._addresses = addresses or [_address(h) for h in range(hosts)]
        if len(self._addresses) != hosts:
            raise ValueError(f"{hosts} hosts need as many addresses, got {self._addresses}")
        # the servers (filled by start)
        self._runners: list[web.AppRunner] = []
        self._ports: list[int] = []
        # what the servers were asked
        self.requests: list[SiteRequest] = []
        self._holds: dict[str, Hold] = {}
        # the rendered answers and the default crawl (filled by the first start)
        self._responses: dict[tuple[int, str], tuple[int, str, bytes]] = {}
        self._expected: Expected | None = None

    # Life cycle.

    async def start(self) -> None:
        if self._runners:
            return
        try:
            for host in range(self._host_count):
                await self._start_host(host)
        except BaseException:
            await self.stop()
            raise
        if self._expected is None:
            self._responses = self._site.responses(self.hosts)
            self._expected = self.expected()

    async def _start_host(self, host: int) -> None:
        app = web.Application(middlewares=[self._log_middleware(host)])
        app.router.add_get("/{tail:.*}", self._handler(host))
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        self._runners.append(runner)
        await runner.setup()
        restart = host < len(self._ports)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self._addresses[host], self._ports[host] if restart else 0))
            await web.SockSite(runner, sock).start()
        except BaseException:
            sock.close()
            raise
        if not restart:
            self._ports.append(sock.getsockname()[1])

    async def stop(self) -> None:
        """Stop serving; the ports, the expected sets and the request log stay (a later
        ``start()`` serves the same site on the same ports)."""
        for hold in self._holds.values():
            hold.release()
        runners, self._runners = self._runners, []
        for runner in runners:
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # Addresses.

    @property
    def hosts(self) -> list[str]:
        """``"127.0.0.N:PORT"`` per host, host 0 first."""
        self._require_started()
        return [f"{self._addresses[h]}:{port}" for h, port in enumerate(self._ports)]

    @property
    def base_urls(self) -> list[str]:
        return [f"http://{host}" for host in self.hosts]

    def url(self, loc: Loc) -> str:
        return self._site.url(loc, self.hosts)

    def locate(self, url: str) -> Loc:
        """The location of one of this site's URLs (canonicalized first)."""
        parts = urlsplit(canonical(url) or "")
        try:
            host = self.hosts.index(parts.netloc)
        except ValueError:
            raise KeyError(f"not a URL of this site: {url}") from None
        return Loc(host, parts.path + (f"?{parts.query}" if parts.query else ""))

    # The answer.

    @property
    def seeds(self) -> list[str]:
        return [self.url(loc) for loc in self._site.seeds]

    @property
    def fetchable(self) -> frozenset[str]:
        return frozenset(self._default().fetchable)

    @property
    def disallowed(self) -> frozenset[str]:
        return self._default().disallowed

    @property
    def reachable(self) -> frozenset[str]:
        return self._default().reachable

    @property
    def depths(self) -> Mapping[str, int]:
        return self._default().depths

    def reachable_within(self, max_depth: int) -> frozenset[str]:
        return frozenset(url for url, depth in self.depths.items() if depth <= max_depth)

    def reachable_from(self, seed_url: str, scope: Scope = "host") -> frozenset[str]:
        return self.expected([seed_url], scope=scope).reachable

    def expected(
        self,
        seeds: Iterable[str] | None = None,
        scope: Scope = "any",
        max_depth: int | None = None,
        skip_binaries: bool | None = None,
    ) -> Expected:
        """The crawl from ``seeds`` (default ``self.seeds``): BFS over the generated links.

        Scope "host" drops every link to another host than the one it is on (so each seed's
        crawl stays on the seed's host). ``skip_binaries`` (default: the site's) drops links to
        the PDFs and PNGs, as jetcrawl's default extension filter does.
        """
        starts = None if seeds is None else [self.locate(url) for url in seeds]
        skip = self.skip_binaries if skip_binaries is None else skip_binaries
        return self._site.expected(self.hosts, starts, scope, max_depth, skip)

    @property
    def statuses(self) -> dict[str, int]:
        """Fetchable URL -> the status the server answers."""
        return dict(self._default().fetchable)

    @property
    def kinds(self) -> dict[str, Kind]:
        return {url: self._kind(self.locate(url)) for url in self.reachable}

    def kind(self, url: str) -> Kind:
        """What one of the site's URLs is, reachable by the default crawl or not."""
        return self._kind(self.locate(url))

    @property
    def redirects(self) -> dict[str, str]:
        """Reachable redirect source -> its target."""
        entries = self._site.entries
        return {
            url: self.url(target)
            for url in self.fetchable
            if (entry := entries.get(self.locate(url))) and (target := entry.redirect)
        }

    def page_level(self, url: str) -> int:
        """The depth a public page was generated at (private and hidden pages: -1)."""
        return self._site.entries[self.locate(url)].level

    def hold(self, peer: str) -> Hold:
        """Hold the next page request from the client address ``peer`` (see ``Hold``)."""
        hold = self._holds[peer] = Hold(peer)
        return hold

    @property
    def request_counts(self) -> Counter[str]:
        return Counter(request.url for request in self.requests)

    # Internals.

    def _default(self) -> Expected:
        if self._expected is None:
            raise RuntimeError("the site's URLs have ports only once it is started")
        return self._expected

    def _require_started(self) -> None:
        if len(self._ports) != self._host_count:
            raise RuntimeError("the site's URLs have ports only once it is started")

    def _kind(self, loc: Loc) -> Kind:
        if loc.path.startswith(DISALLOWED_PREFIX):
            return "disallowed"
        entry = self._site.entries.get(loc)
        if entry is None or entry.kind == "missing":
            return "missing"
        if entry.kind == "file":
            return "resource"
        if entry.kind == "redirect":
            return "redirect"
        return "page"

    def _handler(self, host: int) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            pairs = [(k, v) for k, v in request.query.items() if k not in TRACKING_PARAMS]
            query = urlencode(sorted(pairs))
            answer = self._responses.get((host, request.path + (f"?{query}" if query else "")))
            if answer is None:
                return web.Response(status=404, text="not found", content_type="text/plain")
            status, kind, body = answer
            if 300 <= status < 400:
                return web.Response(status=status, headers={"Location": kind})
            return web.Response(status=status, body=body, headers={"Content-Type": kind})

        return handle

    def _log_middleware(self, host: int) -> Callable[..., Awaitable[web.StreamResponse]]:
        @web.middleware
        async def log(
            request: web.Request,
            handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
        ) -> web.StreamResponse:
            url = f"http://{self.hosts[host]}{request.raw_path}"
            arrived, peer = time.monotonic(), request.remote or ""
            hold = self._holds.get(peer)
            if hold is not None and not request.path.endswith("/robots.txt"):
                del self._holds[peer]
                hold.url = url
                hold.arrived.set()
                await hold.released.wait()
            try:
                response = await handler(request)
            except web.HTTPException as exc:  # e.g. 405 for a method other than GET/HEAD
                self.requests.append(SiteRequest(request.method, url, exc.status, arrived, peer))
                raise
            self.requests.append(SiteRequest(request.method, url, response.status, arrived, peer))
            return response

        return log


def _address(host: int) -> str:
    return f"127.0.0.{host + FIRST_HOST_OCTET}"
