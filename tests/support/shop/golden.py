"""The shop's golden items: what the job's extraction and its plugin take from every page.

A line of ``golden.jsonl`` is ``{"url", "source", "key", "data"}`` (source: "extract" or the
plugin's name), the lines sorted by (url, source, key), every occurrence of the site's base URL
written ``{site}`` so the file holds for any port. ``python -m tests.support.shop`` writes
it anew from the engine's current output (read the diff before committing it).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from jetcrawl.contract.plugin import Output, Page
from jetcrawl.contract.urls import canonicalize
from jetcrawl.worker.extract import compile_extraction
from jetcrawl.worker.plugins import load_plugins
from tests.support.shop.served import ShopSite

__all__ = [
    "GOLDEN",
    "JOB_SPEC",
    "SITE",
    "fetch_pages",
    "golden_lines",
    "item_lines",
    "job_spec",
    "placed",
    "run_job",
]

HERE = Path(__file__).resolve().parent
JOB_SPEC = HERE / "job.yaml"
GOLDEN = HERE / "golden.jsonl"
SITE = "{site}"  # the base URL, in the golden file


def job_spec() -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load(JOB_SPEC.read_text())
    return spec


def golden_lines() -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in GOLDEN.read_text().splitlines() if line.strip()]


async def fetch_pages(shop: ShopSite) -> list[Page]:
    """Every page of the shop, fetched, as extraction and plugins get it."""
    pages = []
    async with aiohttp.ClientSession() as session:
        for url in shop.urls:
            async with session.get(url, allow_redirects=False) as response:
                body = await response.read()
                pages.append(
                    Page(
                        url=canonicalize(url),
                        final_url=canonicalize(url),
                        status=response.status,
                        headers=dict(response.headers),
                        content_type=response.content_type,
                        body=body,
                        text=body.decode(response.charset or "utf-8"),
                        depth=0,
                        job="shop",
                        spec_version=1,
                    )
                )
    return pages


def run_job(pages: Iterable[Page]) -> list[tuple[str, str, Output]]:
    """(url, source, output) of the job's extraction and plugins over ``pages``."""
    spec = job_spec()
    extraction = compile_extraction(spec["extract"])
    plugins = load_plugins(spec.get("plugins", []))
    outputs = []
    for page in pages:
        outputs.append((page.url, "extract", extraction.run(page)))
        for name, plugin in plugins.items():
            outputs.append((page.url, name, plugin.run(page)))
    return outputs


def item_lines(outputs: Iterable[tuple[str, str, Output]], base_url: str) -> list[dict[str, Any]]:
    """The golden file's lines for these outputs: sorted, the base URL written ``{site}``."""
    lines = [
        {"url": url, "source": source, "key": item.key, "data": item.data}
        for url, source, output in outputs
        for item in output.items
    ]
    return placed(lines, base_url)


def placed(lines: Iterable[dict[str, Any]], base_url: str) -> list[dict[str, Any]]:
    """Lines of ``{"url", "source", "key", "data"}`` (from a crawl's items, say) as the golden
    file has them: sorted by (url, source, key), the base URL written ``{site}``."""
    ordered = sorted(lines, key=lambda line: (line["url"], line["source"], line["key"]))
    found: list[dict[str, Any]] = orjson.loads(
        orjson.dumps(ordered).decode().replace(base_url, SITE)
    )
    return found
