"""What a page crawl does not fetch: links by their URL's extension, bodies by their media type.

A link to an image, an archive, a video or an office document is no page: following it costs a
request, the server's bandwidth and a result record for bytes nobody parses. As Scrapy's
LinkExtractor does by default (and Nutch's suffix URL filter), a link whose lowercase path ends in
``.`` and one of ``IGNORED_EXTENSIONS`` is not followed. A job spec's ``extensions`` section adds
to the list (``deny``), takes from it (``allow``) or switches it off (``default: false``: an
archiving job); the setting ``ignored_extensions`` replaces it crawl-wide (empty: off).
:meth:`ExtensionRule.follows` is the one rule: the worker applies it before it sends a page's
links, the dispatcher at admission (seeds, which the user asked for, pass).

A response body is read only when its media type is one the job's ``content_types`` name
(:class:`MediaTypes`, which takes ``type/*`` and ``*/*``); any other is released unread.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field
from functools import lru_cache

__all__ = [
    "EXTENSION_RE",
    "IGNORED_EXTENSIONS",
    "MEDIA_TYPE_RE",
    "ExtensionRule",
    "MediaTypes",
    "extension_rule",
    "has_extension",
    "media_types",
    "path_end",
]

# Scrapy's scrapy.linkextractors.IGNORED_EXTENSIONS (2.18, in its order), which Scrapy
# compares as jetcrawl does: the lowercase path ends in "." + one of them. It holds css and js:
# both crawlers read links of <a> and <area> only (worker/parse.py), so this skips an <a> that
# points at a stylesheet or a script, not a page's own resources. Then, from Nutch's default
# suffix filter (regex-urlfilter.txt) and for fonts: gz, tgz, rpm, woff, woff2, ttf, otf, eot.
IGNORED_EXTENSIONS: tuple[str, ...] = (
    # archives
    *("7z", "7zip", "bz2", "rar", "tar", "tar.gz", "xz", "zip"),
    # images
    *("mng", "pct", "bmp", "gif", "jpg", "jpeg", "png", "pst", "psp", "tif", "tiff", "ai"),
    *("drw", "dxf", "eps", "ps", "svg", "cdr", "ico", "webp"),
    # audio
    *("mp3", "wma", "ogg", "wav", "ra", "aac", "mid", "au", "aiff"),
    # video
    *("3gp", "asf", "asx", "avi", "mov", "mp4", "mpg", "qt", "rm", "swf", "wmv", "m4a", "m4v"),
    *("flv", "webm"),
    # office suites
    *("xls", "xlsm", "xlsx", "xltm", "xltx", "potm", "potx", "ppt", "pptm", "pptx", "pps"),
    *("doc", "docb", "docm", "docx", "dotm", "dotx", "odt", "ods", "odg", "odp"),
    # other
    *("css", "pdf", "exe", "bin", "rss", "dmg", "iso", "apk", "jar", "sh", "rb", "js", "hta"),
    *("bat", "cpl", "msi", "msp", "py"),
    # Nutch's suffixes Scrapy lacks, and fonts
    *("gz", "tgz", "rpm", "woff", "woff2", "ttf", "otf", "eot"),
)
# An extension as specs and settings write it: no leading dot, dots only between ("tar.gz").
EXTENSION_RE = re.compile(r"^[a-z0-9]{1,16}(?:\.[a-z0-9]{1,16}){0,2}$")
# A media type as content_types write it: lowercase, or "type/*", or "*/*".
MEDIA_TYPE_RE = re.compile(r"^(?:\*/\*|[a-z0-9!#$&^_.+-]+/(?:\*|[a-z0-9!#$&^_.+-]+))$")
_KNOWN_URLS = 10_000  # answers an ExtensionRule keeps (all dropped at once at this many)


def has_extension(path: str) -> bool:
    """Whether the last segment of ``path`` has an extension, as ``posixpath.splitext`` finds
    one: a dot after its first character that is not a dot, and something after that dot."""
    segment = path[path.rfind("/") + 1 :]
    dot = segment.rfind(".")
    return 0 < dot < len(segment) - 1 and segment[:dot].strip(".") != ""


@dataclass(frozen=True, slots=True)
class ExtensionRule:
    """Which URLs a job follows by their path's extension (extensions without their dot)."""

    allow: frozenset[str] = frozenset()  # not empty: a path with an extension must end in one
    deny: frozenset[str] = frozenset()  # a path ending in "." + one of these is never followed

    # answers by URL, for follows_again: a worker meets the same links on page after page
    _known: dict[str, bool] = field(default_factory=dict, compare=False, repr=False)

    def follows(self, url: str) -> bool:
        """Whether a link to ``url`` is followed: its lowercase path does not end in ``.`` and a
        denied extension (deny wins) and, with an allow list, has no extension or an allowed
        one. A path without an extension (``/``, ``/products/42``) is a page."""
        return (not self.deny and not self.allow) or self._decide(url)

    def follows_again(self, url: str) -> bool:
        """``follows``, remembering the answer: for a caller that asks about the same URLs
        again and again (the skipped links of a site's pages), where working one out again
        costs several times the lookup. Mostly new URLs (admission) should ask ``follows``."""
        if not self.deny and not self.allow:
            return True
        known = self._known.get(url)
        if known is None:
            if len(self._known) >= _KNOWN_URLS:
                self._known.clear()
            known = self._known[url] = self._decide(url)
        return known

    def _decide(self, url: str) -> bool:
        end = path_end(url)
        slash = url.rfind("/", 0, end)
        if slash < url.find("://") + 3 or url.find(".", slash, end) < 0:
            return True  # no path, or most pages: a last segment without a dot
        segment = url[slash + 1 : end].lower()
        # every ending after a dot: "tar.gz" and "gz" of "src.tar.gz", as endswith would match
        endings = []
        dot = segment.find(".")
        while dot >= 0:
            endings.append(segment[dot + 1 :])
            dot = segment.find(".", dot + 1)
        if not self.deny.isdisjoint(endings):
            return False
        return not self.allow or not has_extension(segment) or not self.allow.isdisjoint(endings)


def path_end(url: str, start: int = 0) -> int:
    """Where the part of ``url`` from ``start`` that precedes any query or fragment ends."""
    end = len(url)
    for delimiter in "?#":
        found = url.find(delimiter, start, end)
        if found >= 0:
            end = found
    return end


@lru_cache(maxsize=256)
def extension_rule(
    allow: Collection[str] = (), deny: Collection[str] = (), ignored: Collection[str] = ()
) -> ExtensionRule:
    """The rule of a job: it follows ``allow`` (empty: any) and never ``deny``, nor the crawl's
    ``ignored`` list except what ``allow`` names (an explicit allow beats the default list, an
    explicit deny beats both). The collections are hashable (tuples, frozensets): the rule is
    cached, since a worker asks for it per page and specs and settings are few."""
    allowed = frozenset(allow)
    return ExtensionRule(allowed, frozenset(deny) | (frozenset(ignored) - allowed))


@dataclass(frozen=True, slots=True)
class MediaTypes:
    """The media types a job reads: exact ones, whole top-level types (``image/*``), or all."""

    exact: frozenset[str]
    top_levels: frozenset[str]  # "image" for "image/*"
    every: bool = False  # "*/*"

    def __contains__(self, media_type: object) -> bool:
        """Whether a response of ``media_type`` (lowercase, no parameters; "" for none) is read."""
        if not isinstance(media_type, str):
            return False
        if self.every or media_type in self.exact:
            return True
        top, slash, _ = media_type.partition("/")
        return bool(slash) and top in self.top_levels


@lru_cache(maxsize=256)
def media_types(names: tuple[str, ...]) -> MediaTypes:
    """``names`` as checked by ``MEDIA_TYPE_RE`` (``text/html``, ``image/*``, ``*/*``), matched."""
    exact = frozenset(n for n in names if not n.endswith("/*"))
    tops = frozenset(n[:-2] for n in names if n.endswith("/*") and n != "*/*")
    return MediaTypes(exact, tops, "*/*" in names)
