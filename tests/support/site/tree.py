"""The benchmark's shape of the site: many hosts, pages of ~5 KB, about 30 links each.

``generate(spec)`` draws it from ``random.Random(spec.seed)``, so the harness and the server
processes (``bench.siteserver``) build the same site from the same ``SiteSpec``. Host ``h`` listens
on ``127.0.0.{10+h}`` (``address``). Every host's root is a seed. Per host, ``spec.pages /
spec.hosts`` fetchable URLs, in these proportions:

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
others, in every form ``model.py`` writes, plus repeats, ``#top``, and non-http hrefs. Link depths
here depend on the crawl's order; the tests' depth-limited crawls use ``levels.py``.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

from tests.support.site.model import DIRECTORIES, DISALLOWED_PREFIX, Entry, Form, Link, Loc, Site

__all__ = ["SiteSpec", "address", "generate"]

FIRST_OCTET = 10  # host h listens on 127.0.0.{10 + h}
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
FETCHABLE_KINDS = frozenset({"page", "file", "redirect", "missing"})
FILE_BYTES = 2048


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


def generate(spec: SiteSpec) -> Site:
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
    return Site(spec.hosts, entries, tuple(Loc(h, "/") for h in range(spec.hosts)))


def _file(loc: Loc) -> Entry:
    pdf = loc.key.endswith(".pdf")
    head = b"%PDF-1.4 " if pdf else b"\x89PNG "
    body = head + bytes((loc.host * 31 + i) % 256 for i in range(FILE_BYTES))
    return Entry(loc, "file", content_type="application/pdf" if pdf else "image/png", body=body)


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
        out.append(_file(Loc(host, key)))
    html_pages = out[:pages]
    for n in range(redirects):
        key = f"/old/{n}.html" if n % 3 else f"/moved/{n}"
        target = rng.choice(html_pages).loc
        status = 302 if n % 3 else 301
        absolute = key.startswith("/old/")  # an absolute Location; /moved/ gives a path
        out.append(
            Entry(Loc(host, key), "redirect", status=status, redirect=target, absolute=absolute)
        )
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
    form: Form
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
