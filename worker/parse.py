"""Link and title extraction from an HTML page: the worker's CPU hot path.

``extract`` parses with selectolax's lexbor engine and returns a ``Page``: the title and the
canonical outlinks of ``<a href>`` and ``<area href>``, resolved against the first
``<base href>`` (itself resolved against the page URL) or else the page URL. Links are
canonicalized by the crawl's ``UrlRules`` through a ``LinkCanonicalizer``, whose cache makes a link
seen before cost a dict lookup instead of a parse; what does not canonicalize (``mailto:``,
``javascript:``, garbage) is counted in ``invalid_links``, not raised. ``rel=nofollow`` links are
kept: the hint is about ranking, and scope rules decide what gets crawled.

The bytes are decoded by the HTTP charset when it names a codec Python knows (the HTML standard
puts the transport's charset above a ``<meta>`` declaration); otherwise lexbor detects the
encoding (byte-order mark, then ``<meta charset>``), falling back to UTF-8. Undecodable bytes
become U+FFFD. No input makes ``extract`` raise.

lexbor builds a tree in time that grows with the square of its depth: a hostile page of a
hundred thousand nested elements would hold a worker for many seconds. A page with very many
tags (``DEPTH_SCAN_TAGS``; an ordinary page has far fewer, and pays one byte count) is scanned
for its nesting first and read only up to where it passes ``MAX_DEPTH`` elements, as browsers
cap a tree's depth; its ``Page`` says so (``cut_at_depth``).
"""

from __future__ import annotations

import codecs
import re
from contextlib import suppress
from dataclasses import dataclass
from functools import lru_cache

from selectolax.lexbor import LexborHTMLParser

from jetcrawl.contract.errors import UrlError
from jetcrawl.contract.urls import LinkCanonicalizer

__all__ = ["DEPTH_SCAN_TAGS", "MAX_DEPTH", "Page", "depth_end", "extract"]

_LINKS = "a[href], area[href]"
MAX_DEPTH = 2_048  # elements open at once, beyond which a page is read no further
DEPTH_SCAN_TAGS = 20_000  # "<" bytes in a page above which its depth is checked
_TAG = re.compile(rb"<(/?)([A-Za-z][A-Za-z0-9-]*)[^>]*?(/?)>")
# Elements that never hold others: they open and close at once.
_VOID = frozenset(b"area base br col embed hr img input link meta param source track wbr".split())
_UTF8 = "utf-8"
_BOMS = (codecs.BOM_UTF8, codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
# The HTML standard reads these labels as windows-1252 (which Python's latin-1 is not in 0x80-0x9F).
_WINDOWS_1252_LABELS = frozenset(
    {"iso-8859-1", "iso8859-1", "latin1", "latin-1", "us-ascii", "ascii"}
)


@dataclass(frozen=True, slots=True)
class Page:
    """What the crawl keeps of an HTML page."""

    title: str | None  # the first <title>'s text, whitespace collapsed; None if absent or blank
    links: tuple[str, ...]  # canonical, unique, in document order, without the page's own URL
    invalid_links: int  # hrefs that do not canonicalize (mailto:, javascript:, garbage)
    cut_at_depth: bool = False  # nested deeper than MAX_DEPTH: read up to there only


def extract(html: bytes, page_url: str, charset: str | None, canonical: LinkCanonicalizer) -> Page:
    """The title and outlinks of the HTML page ``html`` fetched from ``page_url`` (canonical)."""
    cut = html.count(b"<") > DEPTH_SCAN_TAGS and (end := depth_end(html)) is not None
    if cut:
        html = html[:end]
    tree = _parse(html, charset)

    base = page_url
    for base_node in tree.tags("base"):  # the first <base> with an href counts, as in browsers
        base_href = base_node.attrs.get("href")
        if base_href is not None:
            # A base that is no http(s) URL is ignored, as browsers ignore it for links.
            with suppress(UrlError):
                base = canonical.rules.canonicalize(base_href, base=page_url)
            break

    # tags() walks the tree without starting the CSS engine, a cost per page; only a page with an
    # image map needs the selector that keeps <a> and <area> in document order.
    nodes = tree.css(_LINKS) if tree.tags("area") else tree.tags("a")
    seen_hrefs: set[str] = set()
    links: dict[str, None] = {}  # an ordered set
    invalid = 0
    link = canonical.on_page(base)
    for node in nodes:
        href = node.attrs.get("href")
        if href is None or href in seen_hrefs:  # the same text canonicalizes the same way
            continue
        seen_hrefs.add(href)
        url = link(href)
        if url is None:
            invalid += 1
        else:
            links[url] = None
    links.pop(page_url, None)

    title = None
    titles = tree.tags("title")
    if titles:
        title = " ".join(titles[0].text(deep=True).split()) or None
    return Page(title=title, links=tuple(links), invalid_links=invalid, cut_at_depth=cut)


def depth_end(html: bytes) -> int | None:
    """Where ``html`` first has more than ``MAX_DEPTH`` elements open, or None. An estimate of
    the HTML tree's depth from its tags (void and self-closed ones do not nest; a closing tag
    closes one), which is all the guard needs: hostile nesting is never subtle."""
    depth = 0
    for tag in _TAG.finditer(html):
        if tag[1]:
            depth = max(0, depth - 1)
        elif not tag[3] and tag[2].lower() not in _VOID:
            depth += 1
            if depth > MAX_DEPTH:
                return tag.start()
    return None


def _parse(html: bytes, charset: str | None) -> LexborHTMLParser:
    codec = _codec(charset) if charset and not html.startswith(_BOMS) else None
    if codec == _UTF8:
        return LexborHTMLParser(html)  # lexbor reads bytes as UTF-8, the fast path
    if codec is not None:
        try:
            return LexborHTMLParser(html.decode(codec, "replace"))
        except (UnicodeError, LookupError):  # codecs that refuse "replace" ("idna", "undefined")
            pass
    return LexborHTMLParser(html, encoding=True)


@lru_cache(maxsize=256)
def _codec(charset: str) -> str | None:
    """Python's codec for an HTTP charset label, or None to let lexbor detect the encoding."""
    label = charset.strip().lower()
    if label in _WINDOWS_1252_LABELS:
        return "cp1252"
    try:
        info = codecs.lookup(label)
    except LookupError:
        return None
    if not getattr(info, "_is_text_encoding", True):  # rot13, zlib_codec, base64_codec, ...
        return None
    return _UTF8 if info.name == _UTF8 else info.name
