"""The benchmark website: a seeded multi-host site whose correct crawl is known exactly.

``Site.generate(spec)`` draws a port-independent model from ``random.Random(spec.seed)``, so the
harness and the server processes build the same site from the same ``SiteSpec``. Host ``h`` is
``127.0.0.{10+h}`` on a port chosen by the OS; ``authorities`` (``"127.0.0.N:PORT"``, one per host)
turn the model's locations into URLs.

Per host, ``spec.pages / spec.hosts`` fetchable URLs, in these proportions:

    /                       the root page (a seed)                                200 text/html
    /sD/N.html              pages in eight directories                        200 text/html
    /list?cat=C&page=N      pages with a query (canonically sorted)               200 text/html
    /files/docN.pdf         non-HTML, never parsed (~4 %)                    200 application/pdf
    /img/picN.png           non-HTML, never parsed                                200 image/png
    /old/N.html, /moved/N   redirects to a page of the same host (~4 %)         301 / 302
    /gone/N.html            linked, missing (~3 %)                                          404
    /private/N.html         disallowed by robots.txt (~3 % more, not fetchable); they alone
                            link /hidden/N.html, so a crawler ignoring robots finds extra pages
    /robots.txt             "User-agent: *" / "Disallow: /private/"

Every fetchable URL is linked from a page of its own host that is reachable from that host's root
(a random tree), so the crawl from the roots in scope "any" fetches all of them. Each page has
about ``spec.links_per_page`` links: the tree links, then random links to its own host and to the
others, written in every form a crawler must canonicalize — absolute, scheme-relative, rooted,
relative (``../sD/N.html``), with dot segments, under a ``<base href>``, with ``#fragments``,
tracking parameters (``utm_*``, ``fbclid``, ``gclid``), the query unsorted, an upper-case scheme,
a percent-encoded digit — plus repeats, ``#top``, and ``mailto:``/``javascript:``/``tel:``.

``expected(authorities)`` is the answer: ``fetchable`` (URL -> status), ``disallowed`` (robots-
blocked URLs that fetched pages link), ``seeds``, ``links`` (every canonical http URL that fetched
pages and redirects point at: ``fetchable | disallowed`` minus nothing but the seeds).
"""

from __future__ import annotations

import html
import posixpath
import random
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Literal

__all__ = ["ROBOTS_TXT", "Expected", "Site", "SiteSpec", "address"]

ROBOTS_TXT = b"User-agent: *\nDisallow: /private/\n"
DISALLOWED_PREFIX = "/private/"
FIRST_OCTET = 10  # host h listens on 127.0.0.{10 + h}
DIRECTORIES = 8
TRACKING = (
    (("utm_source", "bench"), ("utm_medium", "email")),
    (("fbclid", "IwAR0x"),),
    (("gclid", "Cj0KCQ"), ("utm_campaign", "spring")),
)
NOT_HTTP = ("mailto:webmaster@example.com", "javascript:void(0)", "tel:+15555550100")
_WORDS = (
    "crawler frontier shard politeness robots fetch parse link queue stream consumer lease worker "
    "dispatcher canonical fragment redirect budget depth scope trace span ack subject bucket "
    "fingerprint seed host page result"
)

Kind = Literal["page", "file", "redirect", "missing", "private", "hidden"]
FETCHABLE_KINDS = frozenset({"page", "file", "redirect", "missing"})


def address(host: int) -> str:
    if not 0 <= host < 256 - FIRST_OCTET:
        raise ValueError(f"host index {host} out of range")
    return f"127.0.0.{FIRST_OCTET + host}"


@dataclass(frozen=True, slots=True)
class SiteSpec:
    hosts: int = 20
    pages: int = 10_000  # fetchable URLs over all hosts
    links_per_page: int = 30
    paragraphs: int = 7  # of ~60 words each: pages of ~5 KB
    seed: int = 1

    def __post_init__(self) -> None:
        if self.hosts < 1 or self.pages < 10 * self.hosts:
            raise ValueError("need at least 1 host and 10 pages per host")

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True, slots=True, order=True)
class Loc:
    """A URL before ports are known: host index and canonical path+query."""

    host: int
    key: str

    @property
    def path(self) -> str:
        return self.key.partition("?")[0]


@dataclass(frozen=True, slots=True)
class Link:
    target: Loc | None  # None: not an http link, written as ``raw``
    form: str = "rooted"  # absolute, scheme-relative, rooted, relative, dotted
    fragment: str = ""
    tracking: tuple[tuple[str, str], ...] = ()
    unsorted: bool = False
    upper_scheme: bool = False
    escaped_digit: bool = False
    raw: str = ""


@dataclass(slots=True)
class Entry:
    loc: Loc
    kind: Kind
    links: list[Link] = field(default_factory=list)  # pages only
    base: str | None = None  # a page's <base href> (a directory path)
    redirect: Loc | None = None
    status: int = 200
    text: str = ""


@dataclass(frozen=True, slots=True)
class Expected:
    """The correct crawl, as canonical URLs."""

    seeds: tuple[str, ...]
    fetchable: dict[str, int]  # URL -> status the server answers
    disallowed: frozenset[str]
    html_pages: frozenset[str]  # the fetchable URLs whose links a crawler extracts
    links: frozenset[str]  # every canonical http URL fetched pages and redirects point at


class Site:
    def __init__(self, spec: SiteSpec, entries: dict[Loc, Entry]) -> None:
        self.spec = spec
        self.entries = entries

    # ------------------------------------------------------------------ generation

    @classmethod
    def generate(cls, spec: SiteSpec) -> Site:
        rng = random.Random(spec.seed)
        paragraphs = [" ".join(rng.choices(_WORDS.split(), k=60)) for _ in range(64)]
        entries: dict[Loc, Entry] = {}
        by_host: list[list[Entry]] = []
        for host in range(spec.hosts):
            share = spec.pages // spec.hosts + (1 if host < spec.pages % spec.hosts else 0)
            by_host.append(_host_entries(rng, host, share, spec, paragraphs))
            entries.update((entry.loc, entry) for entry in by_host[-1])
        for host_entries in by_host:
            _link_host(rng, host_entries, by_host, spec)
        return cls(spec, entries)

    # ------------------------------------------------------------------ the answer

    def seeds(self, authorities: list[str]) -> tuple[str, ...]:
        return tuple(f"http://{a}/" for a in authorities)

    def url(self, loc: Loc, authorities: list[str]) -> str:
        return f"http://{authorities[loc.host]}{loc.key}"

    def expected(self, authorities: list[str]) -> Expected:
        """BFS from every host's root over the links, not expanding robots-disallowed URLs."""
        roots = [Loc(h, "/") for h in range(self.spec.hosts)]
        seen = set(roots)
        queue = deque(roots)
        fetchable: dict[str, int] = {}
        disallowed: set[str] = set()
        html_pages: set[str] = set()
        links: set[str] = set()
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
            for target in self.outlinks(entry):
                links.add(self.url(target, authorities))
                if target not in seen:
                    seen.add(target)
                    queue.append(target)
        return Expected(
            seeds=self.seeds(authorities),
            fetchable=fetchable,
            disallowed=frozenset(disallowed),
            html_pages=frozenset(html_pages),
            links=frozenset(links),
        )

    def outlinks(self, entry: Entry) -> list[Loc]:
        if entry.redirect is not None:
            return [entry.redirect]
        return [link.target for link in entry.links if link.target is not None]

    # ------------------------------------------------------------------ serving

    def responses(self, authorities: list[str]) -> dict[tuple[int, str], tuple[int, str, bytes]]:
        """(host, request target) -> (status, content type or Location, body), pre-rendered."""
        out: dict[tuple[int, str], tuple[int, str, bytes]] = {}
        for host in range(self.spec.hosts):
            out[host, "/robots.txt"] = (200, "text/plain", ROBOTS_TXT)
        for loc, entry in self.entries.items():
            key = (loc.host, loc.key)
            if entry.kind in ("page", "private", "hidden"):
                out[key] = (200, "text/html; charset=utf-8", self.render(entry, authorities))
            elif entry.kind == "file":
                kind = "application/pdf" if loc.key.endswith(".pdf") else "image/png"
                body = (b"%PDF-1.4 " if kind == "application/pdf" else b"\x89PNG ") + bytes(
                    (loc.host * 31 + i) % 256 for i in range(2048)
                )
                out[key] = (200, kind, body)
            elif entry.kind == "redirect":
                assert entry.redirect is not None
                target = entry.redirect.key
                if loc.key.startswith("/old/"):  # absolute Location; /moved/ uses a path
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


# ---------------------------------------------------------------------- the generator


def _host_entries(
    rng: random.Random, host: int, share: int, spec: SiteSpec, paragraphs: list[str]
) -> list[Entry]:
    missing = max(1, round(share * 0.03))
    redirects = max(1, round(share * 0.04))
    files = max(1, round(share * 0.04))
    pages = share - missing - redirects - files
    private = max(1, round(share * 0.03))

    def text() -> str:
        return "\n".join(f"<p>{p}</p>" for p in rng.sample(paragraphs, spec.paragraphs))

    out = [Entry(Loc(host, "/"), "page", text=text())]
    for n in range(1, pages):
        key = f"/list?cat={n % 7}&page={n}" if n % 10 == 0 else f"/s{n % DIRECTORIES}/{n}.html"
        out.append(Entry(Loc(host, key), "page", text=text()))
    for n in range(files):
        key = f"/files/doc{n}.pdf" if n % 2 == 0 else f"/img/pic{n}.png"
        out.append(Entry(Loc(host, key), "file"))
    html_pages = out[:pages]
    for n in range(redirects):
        key = f"/old/{n}.html" if n % 3 else f"/moved/{n}"
        target = rng.choice(html_pages).loc
        out.append(Entry(Loc(host, key), "redirect", redirect=target, status=302 if n % 3 else 301))
    out.extend(Entry(Loc(host, f"/gone/{n}.html"), "missing", status=404) for n in range(missing))
    out.extend(Entry(Loc(host, f"/hidden/{n}.html"), "hidden", text=text()) for n in range(private))
    out.extend(
        Entry(Loc(host, f"{DISALLOWED_PREFIX}{n}.html"), "private", text=text())
        for n in range(private)
    )
    for page in html_pages[1:]:
        if rng.random() < 0.05:
            page.base = f"/s{rng.randrange(DIRECTORIES)}/"
    return out


def _link_host(
    rng: random.Random, entries: list[Entry], by_host: list[list[Entry]], spec: SiteSpec
) -> None:
    pages = [e for e in entries if e.kind == "page"]
    hidden = [e for e in entries if e.kind == "hidden"]
    private = [e for e in entries if e.kind == "private"]
    public = [e for e in entries if e.kind in FETCHABLE_KINDS]
    # The tree: every public URL but the root is linked from a page drawn before it.
    order = pages[1:]
    rng.shuffle(order)
    order.insert(0, pages[0])
    for i, page in enumerate(order[1:], start=1):
        _add(rng, order[rng.randrange(i)], page.loc, same_host=True)
    for entry in entries:
        if entry.kind in ("file", "redirect", "missing", "private"):
            _add(rng, rng.choice(pages), entry.loc, same_host=True)
    for entry in private:  # only private pages lead to hidden ones
        for target in rng.sample(hidden, min(3, len(hidden))):
            _add(rng, entry, target.loc, same_host=True)
    others = [h for h in by_host if h[0].loc.host != entries[0].loc.host] or [entries]
    for page in pages:
        count = rng.randint(spec.links_per_page - 5, spec.links_per_page + 5)
        while len(page.links) < count:
            roll = rng.random()
            if roll < 0.60:
                _add(rng, page, rng.choice(public).loc, same_host=True)
            elif roll < 0.82:
                other = rng.choice(others)
                target = rng.choice(other)
                if target.kind in FETCHABLE_KINDS:
                    _add(rng, page, target.loc, same_host=False)
            elif roll < 0.92 and page.links:
                page.links.append(rng.choice(page.links))  # the very same href again
            elif roll < 0.97:
                # Under a <base>, "#top" would mean the base's directory: a URL of no page.
                raw = NOT_HTTP if page.base else ("#top", *NOT_HTTP)
                page.links.append(Link(None, raw=rng.choice(raw)))
            else:
                _add(rng, page, rng.choice(private).loc, same_host=True)
        rng.shuffle(page.links)


def _add(rng: random.Random, page: Entry, target: Loc, *, same_host: bool) -> None:
    roll = rng.random()
    if not same_host:
        form = "absolute" if roll < 0.7 else "scheme-relative"
    elif roll < 0.25:
        form = "absolute"
    elif roll < 0.30:
        form = "scheme-relative"
    elif roll < 0.65:
        form = "rooted"
    elif roll < 0.95:
        form = "relative"
    else:
        form = "dotted"
    page.links.append(
        Link(
            target,
            form=form,
            fragment=rng.choice(("sec-1", "top", "comments")) if rng.random() < 0.15 else "",
            tracking=rng.choice(TRACKING) if rng.random() < 0.10 else (),
            unsorted=rng.random() < 0.5,
            upper_scheme=form == "absolute" and rng.random() < 0.05,
            escaped_digit=rng.random() < 0.02,
        )
    )
