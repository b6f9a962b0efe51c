"""Plugins by entry point: the example package loads and runs; a plugin for another API major,
without a version, or that does not load is refused at load with its name and the versions; a
plugin that raises or returns bad data fails with one error type, and the next page still runs."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from jetcrawl.contract.plugin import API_VERSION, ItemOut, LinkOut, Output, Page
from jetcrawl.worker.errors import PluginFailed, PluginRefused
from jetcrawl.worker.plugins import Plugin, installed_plugins, load_plugin, load_plugins
from tests.support.exampleplugin import PLUGIN

FAKE_MODULE = "jetcrawl_test_fake_plugins"
FAKE_PLUGINS = f"""
    import sys

    def current(page): return None
    current.jetcrawl_api = {API_VERSION[0]}

    def old(page): return None
    old.jetcrawl_api = {API_VERSION[0] - 1}

    def future(page): return None
    future.jetcrawl_api = {API_VERSION[0] + 1}

    def unversioned(page): return None

    def stringly(page): return None
    stringly.jetcrawl_api = "1"

    not_callable = 42
"""
ENTRY_POINTS = {
    "fake-current": "current",
    "fake-old": "old",
    "fake-future": "future",
    "fake-unversioned": "unversioned",
    "fake-stringly": "stringly",
    "fake-not-callable": "not_callable",
    "fake-missing": "no_such_function",
}


@pytest.fixture
def fake_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A real installed distribution of plugins (a module and its dist-info on sys.path)."""
    (tmp_path / f"{FAKE_MODULE}.py").write_text(textwrap.dedent(FAKE_PLUGINS))
    (tmp_path / f"{FAKE_MODULE}_broken.py").write_text("raise ImportError('no numpy here')\n")
    info = tmp_path / "jetcrawl_test_fake_plugins-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: jetcrawl-test-fake-plugins\nVersion: 1.0\n"
    )
    lines = [f"{name} = {FAKE_MODULE}:{attr}" for name, attr in ENTRY_POINTS.items()]
    lines.append(f"fake-broken = {FAKE_MODULE}_broken:plugin")
    (info / "entry_points.txt").write_text("[jetcrawl.plugins]\n" + "\n".join(lines) + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for module in (FAKE_MODULE, f"{FAKE_MODULE}_broken"):
        sys.modules.pop(module, None)


def test_a_plugin_of_the_current_major_loads(fake_plugins: None) -> None:
    plugins = load_plugins(["fake-current"])
    assert plugins["fake-current"].api_major == API_VERSION[0]
    assert "jetcrawl-test-fake-plugins 1.0" in plugins["fake-current"].origin


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("fake-old", f"built for plugin API {API_VERSION[0] - 1}.x; this jetcrawl speaks 1.0"),
        ("fake-future", f"built for plugin API {API_VERSION[0] + 1}.x; this jetcrawl speaks 1.0"),
        ("fake-unversioned", "declares no plugin API version: set jetcrawl_api = 1 on it"),
        ("fake-stringly", "jetcrawl_api must be an int, got '1'"),
        ("fake-not-callable", "is not a function but int"),
        ("fake-missing", "does not load: AttributeError"),
        ("fake-broken", "does not load: ImportError: no numpy here"),
        ("fake-nowhere", "not installed (plugins installed: "),
    ],
)
def test_a_plugin_that_cannot_be_used_is_refused_by_name(
    fake_plugins: None, name: str, problem: str
) -> None:
    with pytest.raises(PluginRefused) as refused:
        load_plugins(["fake-current", name])
    assert refused.value.plugin == name
    assert problem in refused.value.problem
    assert str(refused.value).startswith(f"plugin {name!r} refused: ")


PAGE = Page(
    url="http://shop.test/a",
    final_url="http://shop.test/a",
    status=200,
    headers={},
    content_type="text/html",
    body=b"<p>",
    text="<p>",
    depth=0,
    job="shop",
    spec_version=1,
)


def test_the_example_plugin_loads_and_reads_an_article(example_plugin: None) -> None:
    assert PLUGIN in installed_plugins()
    plugin = load_plugin(PLUGIN)
    assert plugin.api_major == API_VERSION[0]
    assert "jetcrawl-example-plugin" in plugin.origin
    html = (
        '<html><head><meta property="og:type" content="article"></head><body><article>'
        "<h1>On  kettles</h1><p>Two words.</p><p>And three more.</p></article>"
        '<a class="related" href="/blog/next">next</a><a href="/cart">cart</a></body></html>'
    )
    output = plugin.run(replace(PAGE, text=html, body=html.encode()))
    (item,) = output.items
    assert (item.key, item.data) == (
        "article",
        {"headline": "On kettles", "words": 5, "author": None},
    )
    assert [(link.url, dict(link.meta)) for link in output.links] == [
        ("http://shop.test/blog/next", {"related_to": "On kettles"})
    ]
    assert plugin.run(PAGE) == Output()  # not an article


def plugin(function: Any) -> Plugin:
    return Plugin("test", "tests:function", API_VERSION[0], function)


def test_a_plugin_that_raises_fails_with_its_name_and_the_exception() -> None:
    bug = ZeroDivisionError("division by zero")

    def broken(page: Page) -> Output:
        raise bug

    with pytest.raises(PluginFailed) as failed:
        plugin(broken).run(PAGE)
    assert failed.value.plugin == "test"
    assert failed.value.error is bug and failed.value.__cause__ is bug
    assert "raised ZeroDivisionError: division by zero" in str(failed.value)

    def exits(page: Page) -> Output:
        sys.exit(3)

    with pytest.raises(PluginFailed) as failed:
        plugin(exits).run(PAGE)  # nor does an exit take the worker down
    assert isinstance(failed.value.error, SystemExit)
    # the plugin still runs on the next page
    assert plugin(lambda page: Output()).run(PAGE) == Output()


@pytest.mark.parametrize(
    ("output", "problem"),
    [
        (None, "returned NoneType, not an Output"),
        ({"items": []}, "returned dict, not an Output"),
        (Output(items=(i for i in ())), "items is generator, not a tuple"),  # type: ignore[arg-type]
        (Output(items=({"key": "a"},)), "items[0] is dict, not an ItemOut"),  # type: ignore[arg-type]
        (Output(items=(ItemOut("", {}),)), "items[0].key must be 1..512 characters"),
        (Output(items=(ItemOut("k" * 513, {}),)), "items[0].key must be 1..512 characters"),
        (Output(items=(ItemOut("a", {}), ItemOut("a", {}))), "items[1].key 'a' is the key of"),
        (Output(items=(ItemOut("a", {"when": object()}),)), "items[0].data is not JSON"),
        (Output(items=(ItemOut("a", {1: "x"}),)), "items[0].data is not JSON"),
        (Output(items=(ItemOut("a", ["x"]),)), "items[0].data is list, not a mapping"),  # type: ignore[arg-type]
        (Output(links=(LinkOut("mailto:a@b.c"),)), "links[0].url is no crawlable URL"),
        (Output(links=(LinkOut("http://u:p@shop.test/"),)), "links[0].url is no crawlable URL"),
        (Output(links=(LinkOut(b"http://x/"),)), "links[0].url is bytes, not a str"),  # type: ignore[arg-type]
        (Output(links=(LinkOut("/b", meta={"s": {1, 2}}),)), "links[0].meta is not JSON"),
        (
            Output(links=(LinkOut("/b", priority=4),)),
            "links[0].priority must be a whole number 0-3",
        ),
    ],
)
def test_bad_output_is_a_failure_of_the_plugin(output: Any, problem: str) -> None:
    with pytest.raises(PluginFailed) as failed:
        plugin(lambda page: output).run(PAGE)
    assert failed.value.plugin == "test" and failed.value.error is None
    assert problem in failed.value.problem


def test_good_output_passes_as_it_is() -> None:
    output = Output(
        items=(ItemOut("a", {"n": 1, "tags": ["x"]}), ItemOut("b", {})),
        links=(LinkOut("/b", priority=3, meta={"from": "a"}), LinkOut("https://other.test/x")),
    )
    assert plugin(lambda page: output).run(PAGE) is output
