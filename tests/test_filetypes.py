"""The extension rule and the media types a job reads (contract/filetypes.py), as pure functions."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import posixpath
from urllib.parse import urlsplit

import pytest

from jetcrawl.contract.errors import SettingsError, UrlError
from jetcrawl.contract.filetypes import (
    IGNORED_EXTENSIONS,
    ExtensionRule,
    extension_rule,
    has_extension,
    media_types,
)
from jetcrawl.contract.messages import Discovered, Lineage
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.urls import canonicalize
from jetcrawl.dispatcher.intake import Intake
from jetcrawl.dispatcher.jobrules import follow
from tests.support.site.model import BINARY_EXTENSIONS
from tests.support.urlcorpus import corpus

DEFAULT = extension_rule(ignored=IGNORED_EXTENSIONS)


@functools.cache
def canonical_corpus() -> list[str]:
    urls = []
    for link, base in corpus():
        with contextlib.suppress(UrlError):
            urls.append(canonicalize(link, base=base))
    return urls


def scrapy_skips(url: str) -> bool:
    """Scrapy's LinkExtractor test, as scrapy.utils.url.url_has_any_extension writes it."""
    path = urlsplit(url).path.lower()
    return any(path.endswith(f".{ext}") for ext in IGNORED_EXTENSIONS)


@pytest.mark.parametrize(
    ("url", "followed"),
    [
        ("https://a.example/", True),
        ("https://a.example/products/42", True),  # no extension: a page
        ("https://a.example/a.html", True),
        ("https://a.example/a.php?file=x.pdf", True),  # the query is no part of the path
        ("https://a.example/docs/manual.pdf", False),
        ("https://a.example/docs/MANUAL.PDF", False),  # compared in lower case
        ("https://a.example/img/pic.png?w=200", False),
        ("https://a.example/dl/src.tar.gz", False),  # two dots, as Scrapy lists it
        ("https://a.example/dl/src.tgz", False),
        ("https://a.example/pdf", True),  # a word, not an extension
        ("https://a.example/files.pdf/", True),  # a directory named so
        ("https://a.example/fonts/x.woff2", False),
        ("https://a.example/style.css", False),  # an <a> to a stylesheet, as Scrapy
        ("https://a.example/x.pdf#top", False),
        ("https://a.example/a#b.pdf", True),  # nor is the fragment
        ("https://a.example?next=/x.pdf", True),  # no path at all
        ("https://files.example", True),
    ],
)
def test_the_default_rule_skips_the_ignored_extensions(url: str, followed: bool) -> None:
    assert DEFAULT.follows(url) is followed
    assert ExtensionRule().follows(url), "no rule: everything is followed"


def test_the_default_rule_is_scrapys_over_a_large_url_corpus() -> None:
    urls = canonical_corpus()
    assert len(urls) > 5000
    rule = ExtensionRule(DEFAULT.allow, DEFAULT.deny)  # the same rule, a memory of its own
    for follows in (DEFAULT.follows, rule.follows_again, rule.follows_again):  # then remembered
        differ = [url for url in urls if follows(url) == scrapy_skips(url)]
        assert not differ, differ[:5]
    assert sum(map(scrapy_skips, urls)) > 10, "the corpus has links the rule skips"


def test_the_extension_is_the_one_posixpath_finds() -> None:
    for url in canonical_corpus():
        path = urlsplit(url).path
        extension = posixpath.splitext(path.rsplit("/", 1)[-1])[1]
        assert has_extension(path) == (len(extension) > 1), url
    assert [has_extension(p) for p in ("/.htaccess", "/a.", "/..a", "/.a.b")] == [0, 0, 0, 1]


def test_allow_beats_the_default_list_and_deny_beats_allow() -> None:
    pdf = "https://a.example/f.pdf"
    assert extension_rule(allow=("pdf",), ignored=IGNORED_EXTENSIONS).follows(pdf)
    assert not extension_rule(allow=("pdf",), deny=("pdf",)).follows(pdf)
    only_html = extension_rule(allow=("html",))
    assert only_html.follows("https://a.example/x/") and only_html.follows(
        "https://a.example/a.html"
    )
    assert not only_html.follows("https://a.example/a.php")
    assert extension_rule(ignored=()).follows(pdf), "an empty default list: off"


def test_the_sites_binaries_are_all_ignored_by_default() -> None:
    """The test sites' expected crawls (skip_binaries) are what jetcrawl's default does."""
    for suffix in BINARY_EXTENSIONS:
        assert not DEFAULT.follows(f"http://127.0.0.2:1/file{suffix}"), suffix
        assert suffix[1:] in IGNORED_EXTENSIONS


def test_media_types_match_exact_whole_top_level_types_or_all() -> None:
    html = media_types(("text/html", "application/xhtml+xml"))
    assert "text/html" in html and "application/xhtml+xml" in html
    assert "text/plain" not in html and "" not in html and "image/png" not in html
    images = media_types(("image/*",))
    assert "image/png" in images and "image" not in images and "text/html" not in images
    every = media_types(("*/*",))
    assert "application/pdf" in every and "" in every


def test_the_setting_replaces_or_switches_off_the_list_and_refuses_a_bad_one() -> None:
    assert Settings().ignored_extensions == IGNORED_EXTENSIONS
    assert Settings.from_env({"JETCRAWL_IGNORED_EXTENSIONS": ""}).ignored_extensions == ()
    one = Settings.from_env({"JETCRAWL_IGNORED_EXTENSIONS": "pdf,tar.gz"})
    assert one.ignored_extensions == ("pdf", "tar.gz")
    with pytest.raises(SettingsError, match=r"ignored_extensions.*'\.pdf'"):
        Settings.from_env({"JETCRAWL_IGNORED_EXTENSIONS": ".pdf"})


def test_the_dispatcher_skips_a_spec_less_jobs_links_by_extension_but_not_its_seeds() -> None:
    intake = Intake(Settings())
    reading = intake.read("crawl.seeds", b"http://a.example/manual.pdf")
    assert follow(reading, lambda job: None, 2, IGNORED_EXTENSIONS).not_followed == 0
    assert [t.url for t in reading.tasks] == ["http://a.example/manual.pdf"]  # asked for

    lineage = Lineage("default", "host", "a.example", 5)
    page = Discovered("http://a.example/", "ab" * 16, 1, lineage, ("http://a.example/x.pdf",))
    links = dataclasses.replace(page, links=(*page.links, "http://a.example/y")).to_wire()
    reading = intake.read("crawl.discovered", links)
    assert [t.url for t in reading.tasks] == ["http://a.example/x.pdf", "http://a.example/y"]
    kept = intake.read("crawl.discovered", links)
    assert follow(kept, lambda job: None, 2, ()).not_followed == 0, "the setting off: all kept"
    assert follow(reading, lambda job: None, 2, IGNORED_EXTENSIONS).not_followed == 1
    assert [t.url for t in reading.tasks] == ["http://a.example/y"]
