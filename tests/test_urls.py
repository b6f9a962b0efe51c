"""The URL rules: canonical form, rejections, fingerprint, shard function vs nats-server, scope."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urljoin

import nats
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from jetcrawl.contract.errors import UrlError
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.urls import (
    _C0_CONTROL_OR_SPACE,
    DEFAULT_MAX_LENGTH,
    DEFAULT_TRACKING,
    LinkCanonicalizer,
    UrlRules,
    _canonical_general,
    canonicalize,
    fingerprint,
    fnv1a_32,
    host_of,
    in_scope,
    registered_domain,
    scope_root,
    shard_of,
)
from jetcrawl.local.embedded import NatsServer


def _fullwidth(ascii_text: str) -> str:
    """The full-width form of ASCII letters and digits, which UTS #46 maps back."""
    return "".join(chr(ord(c) + 0xFEE0) for c in ascii_text)


REASONS = {"invalid", "unsupported_scheme", "userinfo", "too_long", "no_host", "invalid_host"}


# --- canonical form, rule by rule ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        # scheme and host lowercase; the path keeps its case
        ("HTTP://Example.COM/Path", "http://example.com/Path"),
        ("hTTpS://WWW.example.com", "https://www.example.com/"),
        # IDNA: unicode hosts become A-labels (UTS #46: case folded, full-width mapped)
        ("http://bücher.example/", "http://xn--bcher-kva.example/"),
        ("http://BÜCHER.example/", "http://xn--bcher-kva.example/"),
        ("http://例え.テスト/", "http://xn--r8jz45g.xn--zckzah/"),
        ("http://ß.de/", "http://xn--zca.de/"),  # IDNA 2008, non-transitional: ß stays ß
        (f"http://{_fullwidth('EXAMPLE')}.com/", "http://example.com/"),
        ("http://ex%61mple.com/", "http://example.com/"),
        ("http://example.com./", "http://example.com/"),
        # default ports dropped, others kept in plain decimal
        ("http://example.com:80/", "http://example.com/"),
        ("https://example.com:443/", "https://example.com/"),
        ("http://example.com:443/", "http://example.com:443/"),
        ("https://example.com:80/", "https://example.com:80/"),
        ("http://example.com:8080", "http://example.com:8080/"),
        ("http://example.com:0080/", "http://example.com/"),
        ("http://example.com:/", "http://example.com/"),
        # IP literals
        ("http://127.0.0.1:8080/", "http://127.0.0.1:8080/"),
        ("http://[2001:DB8:0:0::1]:80/", "http://[2001:db8::1]/"),
        # IPv4 in hex, octal and short forms: dotted quads (the SSRF guard judges them after)
        ("http://127.1/", "http://127.0.0.1/"),
        ("http://0x7f.0.0.1/", "http://127.0.0.1/"),
        ("http://0177.0.0.1/", "http://127.0.0.1/"),
        ("http://0xffffffff/", "http://255.255.255.255/"),
        ("http://[::ffff:127.0.0.1]/", "http://[::ffff:7f00:1]/"),
        # hosts WHATWG takes: symbols UTS #46 allows, empty and long labels, "xn--" checked
        ("http://ex*ample.com/", "http://ex*ample.com/"),
        ("http://a..b/", "http://a..b/"),
        (f"http://{'a' * 64}.example/", f"http://{'a' * 64}.example/"),
        ("http://☃.example/", "http://xn--n3h.example/"),
        # an empty userinfo is dropped; "http:host" and three slashes still name a host
        ("https://@example.com/", "https://example.com/"),
        ("http:example.com/a", "http://example.com/a"),
        ("https:/example.com/", "https://example.com/"),
        ("http:///path", "http://path/"),
        ("http://example.com.../", "http://example.com/"),
        # fragment dropped
        ("http://example.com/a#frag", "http://example.com/a"),
        ("http://example.com/a?b=1#frag?c", "http://example.com/a?b=1"),
        ("http://example.com/#", "http://example.com/"),
        # dot segments
        ("http://example.com/a/./b/../c", "http://example.com/a/c"),
        ("http://example.com/../../a", "http://example.com/a"),
        ("http://example.com/a/b/..", "http://example.com/a/"),
        ("http://example.com/a/.", "http://example.com/a/"),
        ("http://example.com/a/%2e%2E/b", "http://example.com/b"),
        ("http://example.com/a/.b/..c/", "http://example.com/a/.b/..c/"),
        ("http://example.com/a//b", "http://example.com/a//b"),
        # empty path
        ("http://example.com", "http://example.com/"),
        ("http://example.com?x=1", "http://example.com/?x=1"),
        # percent-encoding
        ("http://example.com/%7euser", "http://example.com/~user"),
        ("http://example.com/%41%62%2D", "http://example.com/Ab-"),
        ("http://example.com/a%2fb", "http://example.com/a%2Fb"),
        ("http://example.com/%c3%a9", "http://example.com/%C3%A9"),
        ("http://example.com/café", "http://example.com/caf%C3%A9"),
        ("http://example.com/a b", "http://example.com/a%20b"),
        ("http://example.com/p|i^p{e}", "http://example.com/p%7Ci%5Ep%7Be%7D"),
        ("http://example.com/100%", "http://example.com/100%25"),
        ("http://example.com/%zz%4", "http://example.com/%25zz%254"),
        ("http://example.com/;a=1,b:c@d!$&'()*+", "http://example.com/;a=1,b:c@d!$&'()*+"),
        ("http://example.com/?q=a b&r=%e2%82%ac", "http://example.com/?q=a%20b&r=%E2%82%AC"),
        ("http://example.com/?q=a+b/c?d", "http://example.com/?q=a+b/c?d"),
        ("http://example.com/?q='&r=%27", "http://example.com/?q=%27&r=%27"),  # as WHATWG
        ("http://example.com/it's", "http://example.com/it's"),
        ("http://example.com/?q=%26%3D&r=%7e", "http://example.com/?q=%26%3D&r=~"),
        # query: stable sort by key, blanks kept, empty pairs and an empty query dropped
        ("http://example.com/?b=2&a=1", "http://example.com/?a=1&b=2"),
        ("http://example.com/?b=1&a=2&b=0&a=1", "http://example.com/?a=2&a=1&b=1&b=0"),
        ("http://example.com/?b=1&a=", "http://example.com/?a=&b=1"),
        ("http://example.com/?b&a", "http://example.com/?a&b"),
        ("http://example.com/?a=1&&b=2&", "http://example.com/?a=1&b=2"),
        ("http://example.com/?", "http://example.com/"),
        ("http://example.com/?&&", "http://example.com/"),
        # tracking parameters: the set, and every utm_*
        ("http://example.com/?id=3&utm_campaign=x", "http://example.com/?id=3"),
        ("http://example.com/?utm_source=a&utm_anything=b&gclid=1&fbclid=2", "http://example.com/"),
        ("http://example.com/?%75tm_source=a&utm%5Fmedium=b&k=v", "http://example.com/?k=v"),
        (
            "http://example.com/?gclidx=1&x_utm_source=2",
            "http://example.com/?gclidx=1&x_utm_source=2",
        ),
        # whitespace around (HTML), tabs and newlines inside (dropped, as browsers do)
        ("  http://example.com/a \n", "http://example.com/a"),
        ("\thttp://exa\nmple.com/a\tb\r\n", "http://example.com/ab"),
        # backslashes before the query are slashes, as in browsers
        ("http://example.com\\a\\b?x=\\", "http://example.com/a/b?x=%5C"),
    ],
)
def test_canonical_form(url: str, expected: str) -> None:
    assert canonicalize(url) == expected
    assert canonicalize(expected) == expected


BASE = "http://example.com/dir/page.html?x=1#frag"


@pytest.mark.parametrize(
    ("link", "expected"),
    [
        ("other.html", "http://example.com/dir/other.html"),
        ("../up.html", "http://example.com/up.html"),
        ("./", "http://example.com/dir/"),
        ("/abs?b=2&a=1", "http://example.com/abs?a=1&b=2"),
        ("//cdn.example.net/s.js", "http://cdn.example.net/s.js"),
        ("?y=2", "http://example.com/dir/page.html?y=2"),
        ("?", "http://example.com/dir/page.html"),
        ("", "http://example.com/dir/page.html?x=1"),
        ("#top", "http://example.com/dir/page.html?x=1"),
        ("  sub/a b.html\n", "http://example.com/dir/sub/a%20b.html"),
        ("HTTPS://Other.example:443/x", "https://other.example/x"),
        ("http:rel", "http://example.com/dir/rel"),  # non-strict RFC 3986, as browsers
        ("///other.example/x", "http://other.example/x"),  # WHATWG: any slashes, then a host
        ("/\\/\\//other.example/../x", "http://other.example/x"),
        ("https:other.example", "https://other.example/"),  # another scheme: absolute
        ("\\\\cdn.example.net\\s.js", "http://cdn.example.net/s.js"),
    ],
)
def test_relative_links_resolve_against_the_base(link: str, expected: str) -> None:
    assert canonicalize(link, BASE) == expected


RFC3986_BASE = "http://a/b/c/d;p?q"


@pytest.mark.parametrize(
    ("reference", "expected"),
    [  # RFC 3986 section 5.4, all examples with an http result (made canonical)
        ("g", "http://a/b/c/g"),
        ("./g", "http://a/b/c/g"),
        ("g/", "http://a/b/c/g/"),
        ("/g", "http://a/g"),
        ("//g", "http://g/"),
        ("?y", "http://a/b/c/d;p?y"),
        ("g?y", "http://a/b/c/g?y"),
        ("#s", "http://a/b/c/d;p?q"),
        ("g#s", "http://a/b/c/g"),
        ("g?y#s", "http://a/b/c/g?y"),
        (";x", "http://a/b/c/;x"),
        ("g;x", "http://a/b/c/g;x"),
        ("g;x?y#s", "http://a/b/c/g;x?y"),
        ("", "http://a/b/c/d;p?q"),
        (".", "http://a/b/c/"),
        ("./", "http://a/b/c/"),
        ("..", "http://a/b/"),
        ("../", "http://a/b/"),
        ("../g", "http://a/b/g"),
        ("../..", "http://a/"),
        ("../../", "http://a/"),
        ("../../g", "http://a/g"),
        ("../../../g", "http://a/g"),
        ("../../../../g", "http://a/g"),
        ("/./g", "http://a/g"),
        ("/../g", "http://a/g"),
        ("g.", "http://a/b/c/g."),
        (".g", "http://a/b/c/.g"),
        ("g..", "http://a/b/c/g.."),
        ("..g", "http://a/b/c/..g"),
        ("./../g", "http://a/b/g"),
        ("./g/.", "http://a/b/c/g/"),
        ("g/./h", "http://a/b/c/g/h"),
        ("g/../h", "http://a/b/c/h"),
        ("g;x=1/./y", "http://a/b/c/g;x=1/y"),
        ("g;x=1/../y", "http://a/b/c/y"),
        ("g?y/./x", "http://a/b/c/g?y/./x"),
        ("g?y/../x", "http://a/b/c/g?y/../x"),
        ("g#s/./x", "http://a/b/c/g"),
        ("g#s/../x", "http://a/b/c/g"),
        ("http:g", "http://a/b/c/g"),
        ("g//h/./", "http://a/b/c/g//h/"),  # empty segments are kept (urljoin drops them)
    ],
)
def test_rfc3986_reference_resolution_examples(reference: str, expected: str) -> None:
    assert canonicalize(reference, RFC3986_BASE) == expected


# --- rejections ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("javascript:void(0)", "unsupported_scheme"),
        ("JavaScript:alert(1)", "unsupported_scheme"),
        ("mailto:someone@example.com", "unsupported_scheme"),
        ("file:///etc/passwd", "unsupported_scheme"),
        ("data:text/html,<p>hi", "unsupported_scheme"),
        ("ftp://example.com/file", "unsupported_scheme"),
        ("tel:+15555550100", "unsupported_scheme"),
        ("http://user:pass@example.com/", "userinfo"),
        ("http://user@example.com/", "userinfo"),
        ("http://", "no_host"),
        ("http://:8080/", "no_host"),
        ("http://./", "no_host"),
        ("https://example.com:99999/", "invalid_host"),
        ("https://example.com:65536/", "invalid_host"),
        ("https://example.com:http/", "invalid_host"),
        ("https://example.com:8\u0660/", "invalid_host"),  # a non-ASCII digit
        ("http://exa mple.com/", "invalid_host"),
        ("http://exa\x00mple.com/", "invalid_host"),
        ("http://exa\x7fmple.com/", "invalid_host"),
        ("http://ex%ffample.com/", "invalid_host"),
        ("http://ex%2fample.com/", "invalid_host"),
        ("http://\u0300x.example/", "invalid_host"),  # IDNA: a label cannot start with a mark
        ("http://a\u200db.example/", "invalid_host"),  # IDNA: ZWJ out of context
        ("http://1.2.3.256/", "invalid_host"),
        ("http://example.123/", "invalid_host"),
        ("http://[::1%25eth0]/", "invalid_host"),
        ("http://[v1.future]/", "invalid_host"),
        ("http://[::1]x/", "invalid_host"),
        ("http://[::1/", "invalid_host"),
        ("http://../", "no_host"),  # WHATWG's host "..": dots only, once the trailing ones go
        ("http://[::1]:/x y\udc80", "invalid"),
        ("http://0x100000000/", "invalid_host"),  # an IPv4 number out of range
        ("http://user@/", "no_host"),
        ("", "invalid"),
        ("  \n ", "invalid"),
        ("/relative/without/base", "invalid"),
        ("//example.com/no-scheme-no-base", "invalid"),
        ("http://example.com/\ud800", "invalid"),  # a lone surrogate has no UTF-8 form
        ("http://example.com/" + "a" * 2048, "too_long"),
        ("http://example.com/?" + "k=v&" * 10_000, "too_long"),  # refused before any work
    ],
)
def test_rejections(url: str, reason: str) -> None:
    with pytest.raises(UrlError) as caught:
        canonicalize(url)
    assert caught.value.reason == reason
    assert caught.value.url == url


def test_rejection_reasons_also_hold_for_relative_links() -> None:
    with pytest.raises(UrlError, match="unsupported_scheme"):
        canonicalize("javascript:void(0)", BASE)
    with pytest.raises(UrlError, match="unsupported_scheme"):
        canonicalize("page.html", "file:///home/me/index.html")
    with pytest.raises(UrlError, match="userinfo"):
        canonicalize("//user@example.com/", BASE)


def test_max_length_counts_the_canonical_form() -> None:
    url = "http://example.com/" + "a" * 2028  # 2047 characters
    assert canonicalize(url) == url
    assert canonicalize(url + "#" + "f" * 100 + "?utm_source=x") == url
    assert canonicalize(url + "?utm_source=" + "x" * 4000) == url
    with pytest.raises(UrlError, match="too_long"):
        canonicalize(url + "bc")
    with pytest.raises(UrlError, match="too_long"):
        canonicalize("http://example.com/abc", max_length=20)
    assert canonicalize("http://example.com/ab", max_length=21) == "http://example.com/ab"


def test_tracking_params_are_configurable_and_utm_always_goes() -> None:
    url = "http://example.com/?sid=1&gclid=2&utm_x=3&k=4"
    assert canonicalize(url) == "http://example.com/?k=4&sid=1"
    assert (
        canonicalize(url, tracking_params=frozenset({"sid"})) == "http://example.com/?gclid=2&k=4"
    )
    assert "gclid" in DEFAULT_TRACKING


def test_url_rules_from_settings() -> None:
    rules = UrlRules.from_settings(Settings(max_url_length=40, tracking_params=("sid",)))
    assert rules == UrlRules(frozenset({"sid"}), 40)
    assert rules.canonicalize("/a?sid=1&gclid=2", "HTTP://Example.com/") == (
        "http://example.com/a?gclid=2"
    )
    with pytest.raises(UrlError, match="too_long"):
        rules.canonicalize("http://example.com/" + "a" * 22)
    assert UrlRules.from_settings(Settings()) == UrlRules()


# --- properties ---------------------------------------------------------------------------------

# Lists repeat their plausible entries so that a good share of the URLs are accepted (and so
# checked for idempotence) while every kind of breakage still turns up.
_SCHEMES = (
    ["http"] * 4
    + ["https"] * 4
    + ["HTTP", "hTTps", "ftp", "javascript", "mailto", "file", "data", ""]
)
_HOSTS = [
    "example.com",
    "EXAMPLE.com",
    "bücher.example",
    "BÜCHER.example",
    "xn--bcher-kva.example",
    "例え.テスト",
    f"{_fullwidth('EXAMPLE')}.com",
    "ß.de",
    "a_b.example",
    "-x-.example",
    "example.com.",
    "ex%61mple.com",
    "ex%C3%BC.com",
    "exa mple.com",
    "a..b",
    "127.0.0.1",
    "127.1",
    f"{_fullwidth('127')}.0.0.1",
    "[::1]",
    "[FE80::1]",
    "[::ffff:1.2.3.4]",
    "[::1%25eth0]",
    "",
]
_PORTS = [""] * 6 + [":", ":80", ":443", ":8080", ":0080", ":65535", ":65536", ":99999999999", ":x"]
_SEGMENTS = [".", "..", "%2e", "%2E%2e", "a", "B", "%7e", "%2f", "ü", " ", "%", "%zz", "%4",
             "a%41", "~", ";p=1", ":", "@", "[x]", "\\", "?", "#", "%00", "\x01", ""]  # fmt: skip
_KEYS = ["utm_source", "utm_x", "gclid", "fbclid", "a", "b", "A", "q", "", "%75tm_id", "a b"]
_VALUES = ["", "1", "x y", "%2F", "é", "=", "?", "/", "%", "&"]


def _text(max_size: int) -> st.SearchStrategy[str]:
    return st.text(max_size=max_size)


@st.composite
def url_ish(draw: st.DrawFn) -> str:
    """URL-shaped strings from parts: the plausible, the broken and the hostile."""
    scheme = draw(st.sampled_from(_SCHEMES))
    separator = draw(st.sampled_from(["://"] * 12 + [":", ":/", ":///", "//"]))
    userinfo = draw(st.sampled_from([""] * 12 + ["user@", "user:pw@", "@"]))
    host = draw(
        st.sampled_from(_HOSTS)
        | _text(12)
        | st.from_regex(r"[a-zA-Z0-9-]{1,12}(\.[a-zA-Z0-9-]{1,12}){0,3}", fullmatch=True)
    )
    port = draw(st.sampled_from(_PORTS))
    segments = draw(st.lists(st.sampled_from(_SEGMENTS) | _text(6), max_size=6))
    pairs = draw(
        st.lists(
            st.tuples(st.sampled_from(_KEYS) | _text(4), st.sampled_from(_VALUES) | _text(4)),
            max_size=6,
        )
    )
    with_path, with_query = draw(st.booleans()), draw(st.booleans())
    path = "/" + "/".join(segments) if segments or with_path else ""
    query = "?" + "&".join(f"{k}={v}" for k, v in pairs) if pairs or with_query else ""
    fragment = draw(st.sampled_from(["", "", "#", "#top", "#a?b=c", "#ü"]))
    padding = draw(st.sampled_from(["", "", " ", "\n\t", "\x00"]))
    return f"{padding}{scheme}{separator}{userinfo}{host}{port}{path}{query}{fragment}{padding}"


@st.composite
def relative_ish(draw: st.DrawFn) -> str:
    prefix = draw(
        st.sampled_from(
            ["", "/", "//", "./", "../", "?", "#", "http:", "\\\\", "HTTPS://", "Mailto:", "x1+.-:"]
        )
    )
    segments = draw(st.lists(st.sampled_from(_SEGMENTS) | _text(4), max_size=5))
    return prefix + "/".join(segments)


def _check(url: str, base: str | None = None) -> None:
    """``canonicalize`` raises only ``UrlError``, and what it returns is a fixed point."""
    try:
        canonical = canonicalize(url, base)
    except UrlError as e:
        assert e.reason in REASONS
        return
    assert re.fullmatch(r"https?://[^/?#@\s]+/[!-~]*", canonical), canonical
    assert "#" not in canonical
    assert len(canonical) <= 2048
    assert canonicalize(canonical) == canonical
    assert canonicalize(canonical, "https://other.example/x/y") == canonical
    assert canonicalize(f"  {canonical}#fragment\n") == canonical
    host = host_of(canonical)
    assert host == host.lower()
    assert 0 <= shard_of(host, 64) < 64
    assert re.fullmatch(r"[0-9a-f]{32}", fingerprint(canonical))


@given(st.text())
@example("http://example.com/%2e%2e%2f")
@example("http://example.com/%%34%31")
@example("http://[::1]:/")
def test_any_text_canonicalizes_or_raises_url_error(url: str) -> None:
    _check(url)


@settings(max_examples=300)
@given(url_ish())
def test_url_like_strings_canonicalize_or_raise_url_error(url: str) -> None:
    _check(url)


@settings(max_examples=300)
@given(relative_ish() | st.text(), url_ish() | st.text())
def test_links_against_any_base_canonicalize_or_raise_url_error(link: str, base: str) -> None:
    _check(link, base)


@given(
    st.lists(st.sampled_from(["a", "b", ".", ".."]), min_size=1, max_size=6),
    st.sampled_from(["", "/", "./", "../"]),
    st.sampled_from(["", "?", "?k=v", "#f"]),
)
def test_resolution_agrees_with_urljoin(segments: list[str], prefix: str, suffix: str) -> None:
    """Differential check of our RFC 3986 resolution against the stdlib's.

    Empty segments are left out: ``urljoin`` collapses ``a//b`` to ``a/b``, against RFC 3986.
    """
    link = prefix + "/".join(segments) + suffix
    expected = canonicalize(urljoin(RFC3986_BASE, link))
    assert canonicalize(link, RFC3986_BASE) == expected


_PRINTABLE = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E))


def _outcome(url: str, base: str | None) -> str:
    try:
        return canonicalize(url, base)
    except UrlError as e:
        return f"UrlError {e.reason}"


def _general(url: str) -> str:
    try:
        return _canonical_general(url.strip(_C0_CONTROL_OR_SPACE), None, url, DEFAULT_TRACKING)
    except UrlError as e:
        return f"UrlError {e.reason}"


@settings(max_examples=1000)
@given(url_ish() | st.builds(lambda s: "http://" + s, _PRINTABLE))
@example("http://h:0080/a")
@example("http://h:/a/./b/../c?utm_source=x&b=2&a=1#f")
@example("HTTP://Example.COM:80")
@example("http://1.2.3.4.5/")
@example("http://999.1.1.1/")
@example("http://xn--abc.example/")
@example("http://0x7f.1/")
@example("http://a.b./?'")
def test_the_fast_path_agrees_with_the_general_one(url: str) -> None:
    """Plain http(s) URLs skip ada; what ada and our rules make of them is the same."""
    assume(len(_outcome(url, None)) <= DEFAULT_MAX_LENGTH)
    assert _outcome(url, None) == _general(url)


# One canonicalizer for every example: a cache key that reads too little of the base would hand
# a link the canonical form it had on another page.
LINKS = LinkCanonicalizer(UrlRules(), size=512)
BASES = (
    "http://example.com/",
    "http://example.com/a/b.html",
    "http://example.com/a/b.html?x=1",
    "http://example.com/a/c/",
    "https://example.com/a/b.html",
    "http://example.com:8080/a/b.html",
    "http://other.example/a/b.html",
    "http://other.example/a/b.html?q=/x/y",
    "http://127.0.0.1/a/",
)


@settings(max_examples=1000)
@given(relative_ish() | url_ish() | st.text(max_size=12), st.sampled_from(BASES))
@example("//", "http://example.com/a/b.html")
@example("\\\\", "http://example.com/a/b.html")
@example("http://", "https://example.com/a/b.html")
@example("http:///x", "http://other.example/a/b.html")
@example("/\tx", "http://example.com/a/b.html")
@example("http://example.com/ #", "http://example.com/")
@example("a b#c", "http://example.com/a/b.html")
@example("#top", "http://example.com/a/b.html?x=1")
@example("?q=1#f", "http://example.com/a/b.html?x=1")
@example("//other.example/x/../y#f", "https://example.com/a/b.html")
@example("//other.example\\x", "https://example.com/a/b.html")
@example("HTTP://Other.Example/a", "http://example.com/")
@example("Http:x", "http://example.com/a/b.html")
@example("mailto:a@example.com", "http://example.com/")
@example("1ab:x", "http://example.com/a/b.html")
@example("../x/./y/..", "http://example.com/a/c/")
@example("/a/../../b?x=/../#/..", "http://example.com/a/c/")
@example("a/%2E%2E/b/../c", "http://example.com/a/c/")
@example("a/.%2E/../c", "http://example.com/a/c/")
def test_cached_link_canonicalization_agrees_with_canonicalize(link: str, base: str) -> None:
    try:
        expected: str | None = canonicalize(link, base)
    except UrlError:
        expected = None
    assert LINKS.link(link, base) == expected
    assert LINKS.link(link, base) == expected  # and once more, from the cache


def test_a_relative_link_is_remembered_by_its_join_onto_the_page_directory() -> None:
    links = LinkCanonicalizer(UrlRules())
    assert (
        links.link("x?b=2&a=1", "http://example.com/a/b.html") == "http://example.com/a/x?a=1&b=2"
    )
    # The same text in another directory is another URL; the join's text is the same URL.
    assert (
        links.link("x?b=2&a=1", "http://example.com/c/d.html") == "http://example.com/c/x?a=1&b=2"
    )
    assert links.link("http://example.com/a/x?b=2&a=1", "http://example.com/") == (
        "http://example.com/a/x?a=1&b=2"
    )
    assert links.link("./y/../x?b=2&a=1#f", "http://example.com/a/") == (
        "http://example.com/a/x?a=1&b=2"
    )
    assert links.link("../../x", "http://example.com/a/b/c.html") == "http://example.com/x"
    assert links.link("../../x", "http://example.com/a/b/c/d.html") == "http://example.com/a/x"


def test_a_small_link_cache_forgets_and_still_answers_rightly() -> None:
    links = LinkCanonicalizer(UrlRules(), size=3)
    hrefs = [f"/p{n}?b=2&a=1#f" for n in range(10)] + ["http://Other.example/x", "mailto:x@y"]
    for _ in range(2):
        for base in ("http://example.com/a/b.html", "http://example.com:8080/c/", BASES[4]):
            for href in hrefs:
                expected = canonicalize(href, base) if not href.startswith("mailto") else None
                assert links.link(href, base) == expected


# --- fingerprint --------------------------------------------------------------------------------


def test_fingerprint_is_fixed_length_lowercase_hex_and_distinct() -> None:
    a = fingerprint("http://example.com/a")
    assert re.fullmatch(r"[0-9a-f]{32}", a)
    assert a == fingerprint("http://example.com/a")
    assert a != fingerprint("http://example.com/b")
    assert fingerprint("http://example.com/") == "9aba6a18c5a5d94534a3b99c485d4547"


# --- shard function -----------------------------------------------------------------------------


def test_fnv1a_32_reference_vectors() -> None:
    # From the FNV reference test suite (draft-eastlake-fnv, Go's hash/fnv tests).
    assert fnv1a_32(b"") == 0x811C9DC5
    assert fnv1a_32(b"a") == 0xE40C292C
    assert fnv1a_32(b"foobar") == 0xBF9CF968


# (host, shards, partition chosen by nats-server 2.15.1's partition(shards) mapping)
SERVER_VECTORS = [
    ("localhost", 16, 10),
    ("examplecom", 16, 2),
    ("xn--bcher-kva", 16, 0),
    ("a", 16, 12),
]


def test_shard_of_vectors() -> None:
    for host, shards, shard in SERVER_VECTORS:
        assert shard_of(host, shards) == shard, host
    assert shard_of("www.example.com", 64) == fnv1a_32(b"www.example.com") % 64


def _fnv1_32(data: bytes) -> int:
    h = 0x811C9DC5
    for byte in data:
        h = ((h * 0x01000193) & 0xFFFFFFFF) ^ byte
    return h


def _dotless_hosts() -> list[str]:
    """Hosts that are one NATS token each, so that the server hashes exactly the host's bytes."""
    named = ["localhost", "examplecom", "a", "xn--bcher-kva", "intranet", "host-1", "db_2"]
    return named + [f"h{i}" for i in range(100)] + [f"crawler-node-{i:03d}" for i in range(60)]


async def test_shard_of_matches_nats_server_partition(tmp_path: Path) -> None:
    shards = 16  # as in the mapping
    config = tmp_path / "mapping.conf"
    config.write_text('mappings = { "part.*": "partout.{{partition(16,1)}}.{{wildcard(1)}}" }\n')
    hosts = _dotless_hosts()
    async with NatsServer(tmp_path / "nats", config=config) as server:
        nc = await nats.connect(server.url, connect_timeout=5)
        try:
            sub = await nc.subscribe("partout.>")
            for host in hosts:
                await nc.publish(f"part.{host}", b"")
            await nc.flush()
            chosen: dict[str, int] = {}
            for _ in hosts:
                msg = await sub.next_msg(timeout=5)
                _, partition, host = msg.subject.split(".", 2)
                chosen[host] = int(partition)
        finally:
            await nc.close()
    assert set(chosen) == set(hosts)
    assert set(chosen.values()) == set(range(shards)), "the hosts should cover every partition"
    assert {host: shard_of(host, shards) for host in hosts} == chosen
    # The comparison can fail: FNV-1 (multiply before xor) or a hash of the whole subject disagree.
    assert {host: _fnv1_32(host.encode()) % shards for host in hosts} != chosen
    assert {host: shard_of(f"part.{host}", shards) for host in hosts} != chosen
    for host, vector_shards, shard in SERVER_VECTORS:
        assert vector_shards == shards and chosen[host] == shard, host


# --- hosts, domains, scope ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("http://example.com/", "example.com"),
        ("http://example.com:8080/a?b=c:d", "example.com"),
        ("https://xn--bcher-kva.example/x", "xn--bcher-kva.example"),
        ("http://127.0.0.1:9/", "127.0.0.1"),
        ("http://[::1]:8080/", "::1"),
        ("http://[2001:db8::1]/", "2001:db8::1"),
    ],
)
def test_host_of(url: str, host: str) -> None:
    assert host_of(url) == host
    assert host_of(canonicalize(url)) == host


@pytest.mark.parametrize(
    ("host", "domain"),
    [
        ("a.b.example.co.uk", "example.co.uk"),
        ("example.co.uk", "example.co.uk"),
        ("www.example.com", "example.com"),
        ("example.com", "example.com"),
        ("co.uk", "co.uk"),  # a public suffix itself
        ("com", "com"),
        ("localhost", "localhost"),
        ("127.0.0.1", "127.0.0.1"),
        ("::1", "::1"),
        ("2001:db8::1", "2001:db8::1"),
        ("foo.github.io", "foo.github.io"),  # the PSL's private section
        ("a.b.xn--bcher-kva.example", "xn--bcher-kva.example"),  # unknown TLD: one label public
        ("www.xn--mnchen-3ya.de", "xn--mnchen-3ya.de"),
        ("x.xn--fiqs8s", "x.xn--fiqs8s"),  # an IDN TLD in A-label form
    ],
)
def test_registered_domain(host: str, domain: str) -> None:
    assert registered_domain(host) == domain


def test_scope_root_and_in_scope() -> None:
    seed = canonicalize("https://www.example.co.uk/start")
    assert scope_root(seed, "host") == "www.example.co.uk"
    assert scope_root(seed, "domain") == "example.co.uk"
    assert scope_root(seed, "any") == ""

    same_host = canonicalize("https://www.example.co.uk:8443/other")
    sibling = canonicalize("http://shop.example.co.uk/")
    stranger = canonicalize("https://www.example.com/")
    for scope, inside, outside in [
        ("host", [seed, same_host], [sibling, stranger]),
        ("domain", [seed, same_host, sibling], [stranger]),
        ("any", [seed, same_host, sibling, stranger], []),
    ]:
        root = scope_root(seed, scope)
        assert all(in_scope(url, scope, root) for url in inside), scope
        assert not any(in_scope(url, scope, root) for url in outside), scope

    with pytest.raises(ValueError, match="unknown scope"):
        scope_root(seed, "galaxy")
