"""Declarative extraction: a spec refused at the field's path, each type, metadata, main content,
and the shop's golden items from every page of the shop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jetcrawl.contract.errors import SpecError
from jetcrawl.contract.plugin import Page
from jetcrawl.worker.extract import compile_extraction
from jetcrawl.worker.extract.fields import parse_date, parse_number
from jetcrawl.worker.parse import DEPTH_SCAN_TAGS, MAX_DEPTH
from tests.support.shop import ShopSite, fetch_pages, golden_lines, item_lines, job_spec, run_job


def page(
    html: str, url: str = "http://shop.test/product/a", content_type: str = "text/html"
) -> Page:
    return Page(
        url=url,
        final_url=url,
        status=200,
        headers={},
        content_type=content_type,
        body=html.encode(),
        text=html,
        depth=0,
        job="t",
        spec_version=1,
    )


SHOP_EXTRACTION = compile_extraction(job_spec()["extract"])


def rule(**fields: Any) -> dict[str, Any]:
    return {"rules": [{"match": "/product/", "fields": fields}]}


PRODUCT = """<html><head><title>A</title>
<script type="application/ld+json">{"@type": "Product", "name": "A", "sku": "S-1"}</script>
<script type="application/ld+json">{"@graph": [{"@type": "Organization"},
 {"@type": "WebSite"}]}</script>
<script type="application/ld+json">{not json</script>
<meta property="og:title" content="A"><meta property="og:image" content="/1.png">
<meta property="og:image" content="/2.png"><meta name="description" content="not og">
</head><body><h1 class="name">  Widget
  <small>Pro</small> </h1>
<span class="price" data-currency="EUR">1.299,50 €</span>
<ul><li class="tag">a</li><li class="tag"> </li><li class="tag">b</li></ul>
<p class="code">ref: SKU-0042 (new)</p><time datetime="2026-12-03T10:00:00+00:00">today</time>
<p class="date">3 December 2026</p>
<div itemscope itemtype="https://schema.org/Product"><span itemprop="name">Widget</span>
 <a itemprop="url" href="/product/a">link</a>
 <div itemprop="offers" itemscope itemtype="https://schema.org/Offer">
  <meta itemprop="price" content="1299.50"><span itemprop="priceCurrency">EUR</span></div>
 <span itemprop="color">red</span><span itemprop="color">blue</span></div>
</body></html>"""


def test_each_type_reads_its_value() -> None:
    extraction = compile_extraction(
        rule(
            name={"css": "h1.name"},
            name_x={"xpath": "//h1"},
            price={"css": ".price", "type": "number"},
            currency={"css": ".price", "type": "attribute", "attr": "data-currency"},
            tags={"css": "li.tag", "type": "list"},
            tags_x={"xpath": "//li[@class='tag']/text()", "type": "list"},
            code={"css": "p", "type": "regex", "pattern": r"SKU-(\d+)"},
            when={"css": "time", "type": "date", "attr": "datetime"},
            day={"css": "p.date", "type": "date", "format": "%d %B %Y"},
            missing={"css": "p.none"},
            missing_number={"css": "h1", "type": "number"},
        )
    )
    (item,) = extraction.run(page(PRODUCT)).items
    assert item.key == "page"
    assert item.data == {
        "name": "Widget Pro",
        "name_x": "Widget Pro",
        "price": 1299.5,
        "currency": "EUR",
        "tags": ["a", "b"],
        "tags_x": ["a", "b"],
        "code": "0042",
        "when": "2026-12-03T10:00:00+00:00",
        "day": "2026-12-03",
        "missing": None,
        "missing_number": None,
    }


def test_metadata_json_ld_opengraph_microdata() -> None:
    doc = {"rules": [{"match": ".", "metadata": ["json-ld", "opengraph", "microdata"]}]}
    (item,) = compile_extraction(doc).run(page(PRODUCT)).items
    assert item.data["json_ld"] == [
        {"@type": "Product", "name": "A", "sku": "S-1"},
        {"@type": "Organization"},
        {"@type": "WebSite"},
    ]  # the block that is not JSON is left out
    assert item.data["opengraph"] == {"og:title": "A", "og:image": ["/1.png", "/2.png"]}
    assert item.data["microdata"] == [
        {
            "type": "https://schema.org/Product",
            "properties": {
                "name": "Widget",
                "url": "http://shop.test/product/a",
                "offers": {
                    "type": "https://schema.org/Offer",
                    "properties": {"price": "1299.50", "priceCurrency": "EUR"},
                },
                "color": ["red", "blue"],
            },
        }
    ]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.sampled_from(
            [
                "<p>",
                "</p>",
                "<dl class=specs>",
                "<dd data-spec=sku>",
                "<script type=application/ld+json>",
                "</script>",
                "[1, null]",
                '{"@graph": 3}',
                "<div itemscope>",
                "<b itemprop=x itemscope>",
                "<time datetime=2026-13-45>",
                '<span class="price">',
                "1,2.3,4",
                "<meta property=og:x>",
                "<article>",
                "<h1>",
                "\x00",
                "&amp;",
                "<!--",
                "]]>",
            ]
        )
        | st.text(max_size=8)
    ).map("".join),
    st.sampled_from(["/product/a", "/blog/b", "/other"]),
)
def test_no_page_makes_extraction_raise(html: str, path: str) -> None:
    output = SHOP_EXTRACTION.run(page(html, url=f"http://shop.test{path}"))
    for item in output.items:
        orjson.dumps(dict(item.data))  # every value is JSON


@pytest.mark.parametrize("depth", [MAX_DEPTH - 10, MAX_DEPTH + 10])
def test_a_page_nested_too_deep_is_read_up_to_the_depth_the_parse_reads(depth: int) -> None:
    filler = "<br>" * DEPTH_SCAN_TAGS  # enough tags for the depth to be checked
    html = f'<p class="a">before</p>{filler}{"<div>" * depth}<p class="b">deep</p>'
    doc = rule(a={"css": "p.a"}, b={"css": "p.b"}, c={"xpath": "//p[@class='b']"})
    (item,) = compile_extraction(doc).run(page(html)).items
    if depth > MAX_DEPTH:
        assert item.data == {"a": "before", "b": None, "c": None}
    else:
        assert item.data == {"a": "before", "b": "deep", "c": "deep"}


def test_main_content_as_markdown_and_text() -> None:
    body = "".join(
        f"<p>Paragraph {n} says something about kettles and water. " * 3 + "</p>" for n in range(4)
    )
    html = (
        "<html><body><nav>Home Shop Cart</nav>"
        f"<article><h2>Care</h2>{body}</article><footer>(c) shop</footer></body></html>"
    )
    for output, marker in (("markdown", "\n\n"), ("text", "\n")):
        doc = {"rules": [{"match": ".", "content": output}]}
        (item,) = compile_extraction(doc).run(page(html)).items
        content = item.data["content"]
        assert "Paragraph 3 says something" in content and marker in content
        assert "Home Shop Cart" not in content and "(c) shop" not in content


def test_the_key_field_and_the_first_matching_rule() -> None:
    doc = {
        "rules": [
            {"match": "/product/", "key": "sku", "fields": {"sku": {"css": ".sku"}}},
            {"match": ".", "fields": {"title": {"css": "title"}}},
        ]
    }
    extraction = compile_extraction(doc)
    (item,) = extraction.run(page('<p class="sku">S-9</p>')).items
    assert (item.key, item.data) == ("S-9", {"sku": "S-9"})
    assert extraction.run(page("<p>no sku</p>")).items == ()  # the key has no value: no item
    (other,) = extraction.run(page("<title>T</title>", url="http://shop.test/about")).items
    assert (other.key, other.data) == ("page", {"title": "T"})
    assert extraction.run(page("<title>T</title>", content_type="application/pdf")).items == ()


@pytest.mark.parametrize(
    ("doc", "path", "problem"),
    [
        (
            {"rules": [*rule(a={"css": "a"})["rules"], *rule(price={"css": ".price["})["rules"]]},
            "extract.rules[1].fields.price.css",
            "invalid CSS selector",
        ),
        (rule(p={"xpath": "//p[@"}), "extract.rules[0].fields.p.xpath", "invalid XPath"),
        (
            {"rules": [{"match": "(", "fields": {"a": {"css": "a"}}}]},
            "extract.rules[0].match",
            "invalid regex",
        ),
        (
            rule(p={"css": "p", "type": "regex", "pattern": "[a-"}),
            "extract.rules[0].fields.p.pattern",
            "invalid regex",
        ),
        (rule(p={"css": "p", "type": "money"}), "extract.rules[0].fields.p.type", "must be one of"),
        (
            rule(p={"css": "p", "colour": "red"}),
            "extract.rules[0].fields.p.colour",
            "unknown field",
        ),
        ({"rules": [{"match": ".", "field": {}}]}, "extract.rules[0].field", "unknown field"),
        ({"rule": []}, "extract.rule", "unknown field"),
        (
            rule(p={"css": "p", "xpath": "//p"}),
            "extract.rules[0].fields.p",
            "exactly one of css and xpath",
        ),
        (rule(p={"css": "p", "type": "attribute"}), "extract.rules[0].fields.p.attr", "missing"),
        (rule(p={"css": "p", "type": "regex"}), "extract.rules[0].fields.p.pattern", "missing"),
        (
            rule(p={"css": "p", "format": "%Y"}),
            "extract.rules[0].fields.p.format",
            "only type date",
        ),
        (rule(content={"css": "p"}), "extract.rules[0].fields.content", "rename it"),
        (rule(**{"a.b": {"css": "p"}}), "extract.rules[0].fields.a.b", "a field name is"),
        (
            {"rules": [{"match": ".", "key": "sku", "fields": {"p": {"css": "p"}}}]},
            "extract.rules[0].key",
            "'page', 'p'",
        ),
        (
            {"rules": [{"match": ".", "key": "p", "fields": {"p": {"css": "p", "type": "list"}}}]},
            "extract.rules[0].key",
            "is a list",
        ),
        ({"rules": [{"match": "."}]}, "extract.rules[0]", "takes nothing"),
        ({"rules": [{"fields": {"p": {"css": "p"}}}]}, "extract.rules[0].match", "missing"),
        (
            {"rules": [{"match": ".", "metadata": ["rdfa"]}]},
            "extract.rules[0].metadata[0]",
            "must be one of",
        ),
        (
            {"rules": [{"match": ".", "content": "html"}]},
            "extract.rules[0].content",
            "must be one of",
        ),
        ({"rules": {"match": "."}}, "extract.rules", "must be a list"),
        ([], "extract", "must be a mapping"),
    ],
)
def test_a_bad_spec_is_refused_at_the_field_path(doc: Any, path: str, problem: str) -> None:
    with pytest.raises(SpecError) as refused:
        compile_extraction(doc)
    assert refused.value.path == path
    assert problem in refused.value.problem
    assert str(refused.value).startswith(f"{path}: ")


def test_a_good_spec_compiles_and_a_path_prefix_is_kept() -> None:
    compile_extraction(job_spec()["extract"])
    with pytest.raises(SpecError) as refused:
        compile_extraction(rule(p={"css": "p::text"}), path="spec.extract")
    assert refused.value.path == "spec.extract.rules[0].fields.p.css"
    assert "pseudo-elements" in refused.value.problem


def test_the_readme_example_compiles_and_reads_a_product() -> None:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("## Extraction", 1)[1]
    example = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    extraction = compile_extraction(yaml.safe_load(example)["extract"])
    html = PRODUCT.replace('<h1 class="name">', '<h1 class="product-name">')
    html += '<dl><dd data-spec="sku">S-1</dd></dl><p class="availability">Out of stock</p>'
    (item,) = extraction.run(page(html)).items
    assert item.key == "S-1"
    assert item.data["price"] == 1299.5 and item.data["stock"] == "Out of stock"
    assert item.data["json_ld"][0]["sku"] == "S-1" and item.data["content"] is not None


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("€1,299.50", 1299.5),
        ("1.299,50 €", 1299.5),
        ("$1,049.00", 1049.0),
        ("12 items", 12),
        ("12,5 kg", 12.5),
        ("1,000,000", 1000000),
        ("-3.25", -3.25),
        ("£32.00", 32.0),
        ("free", None),
    ],
)
def test_numbers_as_shops_write_them(text: str, number: float | None) -> None:
    assert parse_number(text) == number


def test_dates() -> None:
    assert parse_date("2026-12-03") == "2026-12-03"
    assert parse_date("2026-12-03T10:00:00Z") == "2026-12-03T10:00:00+00:00"
    assert parse_date("03/12/2026 10:30", "%d/%m/%Y %H:%M") == "2026-12-03T10:30:00"
    assert parse_date("yesterday") is None
    assert parse_date("3 Dec", "%d %B %Y") is None


async def test_the_shop_pages_give_the_golden_items(example_plugin: None) -> None:
    async with ShopSite() as shop:
        pages = await fetch_pages(shop)
        lines = item_lines(run_job(pages), shop.base_url)
    assert len(pages) > 20  # products, categories and their pages, articles, and the traps
    assert lines == golden_lines()
    sources = {(line["source"], line["key"][:3]) for line in lines}
    assert ("extract", "KT-") in sources and ("extract", "pag") in sources
    assert ("example-articles", "art") in sources


async def test_a_changed_page_is_seen_against_the_golden_items(example_plugin: None) -> None:
    # The negative case: the comparison notices one value that differs.
    async with ShopSite() as shop:
        pages = await fetch_pages(shop)
        lines = item_lines(run_job(pages), shop.base_url)
    lines[0]["data"] = {**lines[0]["data"], "headline": "Changed"}
    assert lines != golden_lines()
