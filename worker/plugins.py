"""Plugins: functions ``(Page) -> Output`` from other packages, found by entry-point name.

A package publishes a plugin under the entry-point group ``jetcrawl.plugins``; its name there is
the name job specs use. The function declares the plugin API's major version it was built for in
an attribute, ``jetcrawl_api`` (``articles.jetcrawl_api = 1``); ``load_plugins`` refuses, before
the worker starts crawling, a plugin that is not installed, does not load, is not callable, or
declares no version or another major version than ``API_VERSION``'s (``PluginRefused``).

``Plugin.run`` returns the plugin's ``Output`` checked, or raises ``PluginFailed`` carrying the
plugin's name and the cause: an exception the plugin raised (kept as ``__cause__`` too) or a
problem with what it returned (not an ``Output``, an item without a key or with a duplicate key or
non-JSON data, a link that is no http(s) URL). A failure costs the page its plugin output only:
the worker dead-letters it and goes on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import orjson

from jetcrawl.contract.errors import MessageError, UrlError
from jetcrawl.contract.items import ITEM_KEY_MAX
from jetcrawl.contract.messages import check_priority
from jetcrawl.contract.plugin import API_VERSION, ENTRY_POINT_GROUP, ItemOut, LinkOut, Output, Page
from jetcrawl.contract.urls import canonicalize
from jetcrawl.worker.errors import PluginFailed, PluginRefused

__all__ = ["API_ATTRIBUTE", "Plugin", "installed_plugins", "load_plugin", "load_plugins"]

API_ATTRIBUTE = "jetcrawl_api"  # on the plugin function: the API major version it targets


@dataclass(frozen=True, slots=True)
class Plugin:
    """A loaded plugin: its entry-point name, where it came from, and the function."""

    name: str
    origin: str  # "module:function (distribution version)"
    api_major: int
    function: Callable[[Page], Any]

    def run(self, page: Page) -> Output:
        """The plugin's output for ``page``, checked; raises ``PluginFailed``."""
        try:
            output = self.function(page)
        except (Exception, SystemExit) as exc:  # a plugin's bug or exit is its failure only
            raise PluginFailed(self.name, f"raised {type(exc).__name__}: {exc}", exc) from exc
        return _checked(self.name, output, page)


def installed_plugins() -> list[str]:
    """The names of every plugin installed in this environment, sorted."""
    return sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def load_plugins(names: Iterable[str]) -> dict[str, Plugin]:
    """Each named plugin, loaded and its API version checked; raises ``PluginRefused`` for the
    first that cannot be used."""
    return {name: load_plugin(name) for name in names}


def load_plugin(name: str) -> Plugin:
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not found:
        known = ", ".join(installed_plugins()) or "none"
        raise PluginRefused(name, f"not installed (plugins installed: {known})")
    if len({ep.value for ep in found}) > 1:
        origins = ", ".join(sorted(_origin(ep) for ep in found))
        raise PluginRefused(name, f"installed more than once: {origins}")
    entry = found[0]
    origin = _origin(entry)
    try:
        function = entry.load()
    except Exception as exc:  # an import error, or any error the plugin's import raises
        raise PluginRefused(name, f"{origin} does not load: {type(exc).__name__}: {exc}") from exc
    if not callable(function):
        raise PluginRefused(name, f"{origin} is not a function but {type(function).__name__}")
    declared = getattr(function, API_ATTRIBUTE, None)
    major = API_VERSION[0]
    if declared is None:
        raise PluginRefused(
            name, f"{origin} declares no plugin API version: set {API_ATTRIBUTE} = {major} on it"
        )
    if not isinstance(declared, int) or isinstance(declared, bool):
        raise PluginRefused(name, f"{origin}: {API_ATTRIBUTE} must be an int, got {declared!r}")
    if declared != major:
        raise PluginRefused(
            name,
            f"{origin} is built for plugin API {declared}.x; this jetcrawl speaks "
            f"{major}.{API_VERSION[1]} (upgrade the plugin or jetcrawl so that the majors agree)",
        )
    return Plugin(name, origin, declared, function)


def _origin(entry: EntryPoint) -> str:
    dist = entry.dist
    return f"{entry.value} ({dist.name} {dist.version})" if dist is not None else entry.value


def _checked(name: str, output: Any, page: Page) -> Output:
    if not isinstance(output, Output):
        raise PluginFailed(name, f"returned {type(output).__name__}, not an Output")
    for part in ("items", "links"):
        if not isinstance(getattr(output, part), tuple | list):
            kind = type(getattr(output, part)).__name__
            raise PluginFailed(name, f"{part} is {kind}, not a tuple (read once, it would be lost)")
    keys: set[str] = set()
    for at, item in enumerate(output.items):
        where = f"items[{at}]"
        if not isinstance(item, ItemOut):
            raise PluginFailed(name, f"{where} is {type(item).__name__}, not an ItemOut")
        if not isinstance(item.key, str) or not 0 < len(item.key) <= ITEM_KEY_MAX:
            raise PluginFailed(name, f"{where}.key must be 1..{ITEM_KEY_MAX} characters")
        if item.key in keys:
            raise PluginFailed(name, f"{where}.key {item.key!r} is the key of an earlier item")
        keys.add(item.key)
        if not isinstance(item.data, Mapping):
            raise PluginFailed(name, f"{where}.data is {type(item.data).__name__}, not a mapping")
        try:
            orjson.dumps(dict(item.data))
        except TypeError as exc:  # orjson's JSONEncodeError: a value or key JSON cannot hold
            raise PluginFailed(name, f"{where}.data is not JSON: {exc}") from None
    for at, link in enumerate(output.links):
        where = f"links[{at}]"
        if not isinstance(link, LinkOut):
            raise PluginFailed(name, f"{where} is {type(link).__name__}, not a LinkOut")
        if not isinstance(link.url, str):
            raise PluginFailed(name, f"{where}.url is {type(link.url).__name__}, not a str")
        try:
            canonicalize(link.url, base=page.final_url)
        except UrlError as exc:
            raise PluginFailed(name, f"{where}.url is no crawlable URL: {exc}") from None
        if link.priority is not None:
            try:
                check_priority(link.priority, f"{where}.priority")
            except MessageError as exc:
                raise PluginFailed(name, exc.detail) from None
        if not isinstance(link.meta, Mapping):
            raise PluginFailed(name, f"{where}.meta is {type(link.meta).__name__}, not a mapping")
        try:
            orjson.dumps(dict(link.meta))
        except TypeError as exc:
            raise PluginFailed(name, f"{where}.meta is not JSON: {exc}") from None
    return output
