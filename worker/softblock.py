"""Soft blocks: a page that answers 200 (or redirects) but is a bot wall, a CAPTCHA or a login wall.

Such a response is no page of the site: it is recorded with the outcome ``blocked`` and the signal
that recognised it, counted per host, and may escalate (``FetchPolicy.on_block``). The signals,
checked in this order:

- ``challenge_redirect``: a redirect (followed or recorded) to a challenge or login path:
  ``/cdn-cgi/challenge-platform``, ``/captcha``, ``/challenge``, or ``/login``, ``/signin``,
  ``/sign-in``, ``/auth`` with a return parameter (``next``, ``return``, ``returnUrl``,
  ``redirect``, ``continue``);
- ``challenge_marker``: the body carries a marker of a known bot wall or CAPTCHA
  (``CHALLENGE_MARKERS``: Cloudflare, reCAPTCHA, hCaptcha, Turnstile, PerimeterX, DataDome,
  Imperva, generic "verify you are human");
- ``challenge_script``: a tiny page (under ``TINY_BODY_BYTES``) whose script or meta refresh
  names a challenge (``challenge``, ``captcha``, ``jschl``, ``bot-detect``);
- ``login_wall``: a password field on a page with fewer than ``LOGIN_WALL_MAX_LINKS`` links.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import parse_qs, urlsplit

from ahocorasick_rs import BytesAhoCorasick, Implementation, MatchKind
from selectolax.lexbor import LexborHTMLParser

__all__ = ["CHALLENGE_MARKERS", "TINY_BODY_BYTES", "soft_block"]

CHALLENGE_MARKERS: Final = (
    b"cf-browser-verification",
    b"/cdn-cgi/challenge-platform",
    b"_cf_chl_opt",
    b"cf-turnstile",
    b"attention required! | cloudflare",
    b"g-recaptcha",
    b"grecaptcha.execute",
    b"h-captcha",
    b"hcaptcha.com/1/api.js",
    b"px-captcha",
    b"captcha-delivery.com",
    b"_incapsula_resource",
    b"pardon our interruption",
    b"verify you are human",
    b"are you a robot",
)
TINY_BODY_BYTES: Final = 16 * 1024
LOGIN_WALL_MAX_LINKS: Final = 5
_CHALLENGE_PATH = re.compile(r"/(cdn-cgi/challenge-platform|captcha|challenge)(/|$|\.)", re.I)
_LOGIN_PATH = re.compile(r"/(login|signin|sign-in|auth)(/|$|\.)", re.I)
_RETURN_PARAMS = frozenset({"next", "return", "returnurl", "return_to", "redirect", "continue"})
_CHALLENGE_WORDS: Final = (b"challenge", b"captcha", b"jschl", b"bot-detect")
_CHALLENGE_WORDS_RE = re.compile(b"|".join(map(re.escape, _CHALLENGE_WORDS)), re.I)
_PASSWORD_FIELD = re.compile(rb"""type\s*=\s*["']?password""")
SCAN_BYTES = 64 * 1024  # markers and password fields are looked for in the first 64 KiB
# Every needle of the byte scan, found in one pass over the lowercased bytes (Aho-Corasick: a
# case-insensitive ``re`` alternation tries each alternative at every byte, ~2 ms for a 12 KB
# page; twenty substring searches cost ~4x this pass). Overlapping, so a word inside a marker
# ("captcha" in "g-recaptcha") is found too.
_NEEDLES: Final = (*CHALLENGE_MARKERS, *_CHALLENGE_WORDS, b"password")
_PASSWORD_ID: Final = len(_NEEDLES) - 1
_MARKER_IDS: Final = range(len(CHALLENGE_MARKERS))
_WORD_IDS: Final = range(len(CHALLENGE_MARKERS), _PASSWORD_ID)
_SCAN: Final = BytesAhoCorasick(list(_NEEDLES), implementation=Implementation.DFA)
# Whether any needle is there at all: a leftmost search skips ahead with a prefilter that the
# overlapping one cannot use (a tenth of its time, bench/RESULTS.md), and finds a match if and
# only if there is one. Most pages have none and stop there.
_ANY: Final = BytesAhoCorasick(
    list(_NEEDLES), matchkind=MatchKind.LeftmostLongest, implementation=Implementation.DFA
)


def soft_block(status: int, body: bytes, redirect_to: str | None) -> str | None:
    """The signal that makes this response a soft block, or None. ``redirect_to`` is where it
    redirected (the followed chain's end, or the Location of a recorded redirect).

    Every page passes here, so the HTML is parsed only when a byte scan hints at a challenge
    script or a password field: an ordinary page costs a lowercase copy of its first 64 KiB and
    one pass over it, not a second parse.
    """
    if redirect_to is not None and _challenge_url(redirect_to):
        return "challenge_redirect"
    if not 200 <= status < 300 or not body:
        return None
    head = body[:SCAN_BYTES].lower()
    if not _ANY.find_matches_as_indexes(head):
        return None  # most pages
    found = {needle for needle, _, _ in _SCAN.find_matches_as_indexes(head, overlapping=True)}
    if not found.isdisjoint(_MARKER_IDS):
        return "challenge_marker"
    tiny = len(body) < TINY_BODY_BYTES  # then ``head`` is the whole body
    maybe_script = tiny and not found.isdisjoint(_WORD_IDS)
    maybe_login = _PASSWORD_ID in found and _PASSWORD_FIELD.search(head) is not None
    if not (maybe_script or maybe_login):
        return None
    tree = LexborHTMLParser(body)
    if maybe_script:
        for node in tree.css("script, meta[http-equiv]"):
            said = f"{node.attrs.get('src') or ''} {node.attrs.get('content') or ''} "
            if _CHALLENGE_WORDS_RE.search(said.encode() + node.text(deep=True).encode()):
                return "challenge_script"
    if (
        maybe_login
        and tree.css_first("input[type=password]") is not None
        and len(tree.css("a[href]")) < LOGIN_WALL_MAX_LINKS
    ):
        return "login_wall"
    return None


def _challenge_url(url: str) -> bool:
    parts = urlsplit(url)
    if _CHALLENGE_PATH.search(parts.path):
        return True
    if _LOGIN_PATH.search(parts.path):
        params = {name.lower() for name in parse_qs(parts.query, keep_blank_values=True)}
        return bool(params & _RETURN_PARAMS)
    return False
