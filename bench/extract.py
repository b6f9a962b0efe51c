"""``python -m bench extract``: extraction's CPU per page, jetcrawl's engine beside Scrapy's.

On the shop's pages (``tests/support/shop``, rendered without a server), each task is run by
jetcrawl's ``Extraction`` and by the same extraction written as a Scrapy spider callback would
write it: ``response.css``/``xpath`` (parsel) on a fresh ``HtmlResponse``, ``json.loads`` for
JSON-LD, extruct for the three metadata kinds, trafilatura for main content (Scrapy has none of its
own). The systems alternate within each repetition, so drift hits both alike; the figure is the
median over repetitions of this thread's CPU time per page, and the ratio is Scrapy's over
jetcrawl's in the same run. A system whose library is missing (Scrapy and extruct come with the
``bench`` extra) is left out of its rows.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from jetcrawl.contract.plugin import Page
from jetcrawl.worker.extract import compile_extraction
from tests.support.shop.catalog import responses

__all__ = ["ExtractReading", "Row", "extract_markdown", "measure_extract"]

BASE = "http://127.0.0.30:8080"
PRODUCT_FIELDS = {
    "name": {"css": "h1.product-name"},
    "price": {"css": ".price", "type": "number"},
    "currency": {"css": ".price", "type": "attribute", "attr": "data-currency"},
    "sku": {"css": "dd[data-spec=sku]"},
    "availability": {"css": ".availability", "type": "regex", "pattern": "(?:In|Out of) stock"},
    "tags": {"css": "ul.tags li", "type": "list"},
    "released": {"css": "time.released", "type": "date", "attr": "datetime"},
}
# task -> (the pages it runs on, the jetcrawl rule)
TASKS: dict[str, tuple[str, dict[str, Any]]] = {
    "CSS fields (7)": ("/product/", {"fields": PRODUCT_FIELDS}),
    "XPath field (1)": ("/product/", {"fields": {"sku": {"xpath": "//dd[@data-spec='sku']"}}}),
    "JSON-LD": ("/product/", {"metadata": ["json-ld"]}),
    "JSON-LD + OpenGraph + microdata": (
        "/blog/",
        {"metadata": ["json-ld", "opengraph", "microdata"]},
    ),
    "main content as markdown": ("/blog/", {"content": "markdown"}),
}
SYSTEMS = ("jetcrawl", "scrapy")


@dataclass(frozen=True, slots=True)
class Row:
    task: str
    pages: int  # distinct pages in the task's set
    us_per_page: dict[str, float]  # system -> median CPU µs per page
    baseline: str  # what the Scrapy column ran

    @property
    def ratio(self) -> float | None:
        """Scrapy's CPU per page over jetcrawl's (higher: jetcrawl cheaper)."""
        if "scrapy" not in self.us_per_page or not self.us_per_page.get("jetcrawl"):
            return None
        return self.us_per_page["scrapy"] / self.us_per_page["jetcrawl"]


@dataclass(frozen=True, slots=True)
class ExtractReading:
    runs_per_page: int
    reps: int
    rows: tuple[Row, ...]

    def to_dict(self) -> dict[str, object]:
        return {
            "runs_per_page": self.runs_per_page,
            "reps": self.reps,
            "rows": [asdict(row) | {"ratio": row.ratio} for row in self.rows],
        }


def measure_extract(runs_per_page: int, reps: int) -> ExtractReading:
    bodies = {
        path: body
        for path, (_, kind, body) in responses(BASE).items()
        if kind.startswith("text/html")
    }
    rows = []
    for task, (prefix, rule) in TASKS.items():
        chosen = sorted(p for p in bodies if p.startswith(prefix) and "?" not in p and p != prefix)
        pages = [(BASE + path, bodies[path]) for path in chosen]
        systems: dict[str, Callable[[str, bytes], object]] = {"jetcrawl": _jetcrawl(rule)}
        scrapy, baseline = _scrapy(task)
        if scrapy is not None:
            systems["scrapy"] = scrapy
        samples: dict[str, list[float]] = {name: [] for name in systems}
        for _ in range(reps):
            for name, run in systems.items():
                samples[name].append(_cpu_us_per_page(run, pages, runs_per_page))
        medians = {name: statistics.median(values) for name, values in samples.items()}
        rows.append(Row(task, len(pages), medians, baseline))
    return ExtractReading(runs_per_page, reps, tuple(rows))


def _cpu_us_per_page(
    run: Callable[[str, bytes], object], pages: list[tuple[str, bytes]], runs: int
) -> float:
    for url, body in pages:  # warm: imports, caches, compiled selectors
        run(url, body)
    start = time.thread_time_ns()
    for _ in range(runs):
        for url, body in pages:
            run(url, body)
    return (time.thread_time_ns() - start) / 1_000 / (runs * len(pages))


def _jetcrawl(rule: dict[str, Any]) -> Callable[[str, bytes], object]:
    extraction = compile_extraction({"rules": [{"match": ".", **rule}]})

    def run(url: str, body: bytes) -> object:
        # The worker hands extraction a Page with the body decoded (by the charset it read).
        page = Page(url, url, 200, {}, "text/html", body, body.decode(), 0, "bench", 1)
        return extraction.run(page)

    return run


def _scrapy(task: str) -> tuple[Callable[[str, bytes], object] | None, str]:
    if importlib.util.find_spec("scrapy") is None:
        return None, "(scrapy not installed)"
    from scrapy.http import HtmlResponse

    def response(url: str, body: bytes) -> Any:
        return HtmlResponse(url, body=body, encoding="utf-8")

    if task.startswith("CSS"):

        def css(url: str, body: bytes) -> object:
            r = response(url, body)
            text = " ".join(r.css(".availability ::text").getall())
            return {
                "name": " ".join(" ".join(r.css("h1.product-name ::text").getall()).split()),
                "price": _number(r.css(".price::text").re_first(r"\d[\d.,]*")),
                "currency": r.css(".price::attr(data-currency)").get(),
                "sku": r.css("dd[data-spec=sku]::text").get(),
                "availability": "In stock" if "In stock" in text else "Out of stock",
                "tags": r.css("ul.tags li::text").getall(),
                "released": r.css("time.released::attr(datetime)").get(),
            }

        return css, "parsel: response.css, ::text and ::attr()"
    if task.startswith("XPath"):
        return (
            lambda url, body: response(url, body).xpath("//dd[@data-spec='sku']/text()").get(),
            "parsel: response.xpath",
        )
    if task == "JSON-LD":

        def json_ld(url: str, body: bytes) -> object:
            blocks = response(url, body).css('script[type="application/ld+json"]::text').getall()
            return [json.loads(block) for block in blocks]

        return json_ld, "parsel: script::text, json.loads"
    if task.startswith("JSON-LD +"):
        if importlib.util.find_spec("extruct") is None:
            return None, "(extruct not installed)"
        import extruct

        def metadata(url: str, body: bytes) -> object:
            text = response(url, body).text
            return extruct.extract(
                text, base_url=url, syntaxes=["json-ld", "opengraph", "microdata"]
            )

        return metadata, "extruct on response.text"
    from trafilatura import extract

    def content(url: str, body: bytes) -> object:
        return extract(
            response(url, body).text, url=url, output_format="markdown", include_comments=False
        )

    return content, "trafilatura on response.text"


def _number(text: str | None) -> float | None:
    """A spider's price parsing: the decimal mark is the last of "," and "."."""
    if not text:
        return None
    mark = max(text.rfind(","), text.rfind("."))
    if mark < 0 or len(text) - mark - 1 == 3:
        return float(text.replace(",", "").replace(".", ""))
    return float(text[:mark].replace(",", "").replace(".", "") + "." + text[mark + 1 :])


def extract_markdown(reading: ExtractReading) -> str:
    lines = [
        "# Extraction: CPU per page, jetcrawl beside Scrapy",
        "",
        f"The shop's pages (tests/support/shop), each run {reading.runs_per_page} times per "
        f"repetition, {reading.reps} repetitions, systems alternating; medians of this thread's "
        "CPU time.",
        "",
        "| task | pages | jetcrawl µs/page | Scrapy µs/page | Scrapy / jetcrawl | Scrapy ran |",
        "|---|---|---|---|---|---|",
    ]
    for row in reading.rows:
        scrapy = row.us_per_page.get("scrapy")
        ratio = row.ratio
        lines.append(
            f"| {row.task} | {row.pages} | {row.us_per_page['jetcrawl']:.0f} | "
            f"{'-' if scrapy is None else f'{scrapy:.0f}'} | "
            f"{'-' if ratio is None else f'{ratio:.2f}x'} | {row.baseline} |"
        )
    return "\n".join(lines) + "\n"
