"""Finding sinks: the entry points of group ``jetcrawl.sinks``, jetcrawl's own ones included.

A plugin that cannot be loaded, is no :class:`~jetcrawl.sinks.api.SinkPlugin` or was written for
another major version of the interface is not fatal to the other commands: it is reported as
:class:`Unusable`, and ``jetcrawl sink NAME`` says why in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import entry_points

from jetcrawl.sinks.api import SINK_API_VERSION, SinkPlugin

__all__ = ["ENTRY_POINT_GROUP", "Unusable", "find_sinks"]

ENTRY_POINT_GROUP = "jetcrawl.sinks"


@dataclass(frozen=True, slots=True)
class Unusable:
    """A sink entry point that cannot be used, and why."""

    name: str
    target: str  # the entry point's value, module:attribute
    problem: str


def find_sinks() -> dict[str, SinkPlugin | Unusable]:
    """Every sink installed, by name."""
    found: dict[str, SinkPlugin | Unusable] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            plugin = ep.load()
        except Exception as e:  # a third party's import error: said, not fatal to jetcrawl
            found[ep.name] = Unusable(ep.name, ep.value, f"cannot be loaded: {e!r}")
            continue
        if not isinstance(plugin, SinkPlugin):
            found[ep.name] = Unusable(
                ep.name, ep.value, f"is a {type(plugin).__name__}, not a jetcrawl SinkPlugin"
            )
        elif plugin.api_version != SINK_API_VERSION:
            found[ep.name] = Unusable(
                ep.name,
                ep.value,
                f"was written for sink API version {plugin.api_version}; this jetcrawl has "
                f"version {SINK_API_VERSION}",
            )
        else:
            found[ep.name] = plugin
    return found
