"""A fetched page through its job's spec: extraction and plugins into items, links and failures.

:class:`Jobs` turns the spec the watch holds for a task's job (:mod:`jetcrawl.plumbing.specs`)
into a :class:`CompiledJob` (its extraction compiled by :mod:`jetcrawl.worker.extract`, its
plugins loaded by :mod:`jetcrawl.worker.plugins`), once per version, so a spec put mid-crawl
applies to the tasks fetched after the watch has seen it. :func:`run_page` runs each source of a
compiled job on one page. A source that raises or returns what is not a valid ``Output`` gives a
:class:`PageFailure` carrying the exception, and none of its items; a plugin that cannot be
loaded (not installed, another API major) fails every page of the job the same way. The caller
turns a failure into a dead letter with the page's fingerprint, records the page and acks the
task as usual: no exception of a plugin reaches the worker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from jetcrawl.contract.fetchpolicy import FetchPolicy
from jetcrawl.contract.jobs import JobSpec, StoredSpec
from jetcrawl.contract.messages import JOB_RE
from jetcrawl.contract.plugin import ItemOut, LinkOut, Output, Page
from jetcrawl.worker.errors import PluginFailed, PluginRefused
from jetcrawl.worker.extract import compile_extraction
from jetcrawl.worker.plugins import Plugin, load_plugin

__all__ = [
    "EXTRACT_SOURCE",
    "CompiledJob",
    "Jobs",
    "PageFailure",
    "PageOutput",
    "Processor",
    "check_extraction",
    "run_page",
]

log = logging.getLogger(__name__)

EXTRACT_SOURCE = "extract"  # an item's source when the job's extraction made it
Processor = Callable[[Page], Output]
# The reasons of a page's dead letter (stage extract)
RAISED = "plugin_raised"  # the source raised
BAD_OUTPUT = "bad_output"  # it returned what is not a valid Output
MISSING = "plugin_unavailable"  # the plugin cannot be loaded here, or the spec does not compile


@dataclass(frozen=True, slots=True)
class PageFailure:
    source: str  # "extract" or the plugin's entry-point name
    reason: str  # RAISED, BAD_OUTPUT or MISSING
    detail: str  # the exception, or what was wrong with the output


@dataclass(frozen=True, slots=True)
class PageOutput:
    items: list[tuple[str, ItemOut]] = field(default_factory=list)  # (source, item)
    links: list[LinkOut] = field(default_factory=list)  # without a job: the page's
    failures: list[PageFailure] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class CompiledJob:
    version: int
    spec: JobSpec
    sources: tuple[tuple[str, Processor], ...]  # (source name, processor), extraction first
    unavailable: tuple[tuple[str, str], ...] = ()  # (source, why): each page says so


def check_extraction(spec: JobSpec) -> Processor | None:
    """The job's extraction compiled, or None without one; raises ``SpecError`` at its path."""
    if spec.extract is None:
        return None
    return compile_extraction(spec.extract, "extract").run


def _plugin(name: str) -> Processor:
    loaded: Plugin = load_plugin(name)
    return loaded.run


def compile_job(stored: StoredSpec, load: Callable[[str], Processor] = _plugin) -> CompiledJob:
    sources: list[tuple[str, Processor]] = []
    extraction = check_extraction(stored.spec)
    if extraction is not None:
        sources.append((EXTRACT_SOURCE, extraction))
    unavailable = []
    for name in stored.spec.plugins:
        try:
            sources.append((name, load(name)))
        except PluginRefused as e:
            log.error("job %s version %d: %s", stored.name, stored.version, e)
            unavailable.append((name, str(e)))
    return CompiledJob(stored.version, stored.spec, tuple(sources), tuple(unavailable))


class Jobs:
    """Each job's compiled spec, as the watch (``current``) last showed it."""

    def __init__(
        self,
        current: Callable[[str], StoredSpec | None],
        load: Callable[[str], Processor] = _plugin,
    ) -> None:
        self._current = current
        self._load = load
        self._compiled: dict[str, CompiledJob] = {}

    def compile_all(self, jobs: list[str]) -> None:
        """Compile every job's spec now, so that a plugin that cannot be used is refused (and
        logged) when the worker starts, not at the job's first page."""
        for job in jobs:
            self.of(job)

    def fetch_policy(self, job: str) -> FetchPolicy | None:
        """The fetch policy of ``job``'s current spec, or None (the settings' applies)."""
        stored = self._current(job)
        return None if stored is None else stored.spec.fetch

    def of(self, job: str) -> CompiledJob | None:
        """The job's spec compiled, or None for a job without one (today's crawl)."""
        stored = self._current(job)
        if stored is None:
            return None
        known = self._compiled.get(job)
        if known is None or known.version != stored.version:
            try:
                known = compile_job(stored, self._load)
            except Exception as e:  # a spec stored without `job put`'s checks: said per page
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
        except PluginFailed as e:
            reason = RAISED if e.error is not None else BAD_OUTPUT
            out.failures.append(PageFailure(source, reason, e.problem))
            continue
        except Exception as e:  # the extraction's bug: the page's failure, not the worker's
            out.failures.append(PageFailure(source, RAISED, _exception(e)))
            continue
        bad_job = next((link.job for link in result.links if not _job_ok(link.job)), None)
        if bad_job is not None:
            problem = f"a link's job must match {JOB_RE.pattern}, got {bad_job!r}"
            out.failures.append(PageFailure(source, BAD_OUTPUT, problem))
            continue
        out.items.extend((source, item) for item in result.items)
        out.links.extend(
            link if link.job is not None else LinkOut(link.url, page.job, link.priority, link.meta)
            for link in result.links
        )
    return out


def _job_ok(job: object) -> bool:
    return job is None or (isinstance(job, str) and JOB_RE.match(job) is not None)


def _exception(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"
