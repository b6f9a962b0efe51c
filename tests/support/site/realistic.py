"""The realistic shape of the bench site: what a crawler meets on the web, drawn from a seed.

``generate(spec)`` draws it from ``random.Random(spec.seed)``; host ``h`` listens on
``127.0.0.{10+h}`` like the tree's (``tree.address``), and every host's root is a seed. Per host,
``spec.pages / spec.hosts`` fetchable URLs:

    /, /articles/N.html, /category/C?page=N, /product/N     HTML pages of 5-200 KB (log-normal,
                                                           median ~20 KB)            200 text/html
    /images/N.jpg|png|gif|webp, /docs/N.pdf,               binaries with their real types and
    /downloads/N.zip|tar.gz, /media/N.mp4                  sizes (5 KB-5 MB, ~15 %)        200
    /r/N -> /r/N/2 [-> /r/N/3] -> a page                   redirect chains of 2-3 hops
                                                           (301, 302, 307, 308)
    /gone/N.html                                           linked, missing (~3 %)          404
    /private/N.html                                        disallowed by robots.txt (~2 % more)

Links (about ``spec.links_per_page`` a page) carry tracking and session parameters beyond
``utm_*`` (``TRACKING_PARAMS``, random values), fragments and every href form; the last host
answers each request after ``spec.slow_delay_ms`` (so politeness and concurrency matter). The
model's ``expected()`` gives the full crawl and, with ``skip_binaries=True``, the crawl of one that
skips links to binaries by extension; jetcrawl must be told to strip ``TRACKING_PARAMS``.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass

from tests.support.site.model import DISALLOWED_PREFIX, Entry, Form, Link, Loc, Site

__all__ = ["TRACKING_PARAMS", "RealisticSpec", "generate"]

# The parameters links carry that name no page: a crawler must strip every one of them.
TRACKING_PARAMS = ("utm_source", "utm_campaign", "fbclid", "gclid", "mc_cid", "sessionid", "ref")
MIN_PAGE_BYTES, MEDIAN_PAGE_BYTES, MAX_PAGE_BYTES = 5_000, 20_000, 200_000
PAGE_SIGMA = 0.9  # of the log-normal page size: ~2 % of pages reach the 200 KB cap
# Binaries: path template, content type, median and largest size in bytes, share of binaries.
BINARIES = (
    ("/images/{n}.jpg", "image/jpeg", 60_000, 800_000, 0.35),
    ("/images/{n}.png", "image/png", 30_000, 500_000, 0.2),
    ("/images/{n}.gif", "image/gif", 15_000, 200_000, 0.05),
    ("/images/{n}.webp", "image/webp", 40_000, 400_000, 0.1),
    ("/docs/{n}.pdf", "application/pdf", 300_000, 4_000_000, 0.15),
    ("/downloads/{n}.zip", "application/zip", 1_000_000, 5_000_000, 0.06),
    ("/downloads/{n}.tar.gz", "application/gzip", 1_000_000, 5_000_000, 0.04),
    ("/media/{n}.mp4", "video/mp4", 2_000_000, 5_000_000, 0.05),
)
MAGIC = {
    "image/jpeg": b"\xff\xd8\xff\xe0",
    "image/png": b"\x89PNG\r\n\x1a\n",
    "image/gif": b"GIF89a",
    "image/webp": b"RIFF\x00\x00\x00\x00WEBP",
    "application/pdf": b"%PDF-1.7\n",
    "application/zip": b"PK\x03\x04",
    "application/gzip": b"\x1f\x8b\x08\x00",
    "video/mp4": b"\x00\x00\x00\x20ftypisom",
}
SIZE_STEPS_PER_DOUBLING = 4  # binary sizes are quantized, so bodies of one size are shared
_WORDS = (
    "shop news article review price delivery contact about product category search account "
    "basket offer season guide travel weather sport music video photo story report market city"
)


@dataclass(frozen=True, slots=True)
class RealisticSpec:
    hosts: int = 20
    pages: int = 10_000  # fetchable URLs over all hosts, binaries included
    links_per_page: int = 25
    slow_delay_ms: int = 50  # the last host's fixed delay per answer; 0: no slow host
    seed: int = 1

    def __post_init__(self) -> None:
        if self.hosts < 1 or self.pages < 20 * self.hosts:
            raise ValueError("need at least 1 host and 20 pages per host")
        if self.slow_delay_ms < 0:
            raise ValueError(f"slow_delay_ms must be >= 0, got {self.slow_delay_ms}")

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def generate(spec: RealisticSpec) -> Site:
    drawing = _Drawing(spec)
    by_host = [drawing.host(h) for h in range(spec.hosts)]
    for entries in by_host:
        drawing.link(entries, by_host)
    site_entries = {entry.loc: entry for entries in by_host for entry in entries}
    delays = {spec.hosts - 1: spec.slow_delay_ms / 1000} if spec.slow_delay_ms else {}
    return Site(spec.hosts, site_entries, tuple(Loc(h, "/") for h in range(spec.hosts)), delays)


class _Drawing:
    def __init__(self, spec: RealisticSpec) -> None:
        self.spec = spec
        self.rng = random.Random(spec.seed)
        words = _WORDS.split()
        self.paragraphs = [
            "<p>" + " ".join(self.rng.choices(words, k=60)) + "</p>" for _ in range(64)
        ]
        self.bodies: dict[tuple[str, int], bytes] = {}  # shared by every file of a type and size

    def host(self, host: int) -> list[Entry]:
        spec, rng = self.spec, self.rng
        share = spec.pages // spec.hosts + (1 if host < spec.pages % spec.hosts else 0)
        binaries = round(share * 0.15)
        missing = max(1, round(share * 0.03))
        chains = max(1, round(share * 0.015))  # each of 2 or 3 hops: ~4 % of the URLs
        hops = [rng.choice((2, 3)) for _ in range(chains)]
        pages = share - binaries - missing - sum(hops)
        out = [Entry(Loc(host, "/"), "page", text=self.text())]
        for n in range(1, pages):
            match n % 10:
                case 0:
                    key = f"/category/{n % 9}?page={n}"
                case 1 | 2:
                    key = f"/product/{n}"
                case _:
                    key = f"/articles/{n}.html"
            out.append(Entry(Loc(host, key), "page", text=self.text()))
        html_pages = list(out)
        kinds = [b[:4] for b in BINARIES]
        weights = [b[4] for b in BINARIES]
        for n in range(binaries):
            template, content_type, median, largest = rng.choices(kinds, weights)[0]
            body = self.body(content_type, median, largest)
            loc = Loc(host, template.format(n=n))
            out.append(Entry(loc, "file", content_type=content_type, body=body))
        for n, length in enumerate(hops):
            keys = [f"/r/{n}"] + [f"/r/{n}/{hop}" for hop in range(2, length + 1)]
            targets = [Loc(host, k) for k in keys[1:]] + [rng.choice(html_pages).loc]
            for key, target in zip(keys, targets, strict=True):
                status = rng.choice((301, 302, 307, 308))
                absolute = rng.random() < 0.5
                out.append(
                    Entry(
                        Loc(host, key),
                        "redirect",
                        status=status,
                        redirect=target,
                        absolute=absolute,
                    )
                )
        out.extend(
            Entry(Loc(host, f"/gone/{n}.html"), "missing", status=404) for n in range(missing)
        )
        private = max(1, round(share * 0.02))
        out.extend(
            Entry(Loc(host, f"{DISALLOWED_PREFIX}{n}.html"), "private", text=self.text())
            for n in range(private)
        )
        return out

    def text(self) -> str:
        size = math.exp(self.rng.gauss(math.log(MEDIAN_PAGE_BYTES), PAGE_SIGMA))
        size = min(MAX_PAGE_BYTES, max(MIN_PAGE_BYTES, size))
        count = max(1, round(size / (len(self.paragraphs[0]) + 1)))
        return "\n".join(self.rng.choices(self.paragraphs, k=count))

    def body(self, content_type: str, median: int, largest: int) -> bytes:
        size = math.exp(self.rng.gauss(math.log(median), 1.0))
        size = min(largest, max(MIN_PAGE_BYTES, size))
        step = round(math.log2(size) * SIZE_STEPS_PER_DOUBLING)
        size = min(largest, round(2 ** (step / SIZE_STEPS_PER_DOUBLING)))
        key = (content_type, size)
        if key not in self.bodies:
            head = MAGIC[content_type]
            filler = bytes(range(256)) * (size // 256 + 1)
            self.bodies[key] = head + filler[: size - len(head)]
        return self.bodies[key]

    def link(self, entries: list[Entry], by_host: list[list[Entry]]) -> None:
        rng = self.rng
        pages = [e for e in entries if e.kind == "page"]
        # What a page may link: every fetchable URL but a chain's later hops.
        public = [
            e
            for e in entries
            if e.kind in ("page", "file", "missing")
            or (e.kind == "redirect" and e.loc.key.count("/") == 2)
        ]
        private = [e for e in entries if e.kind == "private"]
        # The tree: every page but the root is linked from a page drawn before it, so the
        # whole site is reachable from the roots; every other URL from some page.
        order = pages[1:]
        rng.shuffle(order)
        order.insert(0, pages[0])
        for i, page in enumerate(order[1:], start=1):
            self.add(order[rng.randrange(i)], page.loc, same_host=True)
        for entry in public:
            if entry.kind != "page":
                self.add(rng.choice(pages), entry.loc, same_host=True)
        for entry in private:
            self.add(rng.choice(pages), entry.loc, same_host=True)
        others = [h for h in by_host if h[0].loc.host != entries[0].loc.host] or [entries]
        for page in pages:
            count = rng.randint(self.spec.links_per_page - 10, self.spec.links_per_page + 10)
            while len(page.links) < count:
                roll = rng.random()
                if roll < 0.75:
                    self.add(page, rng.choice(public).loc, same_host=True)
                elif roll < 0.9:
                    other = rng.choice(others)
                    target = rng.choice(other)
                    if target.kind in ("page", "file"):
                        self.add(page, target.loc, same_host=False)
                elif page.links:
                    page.links.append(rng.choice(page.links))  # the very same href again
            rng.shuffle(page.links)

    def add(self, page: Entry, target: Loc, *, same_host: bool) -> None:
        rng = self.rng
        roll = rng.random()
        form: Form
        if not same_host or roll < 0.3:
            form = "absolute"
        elif roll < 0.7:
            form = "rooted"
        elif roll < 0.95:
            form = "relative"
        else:
            form = "scheme-relative"
        tracking: tuple[tuple[str, str], ...] = ()
        if rng.random() < 0.25:
            name = rng.choice(TRACKING_PARAMS)
            tracking = ((name, f"{rng.getrandbits(40):010x}"),)
        page.links.append(
            Link(
                target,
                form=form,
                fragment=rng.choice(("main", "reviews", "top")) if rng.random() < 0.1 else "",
                tracking=tracking,
            )
        )
