"""The baselines: a bare aiohttp fetch loop over a known URL list, with or without link extraction.

``python -m bench.bare fetch|extract URLS OUT``: ``CONCURRENCY`` coroutines share one iterator over
the URLs (one per line in ``URLS``) and one pooled session; each GETs a URL without following
redirects and reads the whole body. ``extract`` also does what a crawler must do with the answer:
selectolax link extraction with canonical URLs for 2xx HTML (jetcrawl's own
``worker.parse.extract``, so both sides canonicalize the same way) and the canonical Location of a
redirect. URLs are canonical by the rules ``JETCRAWL_TRACKING_PARAMS`` and the other settings give,
as jetcrawl's own. ``OUT`` gets ``{"fetched": {url: status}, "links": [...], "loop_s",
"loop_cpu_s"}``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from pathlib import Path

import aiohttp
import orjson

from bench.loop import run
from jetcrawl.contract.errors import UrlError
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.urls import LinkCanonicalizer, UrlRules
from jetcrawl.worker.parse import extract

__all__ = ["CONCURRENCY", "crawl_list"]

CONCURRENCY = 64
REDIRECTS = frozenset({301, 302, 303, 307, 308})
HTML = frozenset({"text/html", "application/xhtml+xml"})


async def crawl_list(
    urls: list[str], *, links: bool, concurrency: int = CONCURRENCY
) -> tuple[dict[str, int], set[str]]:
    """Fetch every URL once; the status of each, and (``links``) every canonical link found."""
    rules = UrlRules.from_settings(Settings.from_env())
    canonical = LinkCanonicalizer(rules)
    fetched: dict[str, int] = {}
    found: set[str] = set()
    pending = iter(urls)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def loop() -> None:
            for url in pending:
                async with session.get(url, allow_redirects=False) as response:
                    body = await response.read()
                    fetched[url] = response.status
                    if not links:
                        continue
                    if response.status in REDIRECTS and "Location" in response.headers:
                        with contextlib.suppress(UrlError):
                            found.add(rules.canonicalize(response.headers["Location"], base=url))
                    elif 200 <= response.status < 300 and response.content_type in HTML:
                        found.update(extract(body, url, response.charset, canonical).links)

        async with asyncio.TaskGroup() as tg:
            for _ in range(concurrency):
                tg.create_task(loop())
    return fetched, found


async def _timed(urls: list[str], links: bool) -> dict[str, object]:
    started, cpu_started = time.perf_counter(), time.process_time()
    fetched, found = await crawl_list(urls, links=links)
    return {
        "fetched": fetched,
        "links": sorted(found),
        "loop_s": time.perf_counter() - started,
        "loop_cpu_s": time.process_time() - cpu_started,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bare")
    parser.add_argument("mode", choices=["fetch", "extract"])
    parser.add_argument("urls", type=Path, help="file with one URL per line")
    parser.add_argument("out", type=Path, help="JSON output")
    args = parser.parse_args(argv)
    urls = args.urls.read_text().split()
    args.out.write_bytes(orjson.dumps(run(_timed(urls, links=args.mode == "extract"))))


if __name__ == "__main__":
    main()
