"""Scrapy on the benchmark site, with its defaults and jetcrawl's politeness.

``python -m bench.scrapy_spider SEEDS OUT``: a plain Scrapy crawl from the seeds (one per line)
that obeys robots.txt, keeps 64 requests in flight and 8 per host, with no download delay. The
spider does what jetcrawl's worker does with a response: it records every answer (404s and
redirects too: the redirect middleware is off and each redirect's canonical Location becomes a new
request, as in jetcrawl), extracts ``<a href>`` and ``<area href>`` from 2xx HTML with Scrapy's
``LinkExtractor`` at its defaults (so links to binaries are skipped by extension, its
``IGNORED_EXTENSIONS``; ``<base>`` honoured), and canonicalizes them with jetcrawl's rules
(``JETCRAWL_TRACKING_PARAMS`` and the other settings, read from the environment). The duplicate
filter fingerprints requests by that canonical form (``CanonicalFingerprinter``), so both crawlers
dedupe the same URLs. Items go to ``OUT`` through a JSON-lines feed.
"""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Self

from scrapy import Request, Spider
from scrapy.crawler import Crawler, CrawlerProcess
from scrapy.http import HtmlResponse, Response
from scrapy.linkextractors import LinkExtractor

from jetcrawl.contract.errors import UrlError
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.urls import UrlRules, fingerprint

__all__ = ["SETTINGS", "BenchSpider", "CanonicalFingerprinter"]

SETTINGS: dict[str, Any] = {
    "ROBOTSTXT_OBEY": True,
    "CONCURRENT_REQUESTS": 64,
    "CONCURRENT_REQUESTS_PER_DOMAIN": 8,
    "DOWNLOAD_DELAY": 0,
    "REDIRECT_ENABLED": False,  # a redirect is an answer; its target is a new request
    "HTTPERROR_ALLOW_ALL": True,  # 404s reach the spider and are recorded
    "REQUEST_FINGERPRINTER_CLASS": "bench.scrapy_spider.CanonicalFingerprinter",
    "LOG_LEVEL": "INFO",
    "TELNETCONSOLE_ENABLED": False,
    "USER_AGENT": "bench-scrapy (+https://github.com/jetcrawl/jetcrawl)",
}
REDIRECTS = frozenset({301, 302, 303, 307, 308})
RULES = UrlRules.from_settings(Settings.from_env())


class CanonicalFingerprinter:
    """Request fingerprints from ``jetcrawl.contract.urls``: the canonical URL's fingerprint."""

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls()

    def fingerprint(self, request: Request) -> bytes:
        try:
            return bytes.fromhex(fingerprint(RULES.canonicalize(request.url)))
        except UrlError:
            return hashlib.blake2b(request.url.encode(), digest_size=16).digest()


class BenchSpider(Spider):
    name = "bench"

    def __init__(self, seeds: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seeds = Path(seeds).read_text().split()
        self.links = LinkExtractor(tags=("a", "area"), attrs=("href",))

    async def start(self) -> AsyncIterator[Request]:
        for url in self.seeds:
            yield Request(RULES.canonicalize(url))

    def parse(self, response: Response, **kwargs: Any) -> Iterator[dict[str, Any] | Request]:
        yield {"url": response.url, "status": response.status}
        if response.status in REDIRECTS:
            location = response.headers.get("Location")
            if location:
                yield from self._follow([location.decode("latin-1")], response.url)
        elif 200 <= response.status < 300 and isinstance(response, HtmlResponse):
            hrefs = [link.url for link in self.links.extract_links(response)]
            yield from self._follow(hrefs, response.url)

    def _follow(self, hrefs: list[str], base: str) -> Iterator[Request]:
        for href in hrefs:
            try:
                yield Request(RULES.canonicalize(href, base=base))
            except UrlError:
                continue


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scrapy_spider")
    parser.add_argument("seeds", type=Path, help="file with one seed URL per line")
    parser.add_argument("out", type=Path, help="JSON-lines feed of the crawled URLs")
    args = parser.parse_args(argv)
    process = CrawlerProcess(
        {**SETTINGS, "FEEDS": {args.out.as_uri(): {"format": "jsonlines", "overwrite": True}}}
    )
    process.crawl(BenchSpider, seeds=str(args.seeds))
    process.start()


if __name__ == "__main__":
    main()
