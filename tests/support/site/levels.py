"""The tests' shape of the site: a few small hosts whose link depths do not depend on crawl order.

``generate(seed, hosts, pages_per_host)`` draws it from ``random.Random(seed)``. The one seed is
host 0's root; the other hosts' roots are at depth 1. Per host:

    /                    the host's root page; it has <base href="/docs/">, so its relative links
                         resolve under /docs/ (a crawler ignoring <base> asks for /N.html: a 404
                         that is not in the expected sets)
    /docs/N.html         HTML pages
    /list?cat=C&page=P   HTML pages whose canonical query is sorted; links write it either way
    /files/docN.pdf      application/pdf  } 200, not HTML, never parsed (their bytes hold an
    /img/picN.png        image/png        } <a href> to a URL not on the site); linked, but a
                                            default crawl skips them by extension
    /old/N.html          301 to a page of the same host  } a page linking a redirect also links
    /moved/N             302 to a page of the same host  } its target directly
    /private/N.html      HTML pages disallowed by robots.txt; they link /hidden/N.html pages that
                         nothing else links, so a crawler that ignores robots finds extra URLs
    anything else        404 (pages link some /gone/N.html and /docs/N.html that do not exist)

Public pages are drawn in levels: a page of level L >= 1 is linked from a page of level L - 1,
and every other link goes from a page of depth ``d`` to a URL of depth ``d + 1``, or back to the
seed or a depth-1 URL, which are admitted before any deeper page is fetched. So the BFS depth is
exact even for a crawler that admits a URL at the depth of whichever link it sees first; a
redirect counts like a link (target at ``d + 1``), and since its target is also linked directly,
it has depth ``d`` either way.
"""

from __future__ import annotations

import html
import random

from tests.support.site.model import TRACKING_PARAMS, Entry, Form, Kind, Link, Loc, Site

__all__ = ["generate"]

MAX_LEVEL = 6  # public pages get depths 1..MAX_LEVEL (fewer if the site is small)

_WORDS = (
    "crawler frontier shard politeness robots fetch parse link queue stream consumer lease worker",
    "dispatcher canonical fragment redirect budget depth scope trace span",
)


def generate(seed: int, hosts: int, pages_per_host: int) -> Site:
    drawing = _Drawing(seed, hosts, pages_per_host)
    drawing.draw()
    return Site(hosts, drawing.entries, (Loc(0, "/"),))


class _Drawing:
    def __init__(self, seed: int, hosts: int, pages_per_host: int) -> None:
        if hosts < 1 or pages_per_host < 4:
            raise ValueError("need at least 1 host and 4 pages per host")
        self.rng = random.Random(seed)
        self.hosts = hosts
        self.pages_per_host = pages_per_host
        self.entries: dict[Loc, Entry] = {}
        self.by_level: dict[int, list[Entry]] = {}

    def draw(self) -> None:
        self._public_pages()
        self._forward_links()
        for host in range(self.hosts):
            self._terminals(host)
            self._redirects(host)
            self._private_area(host)
        for page in self.entries.values():
            if page.kind not in ("page", "private", "hidden"):
                continue
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
            page = self._page(loc, "page", ranks[level])
            if loc.key == "/":
                page.base = "/docs/"
            self.by_level.setdefault(page.level, []).append(page)

    def _page(self, loc: Loc, kind: Kind, level: int = -1) -> Entry:
        words = " ".join(self.rng.choices(" ".join(_WORDS).split(), k=self.rng.randint(8, 20)))
        text = f'<p>{html.escape(words)}</p>\n<p id="sec-2">{html.escape(words)}</p>'
        page = Entry(loc, kind, text=text, level=level)
        self.entries[loc] = page
        return page

    def _forward_links(self) -> None:
        rng = self.rng
        for level in sorted(self.by_level)[1:]:
            parents = self.by_level[level - 1]
            for page in self.by_level[level]:
                for parent in rng.sample(parents, min(len(parents), rng.choice((1, 1, 2, 3)))):
                    self._link(parent, page.loc)

    def _link(self, page: Entry, target: Loc) -> None:
        """A link to an http target, written in a random (valid) form, sometimes twice."""
        rng = self.rng
        fragment = rng.choice(("", "", "", "top", "sec-2"))
        tracking: tuple[tuple[str, str], ...] = ()
        if rng.random() < 0.2:
            names = rng.sample(sorted(TRACKING_PARAMS), rng.randint(1, 2))
            tracking = tuple((name, rng.choice(("news", "x1", "abc123"))) for name in names)
        unsorted = bool(target.query) and rng.random() < 0.6
        form = self._form(page, target)
        page.links.append(Link(target, form, fragment, tracking, unsorted))
        if rng.random() < 0.25:
            page.links.append(Link(target, self._form(page, target)))

    def _form(self, page: Entry, target: Loc) -> Form:
        rng = self.rng
        if target.host != page.loc.host:
            return rng.choice(("absolute", "absolute", "scheme-relative"))
        if page.base is not None and rng.random() < 0.6:
            return "relative"  # resolved against the <base>
        return rng.choice(("rooted", "rooted", "relative", "absolute"))

    def _linkers(self, level: int, count: int) -> list[Entry]:
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
            self.entries[pdf] = Entry(pdf, "file", content_type="application/pdf", body=body)
            png = Loc(host, f"/img/pic{index}.png")
            body = b'\x89PNG\r\n\x1a\n<a href="/png-trap.html">not a page</a>'
            self.entries[png] = Entry(png, "file", content_type="image/png", body=body)
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
            for page in self.entries.values()
            if page.kind == "page"
            and page.loc.host == host
            and page.level >= 1
            and page.loc.key != "/"
        ]
        for index, target in enumerate(rng.sample(targets, min(2, len(targets))), start=1):
            status = 301 if index == 1 else 302
            loc = Loc(host, f"/old/{index}.html" if status == 301 else f"/moved/{index}")
            absolute = rng.random() < 0.5
            self.entries[loc] = Entry(
                loc, "redirect", status=status, redirect=target.loc, absolute=absolute
            )
            parents = [p for p in self.by_level[target.level - 1] if _links_to(p, target.loc)]
            for parent in rng.sample(parents, min(len(parents), rng.randint(1, 2))):
                self._link(parent, loc)

    def _private_area(self, host: int) -> None:
        rng = self.rng
        count = max(2, self.pages_per_host // 10)
        hidden = [self._page(Loc(host, f"/hidden/{i}.html"), "hidden") for i in range(1, count + 1)]
        for index in range(1, count + 1):
            private = self._page(Loc(host, f"/private/{index}.html"), "private")
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

    def _decorations(self, page: Entry) -> None:
        rng = self.rng
        if page.level >= 1:  # back links to URLs of depth <= 1
            self._link(page, Loc(page.loc.host, "/"))
            if rng.random() < 0.4:
                self._link(page, Loc(0, "/"))
            if rng.random() < 0.4:
                self._link(page, rng.choice(self.by_level[1]).loc)
        if page.base is None and rng.random() < 0.5:  # under a <base>, "" and "#x" mean the base
            page.links.append(Link(None, raw=rng.choice(("#top", "#sec-2", ""))))
        for raw in rng.sample(
            ["mailto:webmaster@example.com", "javascript:void(0)", "tel:+15555550100"],
            rng.randint(0, 2),
        ):
            page.links.append(Link(None, raw=raw))


def _links_to(page: Entry, target: Loc) -> bool:
    return any(link.target == target for link in page.links)
