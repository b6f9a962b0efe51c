"""A local multi-host website generated from a seed, with the exact answer a crawler should find.

Host ``i`` (0-based) is an aiohttp server on 127.0.0.{i+2} (Linux routes all of 127/8 to lo) with
an OS-chosen port; ``hosts`` are their ``"127.0.0.N:PORT"``. Everything is drawn from
``random.Random(seed)``: the same seed serves the same site (up to the ports).

What is served, per host:

    /robots.txt          "User-agent: *" / "Disallow: /private/"
    /                    the host's root page; it has <base href="/docs/">, so its relative links
                         resolve under /docs/ (a crawler ignoring <base> asks for /N.html: a 404
                         that is not in the expected sets)
    /docs/N.html         HTML pages
    /list?cat=C&page=P   HTML pages whose canonical query is sorted; links write it either way
    /files/docN.pdf      application/pdf  } 200, not HTML: recorded, never parsed (their bytes
    /img/picN.png        image/png        } hold an <a href> to a URL that is not on the site)
    /old/N.html          301 to a page of the same host  } a page linking a redirect also links
    /moved/N             302 to a page of the same host  } its target directly
    /private/N.html      HTML pages disallowed by robots.txt; they link /hidden/N.html pages that
                         nothing else links, so a crawler that ignores robots finds extra URLs
    anything else        404 (pages link some /gone/N.html and /docs/N.html that do not exist)

Links are <a href> only, written as: absolute path, relative path, absolute URL, scheme-relative
URL, with a #fragment, with tracking parameters (utm_source, utm_medium, utm_campaign, fbclid,
gclid), with the query unsorted, as a bare "#top" or "" (the page itself), HTML-escaped, and
repeated; plus mailto:, javascript: and tel: links, which a crawler must ignore.

The canonical form of a URL is ``http://127.0.0.N:PORT/path`` plus ``?query`` with its pairs sorted
and tracking parameters removed, no fragment (``canonical()`` below). After ``start()``:

    seeds       [root URL of host 0]
    fetchable   what a crawler obeying robots.txt, starting from ``seeds`` in scope "any" with
                no depth limit, requests and gets a terminal answer for: HTML pages (200, parsed),
                non-HTML resources (200, not parsed), 404 URLs, and redirect sources (301/302;
                each target is a page that is itself in the set)
    disallowed  URLs linked from fetched pages that robots.txt disallows: recorded, never fetched
    reachable   fetchable | disallowed, the result set of a correct crawl
    depths      canonical URL -> BFS link depth from the seeds (seeds 0), over ``reachable``
    statuses    fetchable URL -> the status the server answers (200, 301, 302, 404)
    kinds       reachable URL -> "page" | "resource" | "redirect" | "missing" | "disallowed"
    redirects   redirect source URL -> target URL

``reachable_within(d)`` is ``{url : depths[url] <= d}``. Depth is exact even for a crawler that
admits a URL at the depth of whichever link it sees first: every link goes from a page of depth
``d`` to a URL of depth ``d + 1``, or back to the seed or a depth-1 URL, which are admitted before
any deeper page is fetched. A redirect counts like a link (target at ``d + 1``); since the target
is also linked directly, it has depth ``d`` either way.

``reachable_from(url, scope="host")`` is the same crawl from another start, restricted to its host
(links to other hosts dropped) or not (scope "any"); ``expected(...)`` gives all the sets for any
seeds, scope and depth limit.

The request log ``requests`` (and ``request_counts``, keyed by ``http://host:port/path?query`` as
requested, robots.txt included) lets a test check that nothing was fetched twice and nothing
disallowed was fetched at all.
"""

from __future__ import annotations

import html
import posixpath
import random
import socket
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from html.parser import HTMLParser
from types import TracebackType
from typing import Literal, Self
from urllib.parse import parse_qsl, urlencode, urljoin, urlsplit, urlunsplit

from aiohttp import web

TRACKING_PARAMS = frozenset({"utm_source", "utm_medium", "utm_campaign", "fbclid", "gclid"})
ROBOTS_TXT = "User-agent: *\nDisallow: /private/\n"
DISALLOWED_PREFIX = "/private/"
MAX_LEVEL = 6  # public pages get depths 1..MAX_LEVEL (fewer if the site is small)
FIRST_HOST_OCTET = 2  # host i listens on 127.0.0.{i + 2}

Kind = Literal["page", "resource", "redirect", "missing", "disallowed"]
Scope = Literal["host", "any"]

_WORDS = (
    "crawler frontier shard politeness robots fetch parse link queue stream consumer lease worker",
    "dispatcher canonical fragment redirect budget depth scope trace span",
)


# --- the generated graph, independent of ports -------------------------------------------------


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


Form = Literal["path", "relative", "absolute", "scheme-relative"]


@dataclass(frozen=True, slots=True)
class Link:
    """One <a href>: where it points (None: not an http link) and how the href is written."""

    target: Loc | None
    form: Form = "path"
    fragment: str = ""
    tracking: tuple[tuple[str, str], ...] = ()
    unsorted: bool = False
    raw: str | None = None  # written verbatim ("mailto:...", "#top", "")


@dataclass(slots=True)
class Page:
    loc: Loc
    level: int  # the BFS depth by construction (public pages); private/hidden pages: -1
    title: str
    text: str
    base: str | None = None
    links: list[Link] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Resource:
    loc: Loc
    content_type: str
    body: bytes


@dataclass(frozen=True, slots=True)
class Redirect:
    loc: Loc
    status: int
    target: Loc
    absolute: bool  # Location as an absolute URL, else as a path


@dataclass(frozen=True, slots=True)
class SiteRequest:
    method: str
    url: str  # http://host:port + the request target as sent
    status: int
    at: float  # time.monotonic()


@dataclass(frozen=True, slots=True)
class Expected:
    """What a correct crawl records, as canonical URLs."""

    fetchable: frozenset[str]
    disallowed: frozenset[str]
    depths: Mapping[str, int]

    @property
    def reachable(self) -> frozenset[str]:
        return self.fetchable | self.disallowed


class _Generator:
    """Draws one site from a seed; see the module docstring for its shape."""

    def __init__(self, seed: int, hosts: int, pages_per_host: int) -> None:
        if hosts < 1 or pages_per_host < 4:
            raise ValueError("need at least 1 host and 4 pages per host")
        self.rng = random.Random(seed)
        self.hosts = hosts
        self.pages_per_host = pages_per_host
        self.pages: dict[Loc, Page] = {}
        self.resources: dict[Loc, Resource] = {}
        self.redirects: dict[Loc, Redirect] = {}
        self.by_level: dict[int, list[Page]] = {}

    def generate(self) -> None:
        self._public_pages()
        self._forward_links()
        for host in range(self.hosts):
            self._terminals(host)
            self._redirects(host)
            self._private_area(host)
        for page in self.pages.values():
            if page.level >= 0:
                self._decorations(page)
            self.rng.shuffle(page.links)

    # Public pages in levels: each page of level L >= 1 is linked from a page of level L - 1.

    def _public_pages(self) -> None:
        rng = self.rng
        drafts: list[tuple[Loc, int]] = []
        for host in range(self.hosts):
            drafts.append((Loc(host, "/"), 0 if host == 0 else 1))
            pairs = rng.sample([(c, p) for c in range(1, 4) for p in range(1, 4)], 2)
            for cat, num in pairs:
                drafts.append((Loc(host, f"/list?cat={cat}&page={num}"), rng.randint(1, MAX_LEVEL)))
            for index in range(1, self.pages_per_host - 2):
                drafts.append((Loc(host, f"/docs/{index}.html"), rng.randint(1, MAX_LEVEL)))
        # Renumber the levels used so they are contiguous from 0.
        ranks = {level: rank for rank, level in enumerate(sorted({lv for _, lv in drafts}))}
        for loc, level in drafts:
            page = self._page(loc, ranks[level])
            if loc.key == "/":
                page.base = "/docs/"
            self.by_level.setdefault(page.level, []).append(page)

    def _page(self, loc: Loc, level: int) -> Page:
        words = self.rng.choices(" ".join(_WORDS).split(), k=self.rng.randint(8, 20))
        page = Page(loc, level, html.escape(f"host {loc.host} {loc.key}"), " ".join(words))
        self.pages[loc] = page
        return page

    def _forward_links(self) -> None:
        rng = self.rng
        for level in sorted(self.by_level)[1:]:
            parents = self.by_level[level - 1]
            for page in self.by_level[level]:
                for parent in rng.sample(parents, min(len(parents), rng.choice((1, 1, 2, 3)))):
                    self._link(parent, page.loc)

    def _link(self, page: Page, target: Loc) -> None:
        """A link to an http target, written in a random (valid) form, sometimes twice."""
        rng = self.rng
        fragment = rng.choice(("", "", "", "top", "sec-2"))
        tracking: tuple[tuple[str, str], ...] = ()
        if rng.random() < 0.2:
            names = rng.sample(sorted(TRACKING_PARAMS), rng.randint(1, 2))
            tracking = tuple((name, rng.choice(("news", "x1", "abc123"))) for name in names)
        unsorted = bool(target.query) and rng.random() < 0.6
        page.links.append(Link(target, self._form(page, target), fragment, tracking, unsorted))
        if rng.random() < 0.25:
            page.links.append(Link(target, self._form(page, target)))

    def _form(self, page: Page, target: Loc) -> Form:
        rng = self.rng
        if target.host != page.loc.host:
            return rng.choice(("absolute", "absolute", "scheme-relative"))
        if page.base is not None and rng.random() < 0.6:
            return "relative"  # resolved against the <base>
        return rng.choice(("path", "path", "relative", "absolute"))

    def _linkers(self, level: int, count: int) -> list[Page]:
        """Pages of one level (so the linked URL gets depth ``level + 1`` whoever is first)."""
        pages = self.by_level.get(level, [])
        return self.rng.sample(pages, min(len(pages), count))

    def _random_level(self) -> int:
        return self.rng.randint(0, max(self.by_level))

    # Terminal URLs: resources and 404s, each linked from pages of one level only.

    def _terminals(self, host: int) -> None:
        rng = self.rng
        made: list[Loc] = []
        for index in range(1, 3):
            pdf = Loc(host, f"/files/doc{index}.pdf")
            body = b'%PDF-1.4\n% <a href="/pdf-trap.html">not a page</a>\n%%EOF\n'
            self.resources[pdf] = Resource(pdf, "application/pdf", body)
            png = Loc(host, f"/img/pic{index}.png")
            body = b'\x89PNG\r\n\x1a\n<a href="/png-trap.html">not a page</a>'
            self.resources[png] = Resource(png, "image/png", body)
            made += [pdf, png]
        made += [Loc(host, f"/gone/{index}.html") for index in range(1, 3)]
        made.append(Loc(host, f"/docs/{self.pages_per_host + rng.randint(10, 99)}.html"))
        for loc in made:
            for page in self._linkers(self._random_level(), rng.randint(1, 3)):
                self._link(page, loc)

    def _redirects(self, host: int) -> None:
        rng = self.rng
        targets = [
            page
            for page in self.pages.values()
            if page.loc.host == host and page.level >= 1 and page.loc.key != "/"
        ]
        for index, target in enumerate(rng.sample(targets, min(2, len(targets))), start=1):
            status = 301 if index == 1 else 302
            loc = Loc(host, f"/old/{index}.html" if status == 301 else f"/moved/{index}")
            self.redirects[loc] = Redirect(loc, status, target.loc, rng.random() < 0.5)
            parents = [p for p in self.by_level[target.level - 1] if _links_to(p, target.loc)]
            for parent in rng.sample(parents, min(len(parents), rng.randint(1, 2))):
                self._link(parent, loc)

    def _private_area(self, host: int) -> None:
        rng = self.rng
        count = max(2, self.pages_per_host // 10)
        hidden = [self._page(Loc(host, f"/hidden/{i}.html"), -1) for i in range(1, count + 1)]
        for index in range(1, count + 1):
            private = self._page(Loc(host, f"/private/{index}.html"), -1)
            for page in self._linkers(self._random_level(), rng.randint(1, 2)):
                self._link(page, private.loc)
            for target in rng.sample(hidden, rng.randint(1, len(hidden))):
                self._link(private, target.loc)
            self._link(private, Loc(host, "/"))
        for page in hidden:
            self._link(page, rng.choice(hidden).loc)
            self._link(page, Loc(host, "/"))
            self._link(page, Loc(host, f"/hidden-only/{page.loc.key.rsplit('/', 1)[1]}"))

    # Links a crawler resolves to a page it already has, or must ignore.

    def _decorations(self, page: Page) -> None:
        rng = self.rng
        if page.level >= 1:  # back links to URLs of depth <= 1
            self._link(page, Loc(page.loc.host, "/"))
            if rng.random() < 0.4:
                self._link(page, Loc(0, "/"))
            if rng.random() < 0.4:
                self._link(page, rng.choice(self.by_level[1]).loc)
        if page.base is None and rng.random() < 0.5:  # under a <base>, "" and "#x" mean the base
            page.links.append(Link(page.loc, raw=rng.choice(("#top", "#sec-2", ""))))
        for raw in rng.sample(
            ["mailto:webmaster@example.com", "javascript:void(0)", "tel:+15555550100"],
            rng.randint(0, 2),
        ):
            page.links.append(Link(None, raw=raw))


def _links_to(page: Page, target: Loc) -> bool:
    return any(link.target == target and link.raw is None for link in page.links)


# --- the canonical form and link extraction a crawler is measured against ---------------------


def canonical(url: str) -> str | None:
    """``http(s)://host:port/path?sorted-query`` without fragment and tracking; None if not http."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return None
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    query = urlencode(sorted((k, v) for k, v in pairs if k not in TRACKING_PARAMS))
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

    def __init__(self, seed: int, hosts: int = 3, pages_per_host: int = 30) -> None:
        self.seed = seed
        generator = _Generator(seed, hosts, pages_per_host)
        generator.generate()
        # the generated content, by port-independent location
        self._pages = generator.pages
        self._resources = generator.resources
        self._redirects = generator.redirects
        self._host_count = hosts
        # the servers (filled by start)
        self._runners: list[web.AppRunner] = []
        self._ports: list[int] = []
        # what the servers were asked
        self.requests: list[SiteRequest] = []
        # the answer for the default crawl (filled by start)
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
            sock.bind((_address(host), self._ports[host] if restart else 0))
            await web.SockSite(runner, sock).start()
        except BaseException:
            sock.close()
            raise
        if not restart:
            self._ports.append(sock.getsockname()[1])

    async def stop(self) -> None:
        """Stop serving; the ports, the expected sets and the request log stay (a later
        ``start()`` serves the same site on the same ports)."""
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
        return [f"{_address(h)}:{port}" for h, port in enumerate(self._ports)]

    @property
    def base_urls(self) -> list[str]:
        return [f"http://{host}" for host in self.hosts]

    def url(self, loc: Loc) -> str:
        return f"http://{self.hosts[loc.host]}{loc.key}"

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
        return [self.url(Loc(0, "/"))]

    @property
    def fetchable(self) -> frozenset[str]:
        return self._default().fetchable

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
        self, seeds: Iterable[str] | None = None, scope: Scope = "any", max_depth: int | None = None
    ) -> Expected:
        """The crawl from ``seeds`` (default ``self.seeds``): BFS over the generated links.

        Scope "host" drops every link to another host than the one it is on (so each seed's
        crawl stays on the seed's host).
        """
        starts = [self.locate(url) for url in (self.seeds if seeds is None else seeds)]
        depth: dict[Loc, int] = {}
        queue: deque[Loc] = deque()
        for loc in starts:
            if loc not in depth:
                depth[loc] = 0
                queue.append(loc)
        fetchable: set[Loc] = set()
        disallowed: set[Loc] = set()
        while queue:
            loc = queue.popleft()
            if loc.path.startswith(DISALLOWED_PREFIX):
                disallowed.add(loc)
                continue
            fetchable.add(loc)
            if max_depth is not None and depth[loc] >= max_depth:
                continue
            for target in self._outlinks(loc):
                if scope == "host" and target.host != loc.host:
                    continue
                if target not in depth:
                    depth[target] = depth[loc] + 1
                    queue.append(target)
        return Expected(
            fetchable=frozenset(map(self.url, fetchable)),
            disallowed=frozenset(map(self.url, disallowed)),
            depths={self.url(loc): d for loc, d in sorted(depth.items(), key=lambda i: i[1])},
        )

    @property
    def statuses(self) -> dict[str, int]:
        """Fetchable URL -> the status the server answers."""
        return {url: self._status(self.locate(url)) for url in self.fetchable}

    @property
    def kinds(self) -> dict[str, Kind]:
        return {url: self._kind(self.locate(url)) for url in self.reachable}

    @property
    def redirects(self) -> dict[str, str]:
        """Reachable redirect source -> its target."""
        return {
            url: self.url(self._redirects[loc].target)
            for url in self.fetchable
            if (loc := self.locate(url)) in self._redirects
        }

    def page_level(self, url: str) -> int:
        """The depth a public page was generated at (private and hidden pages: -1)."""
        return self._pages[self.locate(url)].level

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

    def _outlinks(self, loc: Loc) -> list[Loc]:
        if loc in self._pages:
            return [link.target for link in self._pages[loc].links if link.target is not None]
        if loc in self._redirects:
            return [self._redirects[loc].target]
        return []

    def _kind(self, loc: Loc) -> Kind:
        if loc.path.startswith(DISALLOWED_PREFIX):
            return "disallowed"
        if loc in self._pages:
            return "page"
        if loc in self._resources:
            return "resource"
        if loc in self._redirects:
            return "redirect"
        return "missing"

    def _status(self, loc: Loc) -> int:
        if loc in self._redirects:
            return self._redirects[loc].status
        return 200 if loc in self._pages or loc in self._resources else 404

    def _href(self, page: Page, link: Link) -> str:
        if link.raw is not None:
            return link.raw
        assert link.target is not None
        target = link.target
        pairs = parse_qsl(target.query, keep_blank_values=True)
        if link.unsorted:
            pairs.reverse()
        pairs += link.tracking
        query = f"?{urlencode(pairs)}" if pairs else ""
        fragment = f"#{link.fragment}" if link.fragment else ""
        host = self.hosts[target.host]
        match link.form:
            case "absolute":
                path = f"http://{host}{target.path}"
            case "scheme-relative":
                path = f"//{host}{target.path}"
            case "relative":
                base_dir = posixpath.dirname(page.base or page.loc.path) or "/"
                path = posixpath.relpath(target.path, base_dir)
                if target.path.endswith("/"):  # relpath gives "." or ".." for a directory
                    path = path.rstrip("/") + "/"
            case "path":
                path = target.path
        return f"{path}{query}{fragment}"

    def _render(self, page: Page) -> str:
        base = f'<base href="{html.escape(page.base)}">' if page.base else ""
        items = "\n".join(
            f'<li><a href="{html.escape(self._href(page, link))}">link {n}</a></li>'
            for n, link in enumerate(page.links)
        )
        return (
            f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{page.title}</title>'
            f'{base}</head>\n<body><h1 id="top">{page.title}</h1>\n<p>{page.text}</p>\n'
            f'<ul>\n{items}\n</ul>\n<p id="sec-2">{page.text}</p>\n</body></html>\n'
        )

    def _handler(self, host: int) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            if request.path == "/robots.txt":
                return web.Response(text=ROBOTS_TXT, content_type="text/plain")
            pairs = [(k, v) for k, v in request.query.items() if k not in TRACKING_PARAMS]
            query = urlencode(sorted(pairs))
            loc = Loc(host, request.path + (f"?{query}" if query else ""))
            if (page := self._pages.get(loc)) is not None:
                return web.Response(text=self._render(page), content_type="text/html")
            if (resource := self._resources.get(loc)) is not None:
                return web.Response(body=resource.body, content_type=resource.content_type)
            if (redirect := self._redirects.get(loc)) is not None:
                target = self.url(redirect.target) if redirect.absolute else redirect.target.key
                return web.Response(status=redirect.status, headers={"Location": target})
            return web.Response(status=404, text="not found", content_type="text/plain")

        return handle

    def _log_middleware(self, host: int) -> Callable[..., Awaitable[web.StreamResponse]]:
        @web.middleware
        async def log(
            request: web.Request,
            handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
        ) -> web.StreamResponse:
            url = f"http://{self.hosts[host]}{request.raw_path}"
            try:
                response = await handler(request)
            except web.HTTPException as exc:  # e.g. 405 for a method other than GET/HEAD
                self.requests.append(SiteRequest(request.method, url, exc.status, time.monotonic()))
                raise
            self.requests.append(
                SiteRequest(request.method, url, response.status, time.monotonic())
            )
            return response

        return log


def _address(host: int) -> str:
    return f"127.0.0.{host + FIRST_HOST_OCTET}"
