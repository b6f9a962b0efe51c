"""The plugin API: what a plugin gets (a fetched :class:`Page`) and gives back (:class:`Output`).

A plugin is a function ``(Page) -> Output`` published under the entry-point group
``jetcrawl.plugins``. It declares the API major version it was built for; a worker refuses a plugin
of another major version at start. Within one major version these types only gain optional fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["API_VERSION", "ENTRY_POINT_GROUP", "ItemOut", "LinkOut", "Output", "Page"]

API_VERSION = (1, 0)  # (major, minor): a plugin for another major version is refused
ENTRY_POINT_GROUP = "jetcrawl.plugins"


@dataclass(frozen=True, slots=True)
class Page:
    """One fetched page, as extraction and plugins see it."""

    url: str  # the canonical URL the task was for
    final_url: str  # where the body came from (the same unless a redirect was followed)
    status: int
    headers: Mapping[str, str]
    content_type: str  # the media type alone, lowercase ("text/html")
    body: bytes
    text: str  # the body decoded by its declared or sniffed charset
    depth: int
    job: str
    spec_version: int  # 0: the job has no spec
    meta: Mapping[str, Any] = field(default_factory=dict)  # what the link that led here carried


@dataclass(frozen=True, slots=True)
class ItemOut:
    """An item a page yields: ``key`` is unique among the page's items (upserts key on it)."""

    key: str
    data: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class LinkOut:
    """A link to crawl, with what it carries to the page it leads to."""

    url: str
    job: str | None = None  # another job's spec applies to it (None: this page's job)
    priority: int | None = None  # None: the job's
    meta: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Output:
    """What a plugin or the job's extraction returns for one page."""

    items: tuple[ItemOut, ...] = ()
    links: tuple[LinkOut, ...] = ()
