"""A fetched page through its job's spec: extraction and plugins into items, links and failures.

:class:`Jobs` turns the spec the watch holds for a task's job (:mod:`jetcrawl.plumbing.specs`)
into a :class:`CompiledJob` (its extraction compiled, its plugins loaded), once per version, so
a spec put mid-crawl applies to the tasks fetched after the watch has seen it. :func:`run_page`
runs each source of a compiled job on one page. A source that raises, returns something that is
not an ``Output``, or returns items that cannot be published (a key out of bounds or twice, data
that is not JSON) gives a :class:`PageFailure` carrying the exception, and none of its items: the
caller turns it into a dead letter with the page's fingerprint, records the page and acks the
task as usual. No exception of a plugin reaches the worker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

import orjson

from jetcrawl.contract.items import ITEM_KEY_MAX
from jetcrawl.contract.jobs import JobSpec, StoredSpec
from jetcrawl.contract.messages import JOB_RE
from jetcrawl.contract.plugin import API_VERSION, ENTRY_POINT_GROUP, ItemOut, LinkOut, Output, Page

__all__ = [
    "EXTRACT_SOURCE",
    "CompiledJob",
    "Jobs",
    "PageFailure",
    "PageOutput",
    "Processor",
    "check_extraction",
    "load_plugin",
    "run_page",
]

log = logging.getLogger(__name__)

EXTRACT_SOURCE = "extract"  # an item's source when the job's extraction made it
Processor = Callable[[Page], Output]
# The failures a page's dead letter names (stage STAGE_EXTRACT)
RAISED = "plugin_raised"
BAD_OUTPUT = "bad_output"
MISSING = "plugin_unavailable"


class PluginUnavailable(Exception):
    """A plugin the spec names cannot be used here: not installed, or built for another API."""


@dataclass(frozen=True, slots=True)
class PageFailure:
    source: str  # "extract" or the plugin's entry-point name
    reason: str  # RAISED, BAD_OUTPUT or MISSING
    detail: str  # the exception, as "Type: message"


@dataclass(frozen=True, slots=True)
class PageOutput:
    items: list[tuple[str, ItemOut]] = field(default_factory=list)  # (source, item)
    links: list[LinkOut] = field(default_factory=list)
    failures: list[PageFailure] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class CompiledJob:
    version: int
    spec: JobSpec
    sources: tuple[tuple[str, Processor], ...]  # (source name, processor), extraction first
    unavailable: tuple[tuple[str, str], ...] = ()  # (plugin, why): each page says so


def load_plugin(name: str) -> Processor:
    """The plugin ``name`` of the entry-point group; raises :class:`PluginUnavailable`."""
    found = entry_points(group=ENTRY_POINT_GROUP, name=name)
    if not found:
        raise PluginUnavailable(f"plugin {name!r} is not installed ({ENTRY_POINT_GROUP})")
    [entry] = list(found)[:1]
    try:
        plugin = entry.load()
    except Exception as e:  # whatever importing someone's package raises
        raise PluginUnavailable(f"plugin {name!r} does not load: {_exception(e)}") from e
    wanted = getattr(plugin, "api_version", None)
    major = wanted[0] if isinstance(wanted, tuple) and wanted else wanted
    if major != API_VERSION[0]:
        raise PluginUnavailable(
            f"plugin {name!r} is built for plugin API {wanted!r}, this worker runs "
            f"{API_VERSION[0]}.x"
        )
    if not callable(plugin):
        raise PluginUnavailable(f"plugin {name!r} is not callable")
    return plugin


def check_extraction(spec: JobSpec) -> Processor | None:
    """The job's extraction compiled, or None without one; raises ``SpecError`` at its path."""
    if spec.extract is None:
        return None
    from jetcrawl.contract.errors import SpecError

    raise SpecError("extract", "this build has no extraction engine yet (worker/extract.py)")


def compile_job(stored: StoredSpec, load: Callable[[str], Processor] = load_plugin) -> CompiledJob:
    sources: list[tuple[str, Processor]] = []
    extraction = check_extraction(stored.spec)
    if extraction is not None:
        sources.append((EXTRACT_SOURCE, extraction))
    unavailable = []
    for name in stored.spec.plugins:
        try:
            sources.append((name, load(name)))
        except PluginUnavailable as e:
            log.error("job %s version %d: %s", stored.name, stored.version, e)
            unavailable.append((name, str(e)))
    return CompiledJob(stored.version, stored.spec, tuple(sources), tuple(unavailable))


class Jobs:
    """Each job's compiled spec, as the watch (``current``) last showed it."""

    def __init__(
        self,
        current: Callable[[str], StoredSpec | None],
        load: Callable[[str], Processor] = load_plugin,
    ) -> None:
        self._current = current
        self._load = load
        self._compiled: dict[str, CompiledJob] = {}

    def of(self, job: str) -> CompiledJob | None:
        """The job's spec compiled, or None for a job without one (today's crawl)."""
        stored = self._current(job)
        if stored is None:
            return None
        known = self._compiled.get(job)
        if known is None or known.version != stored.version:
            try:
                known = compile_job(stored, self._load)
            except Exception as e:  # a spec put without `job put`'s checks: say so per page
                log.error("job %s version %d does not compile: %r", job, stored.version, e)
                known = CompiledJob(
                    stored.version, stored.spec, (), ((EXTRACT_SOURCE, _exception(e)),)
                )
            self._compiled[job] = known
        return known


def run_page(job: CompiledJob, page: Page) -> PageOutput:
    out = PageOutput()
    for name, why in job.unavailable:
        out.failures.append(PageFailure(name, MISSING, why))
    for source, processor in job.sources:
        try:
            result = processor(page)
        except Exception as e:  # the plugin's bug, not ours: a dead letter, and on
            out.failures.append(PageFailure(source, RAISED, _exception(e)))
            continue
        try:
            items, links = _checked(result, page.job)
        except BadOutput as e:
            out.failures.append(PageFailure(source, BAD_OUTPUT, str(e)))
            continue
        out.items.extend((source, item) for item in items)
        out.links.extend(links)
    return out


class BadOutput(Exception):
    pass


def _checked(result: Any, job: str) -> tuple[list[ItemOut], list[LinkOut]]:
    if not isinstance(result, Output):
        raise BadOutput(f"returned {type(result).__name__}, not an Output")
    keys: set[str] = set()
    for i, item in enumerate(_each(result.items, "items")):
        if not isinstance(item, ItemOut):
            raise BadOutput(f"items[{i}] is {type(item).__name__}, not an ItemOut")
        if not isinstance(item.key, str) or not 0 < len(item.key) <= ITEM_KEY_MAX:
            raise BadOutput(f"items[{i}].key must be a string of 1..{ITEM_KEY_MAX} characters")
        if item.key in keys:
            raise BadOutput(f"items[{i}].key {item.key!r} is used twice on one page")
        keys.add(item.key)
        try:
            orjson.dumps(dict(item.data))
        except (TypeError, ValueError, orjson.JSONEncodeError) as e:
            raise BadOutput(f"items[{i}].data is not a JSON object: {e}") from e
    for i, link in enumerate(_each(result.links, "links")):
        if not isinstance(link, LinkOut) or not isinstance(link.url, str):
            raise BadOutput(f"links[{i}] is not a LinkOut with a URL string")
        if link.job is not None and (not isinstance(link.job, str) or not JOB_RE.match(link.job)):
            raise BadOutput(f"links[{i}].job must match {JOB_RE.pattern}, got {link.job!r}")
    return list(result.items), [
        link if link.job is not None else LinkOut(link.url, job, link.priority, link.meta)
        for link in result.links
    ]


def _each(values: Any, name: str) -> Iterator[Any]:
    if not isinstance(values, tuple | list):
        raise BadOutput(f"{name} is {type(values).__name__}, not a tuple")
    return iter(values)


def _exception(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"
