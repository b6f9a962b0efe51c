"""The canonicalizer against the WHATWG URL Standard's own test data.

``tests/golden/urltestdata.json`` is web-platform-tests' ``url/resources/urltestdata.json`` (as
ada's repository vendors it in ``tests/wpt/``). For every case: what WHATWG refuses, we refuse;
what WHATWG parses to another scheme, we refuse as ``unsupported_scheme``; and an http(s) URL is
WHATWG's, after the canonical rules the README documents — computed here from WHATWG's parts,
not from our code. Beyond the data, random URL-shaped strings are checked the same way against
ada's parts (ada passes that data whole: it is WHATWG's reference here).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import ada_url
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from jetcrawl.contract.errors import UrlError
from jetcrawl.contract.urls import DEFAULT_TRACKING, canonicalize

DATA = Path(__file__).parent / "golden" / "urltestdata.json"
CASES: list[dict[str, Any]] = [
    case for case in json.loads(DATA.read_text()) if isinstance(case, dict)
]

_UNRESERVED = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
# What RFC 3986 lets stand in a path, and in a query (less "'", which WHATWG encodes there).
_PATH_ALLOWED = _UNRESERVED | set("!$&'()*+,;=:@/")
_QUERY_ALLOWED = _UNRESERVED | set("!$&()*+,;=:@/?")


def _escapes_normalized(part: str, allowed: set[str]) -> str:
    """Unreserved escapes decoded, other escapes in uppercase hex, the rest encoded as UTF-8."""
    out: list[str] = []
    i = 0
    while i < len(part):
        char = part[i]
        escape = re.fullmatch(r"%[0-9A-Fa-f]{2}", part[i : i + 3])
        if escape:
            decoded = chr(int(part[i + 1 : i + 3], 16))
            out.append(decoded if decoded in _UNRESERVED else part[i : i + 3].upper())
            i += 3
            continue
        if char in allowed:
            out.append(char)
        else:
            out.extend(f"%{byte:02X}" for byte in char.encode())
        i += 1
    return "".join(out)


def expected_by_the_rules(case: dict[str, Any]) -> str:
    """The README's canonical rules over WHATWG's parts; a rejection as ``UrlError reason``."""
    scheme = case["protocol"][:-1]
    if scheme not in ("http", "https"):
        return "UrlError unsupported_scheme"
    if case["username"] or case["password"]:
        return "UrlError userinfo"
    host = case["hostname"].rstrip(".")  # no trailing dot
    if not host:
        return "UrlError no_host"
    port = f":{case['port']}" if case["port"] else ""
    path = _escapes_normalized(case["pathname"], _PATH_ALLOWED)
    pairs = [
        pair
        for pair in _escapes_normalized(case["search"][1:], _QUERY_ALLOWED).split("&")
        if pair
        and not ((key := pair.partition("=")[0]) in DEFAULT_TRACKING or key.startswith("utm_"))
    ]
    pairs.sort(key=lambda pair: pair.partition("=")[0])  # stable
    query = "?" + "&".join(pairs) if pairs else ""
    return f"{scheme}://{host}{port}{path}{query}"  # no fragment


def ours(case: dict[str, Any]) -> str:
    try:
        return canonicalize(case["input"], case["base"])
    except UrlError as e:
        return f"UrlError {e.reason}"


def _id(case: dict[str, Any]) -> str:
    return f"{case['input']!r} on {case['base']!r}"


HTTP_CASES = [
    case for case in CASES if not case.get("failure") and case["protocol"] in ("http:", "https:")
]
OTHER_CASES = [case for case in CASES if not case.get("failure") and case not in HTTP_CASES]
FAILURES = [case for case in CASES if case.get("failure")]


def test_the_data_is_whole() -> None:
    """The file is the standard's data, not a sample: hundreds of cases of every kind."""
    assert len(CASES) > 800
    assert len(HTTP_CASES) > 240 and len(FAILURES) > 260 and len(OTHER_CASES) > 370


@pytest.mark.parametrize("case", HTTP_CASES, ids=_id)
def test_an_http_url_is_whatwgs_after_our_rules(case: dict[str, Any]) -> None:
    assert ours(case) == expected_by_the_rules(case)


@pytest.mark.parametrize("case", FAILURES, ids=_id)
def test_what_whatwg_refuses_we_refuse(case: dict[str, Any]) -> None:
    assert ours(case).startswith("UrlError ")


@pytest.mark.parametrize("case", OTHER_CASES, ids=_id)
def test_another_scheme_is_unsupported(case: dict[str, Any]) -> None:
    assert ours(case) == "UrlError unsupported_scheme"


_PIECES = st.sampled_from(
    [
        "http://",
        "https://",
        "HTTP:",
        "http:/",
        "//",
        "@",
        "user:pw@",
        ":",
        ":80",
        ":0443",
        "/",
        "\\",
        ".",
        "..",
        "%2e",
        "%41",
        "%7e",
        "%zz",
        "%",
        "?",
        "&",
        "=",
        "'",
        "#",
        "[::1]",
        "0x7f",
        "127.1",
        "xn--",
        "bücher",
        "ß",
        "\u200d",
        " ",
        "\t",
        "|",
        "{",
        "^",
        "`",
        '"',
        "utm_x=1",
        "a",
        "B",
        "example.com",
        "-",
        "_",
        "~",
        "é",
        "\x00",
        "\x7f",
    ]
)
_URLISH = st.lists(_PIECES | st.text(max_size=3), max_size=12).map("".join)


def _by_ada(url: str) -> str:
    try:
        parts = ada_url.parse_url(url)
    except ValueError:
        return "UrlError"
    return expected_by_the_rules(dict(parts))


@settings(max_examples=1000)
@given(
    st.builds(lambda scheme, rest: scheme + rest, st.sampled_from(["http://", "https:"]), _URLISH)
)
@example("http://a.b./?'")
@example("http://0x7f.1/%7e/x?b=1&a=2#f")
@example("http://[::ffff:1.2.3.4]:80/")
def test_random_urls_are_whatwgs_after_our_rules(url: str) -> None:
    expected = _by_ada(url)
    got = ours({"input": url, "base": None})
    if expected == "UrlError":
        assert got.startswith("UrlError ")
    elif len(expected) <= 2048:
        assert got == expected
