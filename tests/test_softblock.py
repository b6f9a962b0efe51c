"""Soft blocks (worker/softblock.py): bot walls, CAPTCHAs and login walls served as pages are
recorded as ``blocked``, counted per host, and their links are not followed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.js import JetStreamContext

from jetcrawl.local.embedded import NatsServer
from jetcrawl.plumbing.metrics import WorkerMetrics
from jetcrawl.worker.softblock import (
    _ANY,
    _NEEDLES,
    _SCAN,
    CHALLENGE_MARKERS,
    TINY_BODY_BYTES,
    soft_block,
)
from tests.support.badsite import BadSite
from tests.test_good_citizen import crawling, drained, page, results, seed, settings_for

CLOUDFLARE = b"""<!DOCTYPE html><html lang="en-US"><head><title>Just a moment...</title>
<meta http-equiv="refresh" content="390"></head><body><div class="main-wrapper">
<noscript><div class="h2">Enable JavaScript and cookies to continue</div></noscript></div>
<script>(function(){window._cf_chl_opt={cvId: '3',cZone: 'example.com',cType: 'managed'};
var a = document.createElement('script');
a.src = '/cdn-cgi/challenge-platform/h/g/orchestrate/chl_page/v1';
document.getElementsByTagName('head')[0].appendChild(a);}());</script>
<a href="/hidden">hidden</a></body></html>"""
RECAPTCHA = b"""<html><body><form action="/verify" method="post">
<div class="g-recaptcha" data-sitekey="6Lc_aCMTAAAAABx7u2W0WPXnVbI_v6ZdbM6rYf16"></div>
<input type="submit"></form><script src="https://www.google.com/recaptcha/api.js"></script></body></html>"""
TINY_CHALLENGE = b"""<html><head><script src="/bot-detect/check.js"></script></head>
<body></body></html>"""
LOGIN_WALL = b"""<html><head><title>Sign in</title></head><body><form method="post">
<input name="user"><input name="password" type="password"><button>Sign in</button></form>
<a href="/forgot">Forgot?</a></body></html>"""
ARTICLE_ABOUT_CAPTCHAS = (
    b"<html><head><title>How CAPTCHAs work</title></head><body><h1>How CAPTCHAs work</h1>"
    + b"<p>A captcha challenge asks a person to prove they are not a bot.</p>" * 50
    + b"".join(b"<a href='/p%d'>more</a>" % n for n in range(10))
    + b"</body></html>"
)


@pytest.mark.parametrize(
    ("status", "body", "redirect_to", "signal"),
    [
        (200, CLOUDFLARE, None, "challenge_marker"),
        (403, CLOUDFLARE, None, None),  # a 403 is a status, recorded as such: not a soft block
        (200, RECAPTCHA, None, "challenge_marker"),
        (200, TINY_CHALLENGE, None, "challenge_script"),
        (200, LOGIN_WALL, None, "login_wall"),
        (302, b"", "https://a.test/login?next=%2Freport", "challenge_redirect"),
        (302, b"", "https://a.test/cdn-cgi/challenge-platform/x", "challenge_redirect"),
        (302, b"", "https://a.test/login", None),  # a login page linked to is a page
        (200, ARTICLE_ABOUT_CAPTCHAS, None, None),
    ],
    ids=[
        "cloudflare",
        "cloudflare-403",
        "recaptcha",
        "tiny-challenge-script",
        "login-wall",
        "redirect-to-login",
        "redirect-to-challenge",
        "plain-login-redirect",
        "article-about-captchas",
    ],
)
def test_the_signals(status: int, body: bytes, redirect_to: str | None, signal: str | None) -> None:
    assert soft_block(status, body, redirect_to) == signal


@pytest.mark.parametrize("marker", CHALLENGE_MARKERS)
def test_every_marker_is_found_in_any_case_beside_the_words_inside_it(marker: bytes) -> None:
    # one pass finds every needle: a marker that holds a challenge word ("g-recaptcha" holds
    # "captcha"), or follows one, is still a marker, in a page too big to be a tiny challenge
    filler = b"<p>" + b"plain words " * (TINY_BODY_BYTES // 12) + b"</p>"
    body = (
        b"<html><body><p>captcha password " + marker.upper() + b"</p>" + filler + b"</body></html>"
    )
    assert soft_block(200, body, None) == "challenge_marker"
    assert soft_block(200, body.replace(marker.upper(), b"nothing"), None) is None


@given(st.lists(st.sampled_from([*_NEEDLES, *(n[:-1] for n in _NEEDLES), b"x", b"-", b" "])))
def test_the_quick_check_finds_a_needle_exactly_when_the_full_scan_does(parts: list[bytes]) -> None:
    # soft_block stops at the leftmost search when it finds nothing: that must mean no needle
    text = b"".join(parts)
    assert bool(_ANY.find_matches_as_indexes(text)) == bool(
        _SCAN.find_matches_as_indexes(text, overlapping=True)
    )


async def test_a_bot_wall_is_recorded_as_blocked_and_not_crawled_further(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    metrics = WorkerMetrics("jetcrawl-worker", "test", "w1")
    async with BadSite() as site, crawling(settings_for(nats_server), metrics) as worker:
        site.add("/", page("/wall", "/ok"))
        site.add("/wall", CLOUDFLARE)
        site.add("/ok", page(title="ok"))
        site.add("/hidden", page(title="hidden"))
        await seed(js, [site.url("/")])
        await drained(js)
    crawled = await results(js)
    assert set(crawled) == {site.url(p) for p in ("/", "/wall", "/ok")}, "the wall's link: never"
    wall = crawled[site.url("/wall")]
    assert (wall.outcome, wall.status, wall.outlinks) == ("blocked", 200, 0)
    assert wall.error is not None and wall.error.kind == "soft_block"
    assert wall.error.message.startswith("challenge_marker")
    assert crawled[site.url("/ok")].outcome == "fetched", "the negative case: a page is a page"
    assert worker.stats.blocked == 1 and site.hits["/hidden"] == 0
    sample = metrics.registry.get_sample_value(
        "jetcrawl_soft_blocks_total", {"host": "127.0.0.1", "signal": "challenge_marker"}
    )
    assert sample == 1.0


async def test_on_block_retry_hands_a_wall_back_until_it_lifts(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    settings = settings_for(nats_server, on_block="retry")
    async with BadSite() as site, crawling(settings):
        site.add("/", CLOUDFLARE, times=1)  # the wall once, then the page
        site.add("/", page(title="home"))
        await seed(js, [site.url("/")])
        await drained(js)
    home = (await results(js))[site.url("/")]
    assert (home.outcome, home.title, home.attempt) == ("fetched", "home", 2)
