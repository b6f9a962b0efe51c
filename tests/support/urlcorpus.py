"""A large URL corpus, the same for the golden-fingerprint test and the URL bench.

Three parts, each deterministic: every link of a bench site (``site/tree.py``) with the page it
stands on as its base; every input of WHATWG's URL test data with its base; and links generated to
look like the web's (real host shapes, IDN and IP hosts, ports, paths with escapes and dot
segments, queries with tracking parameters, fragments, relative forms, other schemes), absolute
and relative to generated pages.

``python -m tests.support.urlcorpus`` writes ``tests/golden/fingerprints.jsonl``: a first line
``{"scheme": FINGERPRINT_SCHEME}``, then ``[input, base, outcome]`` per entry, the outcome being
the canonical URL's fingerprint or ``"!reason"``. Run it only with a new ``FINGERPRINT_SCHEME``.
"""

from __future__ import annotations

import html
import json
import random
import re
import sys
from pathlib import Path

import orjson

from jetcrawl.contract.errors import UrlError
from jetcrawl.contract.urls import FINGERPRINT_SCHEME, canonicalize, fingerprint
from tests.support.site.tree import SiteSpec, generate

__all__ = ["GOLDEN", "WHATWG", "corpus", "outcome"]

GOLDEN_DIR = Path(__file__).resolve().parent.parent / "golden"
GOLDEN = GOLDEN_DIR / "fingerprints.jsonl"
WHATWG = GOLDEN_DIR / "urltestdata.json"

Entry = tuple[str, "str | None"]  # (link, base)

_HREF = re.compile(r'<a href="([^"]*)"')
_BASE = re.compile(r'<base href="([^"]*)"')
_SITE_AUTHORITIES = ["www.example.com", "shop.example.co.uk", "127.0.0.12:8080", "blog.example.org"]


def site_links(pages: int = 400) -> list[Entry]:
    """Every link on every page of a small bench site, each with its page's URL as the base."""
    site = generate(SiteSpec(hosts=len(_SITE_AUTHORITIES), pages=pages, links_per_page=30))
    out: list[Entry] = []
    for loc, entry in site.entries.items():
        if entry.kind != "page":
            continue
        page = site.url(loc, _SITE_AUTHORITIES)
        body = site.render(entry, _SITE_AUTHORITIES).decode()
        base_tag = _BASE.search(body)
        base = canonicalize(html.unescape(base_tag.group(1)), page) if base_tag else page
        out.extend((html.unescape(href), base) for href in _HREF.findall(body))
    return out


def whatwg_inputs() -> list[Entry]:
    cases = json.loads(WHATWG.read_text())
    return [(case["input"], case["base"]) for case in cases if isinstance(case, dict)]


_TLDS = ["com", "org", "net", "de", "co.uk", "fr", "io", "jp", "com.au", "example"]
_WORDS = ["news", "shop", "blog", "api", "docs", "static", "img", "cdn", "wiki", "help", "forum",
          "store", "media", "mail", "en", "fr", "de"]  # fmt: skip
_IDN = [
    "bücher",
    "münchen",
    "例え",
    "пример",
    "ελληνικά",
    "café",
    "straße",
    "☃",
    "".join(chr(ord(c) + 0xFEE0) for c in "EXAMPLE"),
]  # full-width, which UTS #46 maps
_IPS = ["127.0.0.1", "10.0.0.1", "192.168.1.20", "0x7f.0.0.1", "127.1", "2130706433", "[::1]",
        "[2001:DB8::1]", "[::ffff:192.168.0.1]", "0177.0.0.1"]  # fmt: skip
_SEGMENTS = ["index.html", "a", "b", ".", "..", "%2e", "%7Euser", "%2F", "ü", "a b", "%zz",
             "it's", "p|q", "{x}", "~tilde", ";jsessionid=1", "caf%C3%A9", "%41", "",
             "x.pdf"]  # fmt: skip
_KEYS = ["id", "page", "q", "sort", "utm_source", "utm_medium", "gclid", "fbclid", "sid",
         "ref", "a", "B", "%75tm_x", "lang", "x'y"]  # fmt: skip
_VALUES = ["1", "42", "", "a b", "%2F", "é", "x'y", "=", "?", "a+b", "%7e", "true"]
_FRAGMENTS = ["", "", "", "#top", "#", "#a?b", "#ü"]
_RELATIVE = ["", "./", "../", "../../", "/", "//", "///", "?", "#", "\\", "\\\\", "/\\",
             "http:", "https:", "HTTP://", "mailto:x@", "javascript:", "data:,",
             "file:///"]  # fmt: skip


def _host(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.08:
        return rng.choice(_IPS)
    label = rng.choice(_IDN) if roll < 0.18 else rng.choice(_WORDS) + str(rng.randrange(100))
    host = f"{label}.{rng.choice(_TLDS)}"
    if rng.random() < 0.5:
        host = f"{rng.choice(['www', 'm', 'en', 'WWW'])}.{host}"
    if rng.random() < 0.03:
        host += "."
    return host


def _path(rng: random.Random) -> str:
    return "/" + "/".join(rng.choice(_SEGMENTS) for _ in range(rng.randrange(5)))


def _query(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return ""
    pairs = [f"{rng.choice(_KEYS)}={rng.choice(_VALUES)}" for _ in range(rng.randrange(1, 5))]
    return "?" + "&".join(pairs)


def _absolute(rng: random.Random) -> str:
    scheme = rng.choice(["http", "https", "https", "HTTP"])
    port = rng.choice(["", "", "", "", ":80", ":443", ":8080", ":0080"])
    userinfo = "user:pw@" if rng.random() < 0.02 else ("@" if rng.random() < 0.01 else "")
    return (
        f"{scheme}://{userinfo}{_host(rng)}{port}{_path(rng)}{_query(rng)}{rng.choice(_FRAGMENTS)}"
    )


def generated(count: int = 8000, seed: int = 30) -> list[Entry]:
    """Links as pages write them: about half absolute, half relative to a generated page."""
    rng = random.Random(seed)
    out: list[Entry] = []
    for _ in range(count):
        if rng.random() < 0.5:
            out.append((_absolute(rng), None))
            continue
        base = canonicalize(f"https://{_host(rng).strip('.')}/dir/page.html?x=1")
        link = rng.choice(_RELATIVE) + _path(rng).lstrip("/") + _query(rng)
        out.append((link + rng.choice(_FRAGMENTS), base))
    return out


def corpus() -> list[Entry]:
    """The whole corpus, without repeats, in a fixed order."""
    return list(dict.fromkeys(site_links() + whatwg_inputs() + generated()))


def outcome(link: str, base: str | None) -> str:
    """What the golden file keeps of one entry: the fingerprint, or ``!reason``."""
    try:
        return fingerprint(canonicalize(link, base))
    except UrlError as e:
        return f"!{e.reason}"


def write_golden(path: Path = GOLDEN) -> int:
    lines = [orjson.dumps({"scheme": FINGERPRINT_SCHEME})]
    entries = corpus()
    lines.extend(orjson.dumps([link, base, outcome(link, base)]) for link, base in entries)
    path.write_bytes(b"\n".join(lines) + b"\n")
    return len(entries)


if __name__ == "__main__":
    written = write_golden()
    print(
        f"{GOLDEN}: {written} URLs under fingerprint scheme {FINGERPRINT_SCHEME}", file=sys.stderr
    )
