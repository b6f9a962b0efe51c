"""A job spec's link rules, extension filters, depth limit and priorities on a reading's tasks.
Pure: no I/O.

The dispatcher reads a frontier message (:mod:`jetcrawl.dispatcher.intake`) and then asks
:func:`follow` which of its tasks their job's spec lets in, before any seen mark is made: a URL
the spec does not follow is never marked seen, so a later version of the spec that allows it can
still admit it. Seeds (depth 0) are what the user asked for and pass the link rules and the
extension filter; the spec's ``max_depth`` applies to them as to every task. A job without a spec
keeps every task but those whose extension the crawl ignores by default (``ignored_extensions``,
:mod:`jetcrawl.contract.filetypes`).

Each task kept gets its priority level, the first of: the level its link or seed gave it (a
plugin's link, a seed's ``priority``), the spec's first ``priority.rules`` matching the URL, the
level its seed gave the crawl (inherited), the spec's ``priority.default``, ``default_priority``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from jetcrawl.contract.filetypes import extension_rule
from jetcrawl.contract.jobs import JobSpec
from jetcrawl.contract.messages import Task
from jetcrawl.contract.urls import host_of
from jetcrawl.dispatcher.intake import Reading

__all__ = ["Followed", "follow"]


@dataclass(frozen=True, slots=True)
class Followed:
    not_followed: int = 0  # links the spec's link rules or extension filters refuse
    too_deep: int = 0  # tasks deeper than the spec's max_depth


def follow(
    reading: Reading,
    spec_of: Callable[[str], JobSpec | None],
    default_level: int,
    ignored: tuple[str, ...] = (),
) -> Followed:
    """Drop from ``reading.tasks`` what their job's spec refuses, or for a job without one the
    crawl's ``ignored`` extensions; how many, and why. The tasks kept get their priority level."""
    kept = []
    not_followed = too_deep = 0
    default = extension_rule(ignored=ignored)
    for task in reading.tasks:
        spec = spec_of(task.lineage.job)
        if spec is None:
            if task.depth > 0 and not default.follows(task.url):
                not_followed += 1
                continue
        elif spec.max_depth is not None and task.depth > spec.max_depth:
            too_deep += 1
            continue
        elif task.depth > 0 and not spec.follows(task.url, host_of(task.url), ignored):
            not_followed += 1
            continue
        level = level_of(task, spec, default_level)
        kept.append(task if task.level == level else dataclasses.replace(task, prio=level))
    reading.tasks = kept
    return Followed(not_followed, too_deep)


def level_of(task: Task, spec: JobSpec | None, default_level: int) -> int:
    """The priority level ``task`` is queued at (see the module's docstring)."""
    if task.prio is not None:
        return task.prio
    if spec is not None:
        ruled = spec.priority.level_of(task.url)
        if ruled is not None:
            return ruled
    if task.lineage.priority is not None:
        return task.lineage.priority
    if spec is not None and spec.priority.default is not None:
        return spec.priority.default
    return default_level
