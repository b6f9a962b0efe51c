"""All URL rules of the crawler: canonical form, fingerprint, shard function and scope.

A canonical URL is what the frontier dedupes, shards and fetches. ``canonicalize`` reads any link
(absolute, or relative to a base; with HTML's whitespace around it) as the WHATWG URL Standard
does, through ada (the ``ada-url`` package, a WHATWG parser), and then applies jetcrawl's own
canonical rules; or it raises ``UrlError`` with one of these reasons:

    invalid             not a URL (unparseable, lone surrogates, relative without a base)
    unsupported_scheme  anything but http and https (javascript:, mailto:, file:, data:, ftp:, ...)
    userinfo            ``user:pass@`` in the authority (an empty ``@`` is dropped, as WHATWG does)
    no_host             an empty host, or one of dots only
    invalid_host        a host or port WHATWG refuses (bad IDNA by UTS #46, forbidden characters,
                        a bad IP literal, an IPv4 number out of range)
    too_long            longer than ``max_length`` characters once canonical

The rules on top of WHATWG's href: no fragment, no userinfo, no trailing dot on the host; escapes
of unreserved characters decoded, other escapes in uppercase hex, and every character RFC 3986
does not allow in its part (and ``'`` in a query, as WHATWG does) percent-encoded as UTF-8; query
pairs stably sorted by key, empty pairs, tracking parameters (and every ``utm_*``) removed, and no
``?`` if nothing is left. ``canonicalize`` is idempotent. ``FINGERPRINT_SCHEME`` names these rules:
it changes whenever a URL's canonical form (and so its fingerprint) may change.

The functions that take a ``canonical_url`` trust it to be the output of ``canonicalize``.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import TYPE_CHECKING
from urllib.parse import quote

from ada_url import join_url, normalize_url
from publicsuffixlist import PublicSuffixList

from jetcrawl.contract.errors import UrlError
from jetcrawl.contract.filetypes import path_end
from jetcrawl.contract.settings import DEFAULT_TRACKING_PARAMS

if TYPE_CHECKING:
    from jetcrawl.contract.settings import Settings

__all__ = [
    "DEFAULT_MAX_LENGTH",
    "DEFAULT_TRACKING",
    "FINGERPRINT_SCHEME",
    "SCOPE_ANY",
    "LinkCanonicalizer",
    "UrlRules",
    "canonicalize",
    "fingerprint",
    "fnv1a_32",
    "host_of",
    "in_scope",
    "most_repeated_segment",
    "registered_domain",
    "scope_root",
    "shard_of",
]

DEFAULT_TRACKING: frozenset[str] = frozenset(DEFAULT_TRACKING_PARAMS)
DEFAULT_MAX_LENGTH = 2048
TRACKING_PREFIX = "utm_"
SCOPE_ANY = "any"  # a crawl that may go to any host

# The version of the canonical rules. 1: RFC 3986 parsing; 2: WHATWG parsing (three slashes,
# IPv4 in hex, octal and short forms, hosts UTS #46 allows, "http:host") and "'" in a query
# written %27. tests/golden/fingerprints.jsonl holds a corpus's fingerprints under the current
# one: a change of the rules bumps this and writes that file anew (tests/support/urlcorpus.py).
FINGERPRINT_SCHEME = 2

# An input this many times longer than max_length is refused before any work: no real link shrinks
# that much, and a page full of megabyte links must not stall the worker.
_MAX_INPUT_FACTOR = 16

_SCHEMES = {"http": "80", "https": "443"}  # scheme -> default port
# What the WHATWG URL parser strips from both ends of its input: C0 controls and space.
_C0_CONTROL_OR_SPACE = "".join(map(chr, range(0x21)))

# RFC 3986: unreserved characters mean the same decoded or encoded; sub-delims, ':' and '@' may
# stand in a path segment; a query may also hold '/' and '?', but not "'", which WHATWG encodes
# there (so "?'" and "?%27" are one URL). All else is percent-encoded.
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_PATH_SAFE = "!$&'()*+,;=:@/"
_QUERY_SAFE = "!$&()*+,;=:@/?"
_PATH_CLEAN = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@/]*").fullmatch
_QUERY_CLEAN = re.compile(r"[A-Za-z0-9\-._~!$&()*+,;=:@/?]*").fullmatch
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})?")

# The hosts the fast path takes: ASCII labels that WHATWG only lowercases (UTS #46 checks a label
# starting "xn--", so those go to ada), with one trailing dot at most.
_PLAIN_HOST = re.compile(r"(?:[a-z0-9_-]+\.)*[a-z0-9_-]+\.?").fullmatch
# A last label like this makes the host an IPv4 address for WHATWG, or an error: never a name.
_NUMERIC_LABEL = re.compile(r"[0-9]+|0x[0-9a-f]*").fullmatch
# The common link: http(s), a plain host, and path and query of characters that WHATWG and
# RFC 3986 both leave as they are; what canonicalize() does to it is short, and WHATWG's.
_PLAIN_HTTP = re.compile(
    r"(https?)://([A-Za-z0-9._-]+)(?::([0-9]*))?(/[A-Za-z0-9\-._~!$&'()*+,;=:@/]*)?"
    r"(?:\?([A-Za-z0-9\-._~!$&'()*+,;=:@/?]*))?(?:#.*)?",
    re.DOTALL,
).fullmatch
# What a failed parse is read as, to name the reason: WHATWG's scheme, and for http(s) the
# authority after any slashes or backslashes (userinfo and port still in it).
_SCHEME_PREFIX = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*):").match
_AUTHORITY = re.compile(r"[/\\]*([^/\\?#]*)").match
_TAB_OR_NEWLINE = re.compile("[\t\n\r]")


_UNKNOWN = object()  # not in a LinkCanonicalizer's memory of answers
_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*").fullmatch  # lower case


def canonicalize(
    url: str,
    base: str | None = None,
    *,
    tracking_params: frozenset[str] = DEFAULT_TRACKING,
    max_length: int = DEFAULT_MAX_LENGTH,
) -> str:
    """The canonical form of ``url``, resolved against ``base`` if given; raises ``UrlError``."""
    original = url
    url = url.strip(_C0_CONTROL_OR_SPACE)
    if len(url) > _MAX_INPUT_FACTOR * max_length:
        raise UrlError("too_long", original)
    # "http://" and "https://" make a URL absolute whatever the base (WHATWG).
    plain = _PLAIN_HTTP(url)
    canonical = _canonical_plain(plain, tracking_params) if plain is not None else None
    if canonical is None:
        canonical = _canonical_general(url, base, original, tracking_params)
    if len(canonical) > max_length:
        raise UrlError("too_long", original)
    return canonical


def _canonical_general(
    url: str, base: str | None, original: str, tracking_params: frozenset[str]
) -> str:
    """Any URL: WHATWG's href by ada, then our rules (``canonicalize`` checks the length)."""
    href = _whatwg_href(url, base)
    if href is None:
        raise UrlError(_failure_reason(url, base), original)
    return _canonical_href(href, original, tracking_params)


def _whatwg_href(url: str, base: str | None) -> str | None:
    """WHATWG's href of ``url`` (against ``base``), or None where WHATWG refuses it. An absolute
    URL stands alone even when the base is not a URL."""
    try:
        return normalize_url(url) if base is None else join_url(base, url)
    except ValueError:  # refused, or lone surrogates (UnicodeEncodeError)
        if base is None:
            return None
    try:
        return normalize_url(url)
    except ValueError:
        return None


def _canonical_href(href: str, original: str, tracking_params: frozenset[str]) -> str:
    """Our rules over a WHATWG href: it is serialized, so its parts split at fixed characters."""
    scheme = href[: href.find(":")]
    if scheme not in _SCHEMES:
        raise UrlError("unsupported_scheme", original)
    start = len(scheme) + 3  # a special URL always has "//" and a path that starts with "/"
    path_start = href.index("/", start)
    authority = href[start:path_start]
    if "@" in authority:
        raise UrlError("userinfo", original)
    host, port = authority, ""
    colon = authority.rfind(":")
    if colon >= 0 and not authority.endswith("]"):
        host, port = authority[:colon], authority[colon:]
    host = host.rstrip(".")
    if not host:
        raise UrlError("no_host", original)
    end = href.find("#", path_start)
    if end < 0:
        end = len(href)
    query_start = href.find("?", path_start, end)
    path = href[path_start : query_start if query_start >= 0 else end]
    if not _PATH_CLEAN(path):
        path = _normalize_escapes(path, _PATH_SAFE)
    query = href[query_start + 1 : end] if query_start >= 0 else ""
    if query:
        query = _canonical_query(query, tracking_params)
    if query:
        return f"{scheme}://{host}{port}{path}?{query}"
    return f"{scheme}://{host}{port}{path}"


def _failure_reason(url: str, base: str | None) -> str:
    """Why WHATWG refused ``url``, as one of the reasons; ``url`` is stripped already."""
    try:
        url.encode()
    except UnicodeEncodeError:  # lone surrogates have no UTF-8 form
        return "invalid"
    url = _TAB_OR_NEWLINE.sub("", url)
    scheme = _SCHEME_PREFIX(url)
    if scheme is not None:
        if scheme.group(1).lower() not in _SCHEMES:
            return "unsupported_scheme"
        rest = url[scheme.end() :]
    elif base is not None and url[:2].replace("\\", "/") == "//":
        rest = url
    else:
        return "invalid"
    authority = _AUTHORITY(rest).group(1)  # type: ignore[union-attr]
    host = authority.rpartition("@")[2]
    if not host.startswith("["):
        host = host.partition(":")[0]
    return "invalid_host" if host.strip(".") else "no_host"


def _canonical_plain(plain: re.Match[str], tracking_params: frozenset[str]) -> str | None:
    """The fast path: an absolute http(s) URL of characters that need no escaping; None if it
    has a host or port this path leaves to the general one."""
    scheme, host, port, path, query = plain.groups()
    canonical_host = _plain_host(host)
    if canonical_host is None:
        return None
    if port:
        if port[0] == "0" or len(port) > 5 or int(port) > 65535:
            return None
        if port != _SCHEMES[scheme]:
            canonical_host = f"{canonical_host}:{port}"
    if not path:
        path = "/"
    elif "/." in path:
        path = _remove_dot_segments(path)
    if query:
        query = _canonical_query(query, tracking_params)
        if query:
            return f"{scheme}://{canonical_host}{path}?{query}"
    return f"{scheme}://{canonical_host}{path}"


@lru_cache(maxsize=4096)  # links repeat their hosts
def _plain_host(host: str) -> str | None:
    """The canonical form of an ASCII host that WHATWG would only lowercase (a dotted quad
    included), or None if WHATWG has more to do with it (IPv4 in other forms, "xn--" labels)."""
    host = host.lower()
    if not _PLAIN_HOST(host) or "xn--" in host:
        return None
    host = host.rstrip(".")
    if _NUMERIC_LABEL(host.rpartition(".")[2]):
        try:
            if str(ipaddress.IPv4Address(host)) != host:
                return None
        except ValueError:
            return None
    return host


def _canonical_query(query: str, tracking_params: frozenset[str]) -> str:
    if not _QUERY_CLEAN(query):
        query = _normalize_escapes(query, _QUERY_SAFE)
    pairs = [
        pair
        for pair in query.split("&")
        if pair and not _is_tracking(pair.partition("=")[0], tracking_params)
    ]
    if len(pairs) > 1:
        pairs.sort(key=_pair_key)  # stable: duplicate keys keep their order
    return "&".join(pairs)


def _is_tracking(key: str, tracking_params: frozenset[str]) -> bool:
    return key in tracking_params or key.startswith(TRACKING_PREFIX)


def _pair_key(pair: str) -> str:
    return pair.partition("=")[0]


def _normalize_escapes(part: str, safe: str) -> str:
    """Decode escapes of unreserved characters, uppercase the others, encode what must be."""
    if "%" in part:
        part = _ESCAPE.sub(_normalize_escape, part)
    return quote(part, safe=safe + "%")  # UTF-8; raises UnicodeEncodeError on lone surrogates


def _normalize_escape(match: re.Match[str]) -> str:
    hex_pair = match.group(1)
    if hex_pair is None:  # a '%' that starts no escape stands for itself
        return "%25"
    char = chr(int(hex_pair, 16))
    return char if char in _UNRESERVED else f"%{hex_pair.upper()}"


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 section 5.2.4 for an absolute path (one starting with '/')."""
    segments = path.split("/")
    out: list[str] = []
    for segment in segments[1:]:
        if segment == "..":
            if out:
                out.pop()
        elif segment != ".":
            out.append(segment)
    if segments[-1] in (".", ".."):
        out.append("")
    return "/" + "/".join(out)


def _without_fragment(url: str) -> str:
    """An absolute URL's fragment changes nothing: drop it from a cache key."""
    cut = url.find("#")
    return url[:cut] if cut > 0 and url[cut - 1] > " " else url


def _without_dot_segments(url: str, path_start: int) -> str:
    """``url`` (its path from ``path_start``) with RFC 3986's dot segments removed, so the ways
    of writing one URL share a cache key. A path with escapes or backslashes is left whole:
    canonicalize decodes ``%2E`` and turns backslashes into slashes before it removes them."""
    end = path_end(url, path_start)
    path = url[path_start:end]
    if "/." not in path or "%" in path or "\\" in path:  # backslashes: browsers' slashes
        return url
    return url[:path_start] + _remove_dot_segments(path) + url[end:]


def fingerprint(canonical_url: str) -> str:
    """32 lowercase hex characters naming a canonical URL (the KV key and the ``Nats-Msg-Id``)."""
    return hashlib.blake2b(canonical_url.encode(), digest_size=16).hexdigest()


_FNV32_OFFSET = 0x811C9DC5
_FNV32_PRIME = 0x01000193


def fnv1a_32(data: bytes) -> int:
    """32-bit FNV-1a, the hash of nats-server's ``partition()`` subject mapping."""
    h = _FNV32_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV32_PRIME) & 0xFFFFFFFF
    return h


def shard_of(host: str, shards: int) -> int:
    """The shard of a canonical host (no port), as nats-server's ``partition(shards)`` computes."""
    return fnv1a_32(host.encode()) % shards


def host_of(canonical_url: str) -> str:
    """The host of a canonical URL without port; IPv6 literals without their brackets."""
    start = canonical_url.index("://") + 3
    netloc = canonical_url[start : canonical_url.index("/", start)]
    if netloc.startswith("["):
        return netloc[1 : netloc.index("]")]
    return netloc.partition(":")[0]


@cache
def _public_suffix_list() -> PublicSuffixList:
    return PublicSuffixList()  # the list shipped inside the package: no network


@lru_cache(maxsize=65536)
def registered_domain(host: str) -> str:
    """The eTLD+1 of a canonical host by the Public Suffix List (ICANN and private sections).

    IP addresses, single labels and hosts that are themselves public suffixes return themselves.
    """
    if ":" in host or "." not in host or _NUMERIC_LABEL(host.rpartition(".")[2]):
        return host
    return _public_suffix_list().privatesuffix(host) or host


def scope_root(canonical_url: str, scope: str) -> str:
    """What every URL of a crawl seeded with ``canonical_url`` must share under ``scope``."""
    if scope == "host":
        return host_of(canonical_url)
    if scope == "domain":
        return registered_domain(host_of(canonical_url))
    if scope == SCOPE_ANY:
        return ""
    raise ValueError(f"unknown scope {scope!r}")


def most_repeated_segment(canonical_url: str) -> int:
    """How often the most frequent non-empty path segment occurs (a spider-trap sign).

    ``/a/b/a/b/a/b/a/b`` gives 4: relative links that resolve deeper and deeper, or calendars
    with "next" links, repeat their segments; real paths rarely repeat one more than twice.
    """
    start = canonical_url.index("/", canonical_url.index("://") + 3)
    path = canonical_url[start:].partition("?")[0]
    counts: dict[str, int] = {}
    for segment in path.split("/"):
        if segment:
            counts[segment] = counts.get(segment, 0) + 1
    return max(counts.values(), default=0)


def in_scope(canonical_url: str, scope: str, root: str) -> bool:
    """Whether ``canonical_url`` belongs to a crawl whose ``scope_root`` is ``root``."""
    if scope == SCOPE_ANY:
        return True
    return scope_root(canonical_url, scope) == root


@dataclass(frozen=True, slots=True)
class UrlRules:
    """The URL settings bundled for callers that hold a ``Settings``."""

    tracking_params: frozenset[str] = DEFAULT_TRACKING
    max_length: int = DEFAULT_MAX_LENGTH

    @classmethod
    def from_settings(cls, settings: Settings) -> UrlRules:
        return cls(frozenset(settings.tracking_params), settings.max_url_length)

    def canonicalize(self, url: str, base: str | None = None) -> str:
        return canonicalize(
            url, base, tracking_params=self.tracking_params, max_length=self.max_length
        )


class LinkCanonicalizer:
    """``UrlRules.canonicalize`` for the links of pages, behind a bounded cache.

    Pages repeat their links (navigation, footers, the same page linked from many others), and a
    canonicalization costs far more than a lookup. A link is first made absolute where that is a
    plain join — a rooted ``/path`` onto the base's origin, a relative path onto its directory
    (RFC 3986's merge, dot segments removed unless escapes or backslashes make that the
    canonicalizer's job), ``//host`` onto its scheme, ``?q`` onto its document — and an absolute
    ``http(s)://host...`` link stands as it is; the cache key is that absolute URL without its
    fragment, so one target written different ways shares an entry. ``#f`` is the page itself;
    another scheme (``mailto:``) is keyed alone. Anything else (an empty link, links with tabs,
    newlines or backslashes, which browsers rewrite, ``http:x``) is keyed with its whole base.
    ``base`` must be canonical.

    In front of that cache, answers are kept by the link's text: for links no base plays a part
    in (absolute ``http(s)://`` ones, other schemes) one memory for every page, for links only
    the base's origin plays a part in (rooted and scheme-relative ones: navigation, mostly) one
    per origin, which also keeps relative paths by their join onto the page's directory (a key
    that is the absolute URL the join makes, so it means the same as that link's text would). A
    link another page had then costs a dict lookup. ``size`` bounds these entries
    too (all are dropped at once when they reach it).
    """

    def __init__(self, rules: UrlRules, size: int = 50_000) -> None:
        self.rules = rules
        self._cached = lru_cache(maxsize=size)(self._canonical_or_none)  # (link, base)
        self._absolute = lru_cache(maxsize=size)(self._canonical_or_none)  # (absolute link)
        self._size = size
        self._anywhere: dict[str, str | None] = {}  # href -> answer, whatever the base
        self._by_origin: dict[str, dict[str, str | None]] = {}  # origin -> href -> answer
        self._remembered = 0  # entries in _anywhere and _by_origin's dicts, and those dicts

    def link(self, href: str, base: str) -> str | None:
        """The canonical form of ``href`` on a page at ``base``, or None if it has none."""
        return self.on_page(base)(href)

    def on_page(self, base: str) -> Callable[[str], str | None]:
        """``link`` for the page at ``base``, with what the base gives worked out once."""
        cached = self._cached
        path_start = base.find("/", base.find("://") + 3)
        if path_start < 0:  # not canonical: resolve everything the general way
            return lambda href: cached(href, base)
        absolute = self._absolute
        anywhere = self._anywhere
        remember = self._remember
        origin = base[:path_start]
        query = base.find("?")
        document = base[:query] if query >= 0 else base  # what "?q" replaces the query of
        directory = base[: base.rfind("/", path_start, len(document)) + 1]
        scheme = base[: base.find(":") + 1]
        known = self._by_origin.get(origin)
        if known is None:
            known = self._origin(origin)

        def link(href: str) -> str | None:
            answer = known.get(href, _UNKNOWN)
            if answer is _UNKNOWN:
                answer = anywhere.get(href, _UNKNOWN)
            if answer is not _UNKNOWN:
                return answer  # type: ignore[return-value]
            first = href[:1]
            if first == "#":
                return base  # the page itself (a canonical URL has no fragment)
            if (
                not first
                or first <= " "
                or first == "\\"
                or "\t" in href  # browsers drop tabs and newlines anywhere: the general way
                or "\n" in href
                or "\r" in href
            ):
                return cached(href, base)
            if first == "?":
                return absolute(_without_fragment(document + href))  # a new query
            if first == "/":
                second = href[1:2]
                if second == "/":  # scheme-relative: //host/path
                    after = href[2:3]
                    if not after or after <= " " or after in "/\\?#" or "\\" in href:
                        return cached(href, base)
                    url = scheme + href
                elif second == "\\":
                    return cached(href, base)
                else:
                    url = origin + href  # rooted
                    if "/." in href:
                        url = _without_dot_segments(url, path_start)
                answer = absolute(_without_fragment(url))
                remember(known, href, answer)
                return answer
            colon = href.find(":")
            if colon < 0:  # a relative path: kept by the origin's memory under its join
                url = directory + href
                answer = known.get(url, _UNKNOWN)
                if answer is _UNKNOWN:
                    joined = url
                    if first == "." or "/." in href:
                        url = _without_dot_segments(url, path_start)
                    answer = absolute(_without_fragment(url))
                    remember(known, joined, answer)
                return answer  # type: ignore[return-value]
            named = href[:colon].lower()
            if named == "http" or named == "https":
                after = href[colon + 3 : colon + 4]
                if (
                    href[colon + 1 : colon + 3] != "//"
                    or not after
                    or after <= " "
                    or after in "/\\?#"
                ):
                    return cached(href, base)  # "http:x", "http:///x": relative to the base
                answer = absolute(_without_fragment(named + href[colon:]))
            elif _SCHEME(named):  # mailto:, javascript:, ...: no base plays a part (no links)
                answer = absolute(href)
            else:  # "a/b:c" is a relative path
                return cached(href, base)
            remember(anywhere, href, answer)
            return answer

        return link

    def _origin(self, origin: str) -> dict[str, str | None]:
        self._make_room()
        known: dict[str, str | None] = {}
        self._by_origin[origin] = known
        return known

    def _remember(self, memory: dict[str, str | None], href: str, answer: str | None) -> None:
        self._make_room()  # the dict of this page stays in use until the page ends
        memory[href] = answer

    def _make_room(self) -> None:
        """Count one more entry, dropping every remembered answer first when it is full."""
        if self._remembered >= self._size:
            self._by_origin.clear()
            self._anywhere.clear()
            self._remembered = 0
        self._remembered += 1

    def _canonical_or_none(self, url: str, base: str | None = None) -> str | None:
        try:
            return self.rules.canonicalize(url, base=base)
        except UrlError:
            return None
