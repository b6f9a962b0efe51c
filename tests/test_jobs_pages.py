"""A page through its job's sources: every way a plugin can fail costs its own items only."""

from __future__ import annotations

from typing import Any

import pytest

from jetcrawl.contract.jobs import JobSpec
from jetcrawl.contract.plugin import ItemOut, LinkOut, Output, Page
from jetcrawl.worker.jobs import CompiledJob, run_page
from jetcrawl.worker.plugins import Plugin

PAGE = Page(
    url="https://shop.example/p/1",
    final_url="https://shop.example/p/1",
    status=200,
    headers={},
    content_type="text/html",
    body=b"<title>x</title>",
    text="<title>x</title>",
    depth=1,
    job="shop",
    spec_version=3,
)


def job(**functions: Any) -> CompiledJob:
    """The functions as loaded plugins: what they return is checked as in a worker."""
    sources = tuple((name, Plugin(name, "test", 1, f).run) for name, f in functions.items())
    return CompiledJob(3, JobSpec.read({"name": "shop"}), sources)


def good(page: Page) -> Output:
    return Output(items=(ItemOut("a", {"n": 1}),), links=(LinkOut("/next"),))


@pytest.mark.parametrize(
    ("returned", "reason", "detail"),
    [
        (None, "bad_output", "returned NoneType, not an Output"),
        (Output(items=[ItemOut("a", {})]), None, None),  # a list is fine
        (Output(items=({"key": "a"},)), "bad_output", "items[0] is dict, not an ItemOut"),  # type: ignore[arg-type]
        (Output(items=(ItemOut("", {}),)), "bad_output", "items[0].key must be 1..512"),
        (Output(items=(ItemOut("k" * 513, {}),)), "bad_output", "1..512 characters"),
        (
            Output(items=(ItemOut("a", {}), ItemOut("a", {}))),
            "bad_output",
            "items[1].key 'a' is the key of an earlier item",
        ),
        (Output(items=(ItemOut("a", {"when": object()}),)), "bad_output", "data is not JSON"),
        (Output(links=("https://x.example/",)), "bad_output", "links[0] is str, not a LinkOut"),  # type: ignore[arg-type]
        (Output(links=(LinkOut("/x", job="no way"),)), "bad_output", "a link's job must match"),
        (Output(links=(LinkOut("mailto:a@b.example"),)), "bad_output", "no crawlable URL"),
    ],
)
def test_bad_output_is_a_failure_of_its_source_and_the_others_still_count(
    returned: Any, reason: str | None, detail: str | None
) -> None:
    out = run_page(job(first=good, second=lambda page: returned), PAGE)
    first = [("first", ItemOut("a", {"n": 1}))]
    if reason is None:
        assert not out.failures and len(out.items) == 2
        return
    assert out.items == first, "the failing source gives no item; the good one all of its"
    [failure] = out.failures
    assert (failure.source, failure.reason) == ("second", reason)
    assert detail is not None and detail in failure.detail


def test_a_raising_plugin_is_a_failure_carrying_the_exception() -> None:
    def boom(page: Page) -> Output:
        raise KeyError("price")

    def broken(page: Page) -> Output:
        raise RuntimeError("not a plugin's: the extraction's")

    compiled = job(boom=boom, first=good)
    compiled = CompiledJob(3, compiled.spec, (*compiled.sources, ("extract", broken)))
    out = run_page(compiled, PAGE)
    assert [(f.source, f.reason, f.detail) for f in out.failures] == [
        ("boom", "plugin_raised", "raised KeyError: 'price'"),
        ("extract", "plugin_raised", "RuntimeError: not a plugin's: the extraction's"),
    ]
    assert [source for source, _ in out.items] == ["first"]


def test_links_without_a_job_take_the_pages_and_unavailable_plugins_fail_each_page() -> None:
    def links(page: Page) -> Output:
        return Output(links=(LinkOut("/a"), LinkOut("/b", job="other", priority=3)))

    compiled = job(links=links)
    compiled = CompiledJob(3, compiled.spec, compiled.sources, (("gone", "not installed"),))
    out = run_page(compiled, PAGE)
    assert [(link.url, link.job, link.priority) for link in out.links] == [
        ("/a", "shop", None),
        ("/b", "other", 3),
    ]
    assert [(f.source, f.reason, f.detail) for f in out.failures] == [
        ("gone", "plugin_unavailable", "not installed")
    ]
