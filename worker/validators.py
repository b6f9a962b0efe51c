"""Conditional GET for re-crawls: the previous fetch's validators, kept in KV ``crawl_validators``.

When a URL is crawled again (``recrawl_after_s``), the worker sends the ``ETag`` it saw as
``If-None-Match`` and the ``Last-Modified`` as ``If-Modified-Since``; a server that honours them
answers 304 and the page is recorded as unchanged, with no body fetched or stored again.
"""

from __future__ import annotations

import orjson
from nats.js.errors import APIError, KeyNotFoundError
from nats.js.kv import KeyValue

from jetcrawl.worker.fetcher import Fetched


class Validators:
    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    async def conditional_headers(self, fp: str) -> dict[str, str]:
        try:
            entry = await self._kv.get(fp)
        except KeyNotFoundError:
            return {}
        try:
            seen = orjson.loads(entry.value or b"{}")
        except orjson.JSONDecodeError:
            return {}
        headers = {}
        if isinstance(seen.get("etag"), str):
            headers["If-None-Match"] = seen["etag"]
        if isinstance(seen.get("last_modified"), str):
            headers["If-Modified-Since"] = seen["last_modified"]
        return headers

    async def remember(self, fp: str, fetched: Fetched) -> None:
        """Keep a 2xx answer's validators for the next crawl of the URL (best effort)."""
        headers = {k.lower(): v for k, v in fetched.headers.items()}
        seen = {"etag": headers.get("etag"), "last_modified": headers.get("last-modified")}
        if not any(seen.values()):
            return
        try:
            await self._kv.put(fp, orjson.dumps(seen))
        except (TimeoutError, APIError):
            return  # the next crawl is then an unconditional GET, nothing worse
