"""Read one frontier message into candidate tasks and rejections. Pure: no I/O.

A seed becomes a depth-0 task with the seed's (or the default) job, scope and depth limit. A
discovered-links message becomes tasks one level deeper that inherit the parent's lineage; links
beyond the depth limit or outside the scope are filtered (counted, not dead-lettered: they are
the crawl's rules, not bad input), and so are links that look like a spider trap: a path that
repeats one segment more than ``max_repeated_segments`` times. Everything that cannot be read is
a rejection with a reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from jetcrawl.contract.errors import MessageError, SpecError, UrlError
from jetcrawl.contract.jobs import JobSpec
from jetcrawl.contract.messages import (
    Discovered,
    DiscoveredPages,
    Lineage,
    Seed,
    SeedReject,
    Task,
    decode_seeds,
    seen_key,
)
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import DISCOVERED, SEEDS
from jetcrawl.contract.urls import (
    UrlRules,
    fingerprint,
    in_scope,
    most_repeated_segment,
    scope_root,
)

CANONICAL_CACHE_SIZE = 50_000
SEED_STAGE = "seeds"
DISCOVERED_STAGE = "discovered"
FRONTIER_STAGE = "frontier"


class _Link(NamedTuple):
    url: str  # canonical
    fp: str
    repeated: int  # most_repeated_segment(url)


@dataclass(frozen=True, slots=True)
class Rejection:
    stage: str
    reason: str
    detail: str
    original: bytes


@dataclass(slots=True)
class Reading:
    """What one frontier message holds."""

    tasks: list[Task] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    out_of_scope: int = 0
    too_deep: int = 0
    traps: int = 0
    known: int = 0  # links the caller's ``known`` said were seen already
    specs: list[JobSpec] = field(default_factory=list)  # carried inline by seeds: stored first
    unreadable: bool = False  # nothing in it could be read: terminate it after dead-lettering


class Intake:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._rules = UrlRules.from_settings(settings)
        # Discovered links repeat from page to page (navigation, footers): their canonical form,
        # fingerprint and trap measure are remembered, bounded, so most cost a dict lookup.
        self._links: dict[str, _Link] = {}

    def read(
        self, subject: str, data: bytes, known: Callable[[str], object | None] | None = None
    ) -> Reading:
        """What the message holds. ``known(seen_key)``, when given, says which discovered links
        are already seen (not None): those are only counted (``Reading.known``), not tasks."""
        if subject == SEEDS:
            return self._read_seeds(data)
        if subject == DISCOVERED:
            return self._read_discovered(data, known)
        reading = Reading(unreadable=True)
        reading.rejections.append(
            Rejection(FRONTIER_STAGE, "unknown_subject", f"subject {subject!r}", data)
        )
        return reading

    def _read_seeds(self, data: bytes) -> Reading:
        reading = Reading()
        for item in decode_seeds(data):
            if isinstance(item, SeedReject):
                fragment = item.fragment.encode() if item.fragment else data
                reading.rejections.append(Rejection(SEED_STAGE, item.reason, item.detail, fragment))
                continue
            if item.spec is not None:
                try:
                    item = self._inline_spec(item, reading)
                except SpecError as e:
                    reading.rejections.append(
                        Rejection(SEED_STAGE, "bad_spec", str(e), item.url.encode())
                    )
                    continue
            try:
                reading.tasks.append(self._seed_task(item))
            except UrlError as e:
                reading.rejections.append(
                    Rejection(SEED_STAGE, e.reason, f"seed URL rejected: {e}", item.url.encode())
                )
        reading.unreadable = not reading.tasks
        return reading

    @staticmethod
    def _inline_spec(seed: Seed, reading: Reading) -> Seed:
        """The seed under the job its inline spec names; the spec is read strictly, its paths
        prefixed ``spec.``."""
        try:
            spec = JobSpec.read(seed.spec)
        except SpecError as e:
            raise SpecError(f"spec.{e.path}" if e.path else "spec", e.problem) from e
        if seed.job is not None and seed.job != spec.name:
            raise SpecError("job", f"names job {seed.job!r}, its spec {spec.name!r}")
        reading.specs.append(spec)
        return dataclasses.replace(seed, job=spec.name, spec=None)

    def _seed_task(self, seed: Seed) -> Task:
        url = self._rules.canonicalize(seed.url)
        scope = seed.scope or self._settings.default_scope
        lineage = Lineage(
            job=seed.job or self._settings.default_job,
            scope=scope,
            root=scope_root(url, scope),
            max_depth=(
                seed.max_depth if seed.max_depth is not None else self._settings.default_max_depth
            ),
            priority=seed.priority,
        )
        return Task(url, fingerprint(url), 0, lineage, None, prio=seed.priority)

    def _link(self, link: str) -> _Link:
        """What the intake needs of a link, remembered: links repeat from page to page."""
        known = self._links.get(link)
        if known is None:
            url = self._rules.canonicalize(link)  # raises UrlError, which is not remembered
            known = _Link(url, fingerprint(url), most_repeated_segment(url))
            if len(self._links) >= CANONICAL_CACHE_SIZE:
                del self._links[next(iter(self._links))]  # the oldest
            self._links[link] = known
        return known

    def _read_discovered(
        self, data: bytes, known: Callable[[str], object | None] | None
    ) -> Reading:
        reading = Reading()
        try:
            pages = DiscoveredPages.from_wire(data).pages
        except MessageError as e:
            reading.unreadable = True
            reading.rejections.append(Rejection(DISCOVERED_STAGE, e.reason, e.detail, data))
            return reading
        for page in pages:
            self._read_page(page, reading, known)
        return reading

    def _read_page(
        self, page: Discovered, reading: Reading, known: Callable[[str], object | None] | None
    ) -> None:
        lineage = page.lineage
        if page.depth > lineage.max_depth:
            reading.too_deep += len(page.links)
            return
        max_repeated = self._settings.max_repeated_segments
        job = lineage.job
        any_scope = lineage.scope == "any"
        tasks = reading.tasks
        levels = page.priorities  # the levels a plugin gave links
        for link in page.links:
            try:
                url, fp, repeated = self._link(link)
            except UrlError as e:
                reading.rejections.append(
                    Rejection(DISCOVERED_STAGE, e.reason, f"link of {page.parent}", link.encode())
                )
                continue
            if not any_scope and not in_scope(url, lineage.scope, lineage.root):
                reading.out_of_scope += 1
                continue
            if 0 < max_repeated < repeated:
                reading.traps += 1
                continue
            if known is not None and known(seen_key(job, url, fp)) is not None:
                reading.known += 1  # most links: no Task object, no further look
                continue
            tasks.append(Task(url, fp, page.depth, lineage, page.parent, 0, levels.get(link)))
