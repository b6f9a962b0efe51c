"""Items: what a job's extraction and plugins take from a page, on ``crawl.items.<job>``.

One item is one JSON object the user asked for (a product, an article, a plugin's record). Its
identity is the page's fingerprint plus the item's key, so a redelivered or re-crawled page
replaces its items instead of adding to them: sinks upsert on ``(fp, key)``, and the message's
``Nats-Msg-Id`` (:attr:`Item.msg_id`) drops copies published twice for one crawl of a page.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Self

import orjson

from jetcrawl.contract.errors import MessageError
from jetcrawl.contract.wire import WIRE_VERSION
from jetcrawl.contract.wire import json_object as _object
from jetcrawl.contract.wire import typed as _field

__all__ = ["ITEM_KEY_MAX", "Item"]

ITEM_KEY_MAX = 512  # characters: a key is an identity, not a payload


@dataclass(frozen=True, slots=True)
class Item:
    """One extracted item, as published on ``crawl.items.<job>``."""

    job: str
    spec_version: int  # the job spec's version the page was processed under (0: no spec)
    key: str  # unique among the page's items: a field's value, a plugin's choice, or "page"
    fp: str  # the page's URL fingerprint
    url: str  # the page's canonical URL
    crawl_id: str  # the page's crawl (Task.crawl_id): a re-crawl publishes its items anew
    source: str  # "extract" for the job's rules, else the plugin's entry-point name
    data: Mapping[str, Any] = field(default_factory=dict)  # the item itself: a JSON object
    fetched_at: float = 0.0  # unix seconds of the page's fetch
    trace_id: str | None = None  # W3C trace id (32 hex) of the page's task, when traced

    @property
    def msg_id(self) -> str:
        """``Nats-Msg-Id``: one message per item per crawl of a page."""
        return f"{self.crawl_id}:{self.source}:{self.key}"

    def to_obj(self) -> dict[str, Any]:
        return {
            "v": WIRE_VERSION,
            "job": self.job,
            "spec_version": self.spec_version,
            "key": self.key,
            "fp": self.fp,
            "url": self.url,
            "crawl_id": self.crawl_id,
            "source": self.source,
            "data": dict(self.data),
            "fetched_at": self.fetched_at,
            "trace_id": self.trace_id,
        }

    def to_wire(self) -> bytes:
        return orjson.dumps(self.to_obj())

    @classmethod
    def from_wire(cls, data: bytes) -> Self:
        return cls.from_obj(_object(data))

    @classmethod
    def from_obj(cls, obj: dict[str, Any]) -> Self:
        key = _field(obj, "key", str)
        if not key or len(key) > ITEM_KEY_MAX:
            raise MessageError("bad_key", f"an item key is 1..{ITEM_KEY_MAX} characters")
        spec_version = _field(obj, "spec_version", int)
        if spec_version < 0:
            raise MessageError("wrong_type", f"spec_version must be >= 0, got {spec_version}")
        fetched_at = _field(obj, "fetched_at", (int, float), optional=True)
        return cls(
            job=_field(obj, "job", str),
            spec_version=spec_version,
            key=key,
            fp=_field(obj, "fp", str),
            url=_field(obj, "url", str),
            crawl_id=_field(obj, "crawl_id", str),
            source=_field(obj, "source", str),
            data=_field(obj, "data", dict),
            fetched_at=float(fetched_at or 0.0),
            trace_id=_field(obj, "trace_id", str, optional=True),
        )
