"""Job specs read strictly (a refusal names its field's path), and their rules as applied."""

from __future__ import annotations

from typing import Any

import pytest

from jetcrawl.contract.errors import MessageError, SpecError
from jetcrawl.contract.filetypes import IGNORED_EXTENSIONS
from jetcrawl.contract.jobs import JobSpec, StoredSpec, canonical_doc

SHOP: dict[str, Any] = {
    "name": "shop",
    "links": {
        "allow": [r"/products/", r"/category/"],
        "deny": [r"\?sort="],
        "domains": {"blog.shop.example": {"allow": [r"/posts/"]}},
    },
    "extensions": {"deny": ["pdf", "jpg"]},
    "max_depth": 3,
    "max_pages": 500,
    "recrawl_after_s": 86400,
    "plugins": ["example"],
}


def test_a_full_spec_is_read_with_its_rules() -> None:
    spec = JobSpec.read(SHOP)
    assert spec.name == "shop" and spec.max_depth == 3 and spec.max_pages == 500
    assert spec.recrawl_after_s == 86400.0 and spec.plugins == ("example",)
    assert spec.content_types == ("text/html", "application/xhtml+xml")
    assert dict(spec.doc) == SHOP


@pytest.mark.parametrize(
    ("url", "host", "followed"),
    [
        ("https://shop.example/products/1", "shop.example", True),
        ("https://shop.example/category/a?sort=price", "shop.example", False),  # deny wins
        ("https://shop.example/about", "shop.example", False),  # no allow matches
        ("https://shop.example/products/manual.pdf", "shop.example", False),  # extension
        ("https://shop.example/products/", "shop.example", True),  # no extension: a page
        ("https://blog.shop.example/posts/1", "blog.shop.example", True),  # the domain's allow
        ("https://x.blog.shop.example/posts/1", "x.blog.shop.example", True),  # a subdomain
        ("https://other.example/posts/1", "other.example", False),
    ],
)
def test_link_rules_and_extensions_decide_what_is_followed(
    url: str, host: str, followed: bool
) -> None:
    assert JobSpec.read(SHOP).follows(url, host) is followed


def test_an_extension_allow_list_admits_pages_and_the_listed_files_only() -> None:
    spec = JobSpec.read({"name": "docs", "extensions": {"allow": ["html"]}})
    assert spec.follows("https://a.example/x/", "a.example")
    assert spec.follows("https://a.example/x/page.HTML", "a.example")
    assert not spec.follows("https://a.example/x/page.zip", "a.example")
    assert spec.follows("https://a.example/a.b/c", "a.example")  # the last segment's only
    assert not spec.follows("https://a.example/c.tar.GZ?x=1.html", "a.example")  # not the query


def test_no_rules_follow_everything_but_the_crawls_ignored_extensions() -> None:
    spec = JobSpec.read({"name": "all"})
    assert spec.follows("https://a.example/file.pdf", "a.example")  # no default list given
    assert not spec.follows("https://a.example/file.pdf", "a.example", IGNORED_EXTENSIONS)
    assert spec.follows("https://a.example/file.html", "a.example", IGNORED_EXTENSIONS)
    assert spec.processes("text/html") and not spec.processes("application/pdf")
    assert not spec.processes(None)


def test_the_extensions_section_adds_to_takes_from_or_switches_off_the_default_list() -> None:
    pdf, png, php = (f"https://a.example/f.{ext}" for ext in ("pdf", "png", "php"))
    ignored = IGNORED_EXTENSIONS

    def follows(extensions: dict[str, Any], url: str) -> bool:
        spec = JobSpec.read({"name": "j", "extensions": extensions})
        return spec.follows(url, "a.example", ignored)

    assert follows({"deny": ["php"]}, pdf) is False  # deny adds to the default list
    assert follows({"deny": ["php"]}, php) is False
    assert follows({"allow": ["pdf", "html"]}, pdf) is True  # an allow beats the default ...
    assert follows({"allow": ["pdf", "html"]}, png) is False  # ... for what it names only
    assert follows({"allow": ["pdf"], "deny": ["pdf"]}, pdf) is False  # an explicit deny wins
    assert follows({"default": False}, pdf) is True  # an archiving job: everything
    assert follows({"default": False, "deny": ["php"]}, pdf) is True  # its own list instead
    assert follows({"default": False, "deny": ["php"]}, php) is False
    assert follows({"default": True}, pdf) is False


def test_content_types_take_whole_top_level_types_and_everything() -> None:
    images = JobSpec.read({"name": "j", "content_types": ["text/html", "image/*"]})
    assert images.processes("image/png") and images.processes("text/html")
    assert not images.processes("application/pdf") and not images.processes("")
    everything = JobSpec.read({"name": "j", "content_types": ["*/*"]})
    assert everything.processes("application/pdf") and everything.processes("")


@pytest.mark.parametrize(
    ("doc", "path", "problem"),
    [
        ({"name": "shop", "link": {}}, "link", "unknown field"),
        ({"links": {}}, "name", "missing"),
        ({"name": "a b"}, "name", "must match"),
        ({"name": 7}, "name", "must be a string, got a number"),
        ({"name": "s", "links": {"allow": ["a", "b", "(unclosed"]}}, "links.allow[2]", "regular"),
        ({"name": "s", "links": {"allow": "x"}}, "links.allow", "a list of strings"),
        ({"name": "s", "links": {"deny": [1]}}, "links.deny[0]", "a string"),
        ({"name": "s", "links": {"block": []}}, "links.block", "unknown field"),
        (
            {"name": "s", "links": {"domains": {"a.example": {"deny": ["["]}}}},
            "links.domains[a.example].deny[0]",
            "regular expression",
        ),
        (
            {"name": "s", "links": {"domains": {"A.example": {}}}},
            "links.domains[A.example]",
            "lowercase",
        ),
        ({"name": "s", "max_depth": -1}, "max_depth", "at least 0"),
        ({"name": "s", "max_pages": 0}, "max_pages", "at least 1"),
        ({"name": "s", "max_pages": True}, "max_pages", "got a boolean"),
        ({"name": "s", "max_pages": 2.5}, "max_pages", "a whole number"),
        ({"name": "s", "recrawl_after_s": "1d"}, "recrawl_after_s", "seconds"),
        ({"name": "s", "content_types": ["HTML"]}, "content_types[0]", "media type"),
        ({"name": "s", "extensions": {"deny": [".pdf"]}}, "extensions.deny[0]", "no dot"),
        ({"name": "s", "extensions": {"only": []}}, "extensions.only", "unknown field"),
        ({"name": "s", "extensions": {"default": "no"}}, "extensions.default", "true or false"),
        ({"name": "s", "content_types": ["*/html"]}, "content_types[0]", "media type"),
        ({"name": "s", "plugins": ["ok", "no way"]}, "plugins[1]", "entry-point name"),
        ({"name": "s", "plugins": ["a", "a"]}, "plugins", "twice"),
        ({"name": "s", "extract": []}, "extract", "an object"),
        ({"name": "s", "priority": {"default": 4}}, "priority.default", "0-3"),
        ({"name": "s", "priority": {"default": True}}, "priority.default", "0-3"),
        ({"name": "s", "priority": {"weight": 0}}, "priority.weight", "at least 1"),
        ({"name": "s", "priority": {"weight": 10**6}}, "priority.weight", "at most 1000"),
        (
            {"name": "s", "priority": {"rules": [{"match": "/p/"}]}},
            "priority.rules[0].level",
            "missing",
        ),
        (
            {"name": "s", "priority": {"rules": [{"match": "(", "level": 0}]}},
            "priority.rules[0].match[0]",
            "regular expression",
        ),
        (
            {"name": "s", "priority": {"rules": [{"match": "x", "level": -1}]}},
            "priority.rules[0].level",
            "0-3",
        ),
        ({"name": "s", "priority": {"first": 0}}, "priority.first", "unknown field"),
        ({"name": "s", "max_pages_per_s": 0}, "max_pages_per_s", "more than 0"),
        ({"name": "s", "max_pages_per_s": "fast"}, "max_pages_per_s", "pages per second"),
        (["name"], "", "must be an object"),
    ],
)
def test_a_bad_spec_is_refused_at_its_fields_path(doc: Any, path: str, problem: str) -> None:
    with pytest.raises(SpecError) as caught:
        JobSpec.read(doc)
    assert caught.value.path == path
    assert problem in caught.value.problem


def test_a_stored_spec_round_trips_and_a_broken_record_is_a_message_error() -> None:
    stored = StoredSpec(3, 1.5, JobSpec.read(SHOP))
    again = StoredSpec.from_wire(stored.to_wire())
    assert (again.version, again.put_at, again.name) == (3, 1.5, "shop")
    assert canonical_doc(again.spec.doc) == canonical_doc(SHOP)
    with pytest.raises(MessageError, match=r"bad_spec: links\.allow\[0\]"):
        StoredSpec.from_wire(
            b'{"v": 1, "version": 1, "put_at": 0, "spec": {"name": "s", "links": {"allow": ["("]}}}'
        )
    with pytest.raises(MessageError):
        StoredSpec.from_wire(b'{"v": 1, "version": 0, "put_at": 0, "spec": {"name": "s"}}')


def test_a_priority_section_gives_levels_by_rule_then_default() -> None:
    spec = JobSpec.read(
        {
            "name": "shop",
            "priority": {"default": 3, "weight": 5, "rules": [{"match": "/product/", "level": 0}]},
            "max_pages_per_s": 2.5,
        }
    )
    assert spec.priority.level_of("https://shop.test/product/1") == 0
    assert spec.priority.level_of("https://shop.test/about") is None
    assert (spec.priority.default, spec.priority.weight, spec.max_pages_per_s) == (3, 5, 2.5)
