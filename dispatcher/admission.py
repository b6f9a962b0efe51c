"""A batch's admission, decided without I/O: which URLs to mark seen, which tasks to publish.

The dispatcher (:mod:`jetcrawl.dispatcher.service`) reads a batch of frontier messages, asks
:func:`candidates` what to mark, carries out the quota reservations and the seen-set creates,
reads the marks a redelivery needs, and asks :func:`decide` which tasks to publish. Everything
between the two calls is I/O; everything in them is a pure function of what it was given.

The rule (DESIGN.md, "a seen mark without a task is a lost URL"): a URL whose mark this batch
created is published by the message that created it; a redelivered message (or one replayed
from a dead letter) also publishes the tasks of existing marks that carry one of the sequences it
owns, since its earlier delivery may have made them without publishing; anything else is a
duplicate.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field

from jetcrawl.contract.messages import Task
from jetcrawl.contract.urls import host_of
from jetcrawl.dispatcher.intake import Reading
from jetcrawl.dispatcher.quota import host_key
from jetcrawl.dispatcher.seen import Mark

__all__ = ["Candidates", "Decision", "candidates", "decide"]


@dataclass(slots=True)
class Candidates:
    pairs: list[tuple[int, Task, str]]  # (message index, task, seen key) of every valid link
    to_create: dict[str, int]  # seen key -> the sequence of the message that would admit it
    known: dict[str, Mark]  # seen key -> the mark the cache knows (no create for those)
    by_job: dict[str, list[str]]  # job -> keys to create, for max_pages
    by_host: dict[str, list[str]]  # job and host -> keys to create, for max_urls_per_host

    def drop(self, keys: Sequence[str]) -> None:
        """A quota refused these keys: no mark is created for them."""
        for key in keys:
            del self.to_create[key]


@dataclass(slots=True)
class Decision:
    tasks: list[tuple[int, Task]] = field(default_factory=list)  # (message index, task) to publish
    admitted: int = 0  # tasks of marks this batch created
    republished: int = 0  # tasks of existing marks a redelivered message owns
    duplicates: int = 0  # links to URLs already admitted, or twice in this batch


def candidates(
    seqs: Sequence[int], readings: Sequence[Reading], cached: Callable[[str], Mark | None]
) -> Candidates:
    """Every valid link of the batch, and the keys to create: those the cache does not know,
    each once, owned by the first message that has it."""
    out = Candidates([], {}, {}, {}, {})
    for i, reading in enumerate(readings):
        for task in reading.tasks:
            key = task.seen_key
            out.pairs.append((i, task, key))
            if key in out.to_create or key in out.known:
                continue
            mark = cached(key)
            if mark is not None:
                out.known[key] = mark
            else:
                out.to_create[key] = seqs[i]
                out.by_job.setdefault(task.lineage.job, []).append(key)
                host = host_key(task.lineage.job, host_of(task.url))
                out.by_host.setdefault(host, []).append(key)
    return out


def unknown_origins(c: Candidates, owned: Sequence[tuple[int, ...] | None]) -> set[str]:
    """Existing marks that a redelivered message must read before :func:`decide`: those whose
    origin this batch does not know (revision 0: the bucket had it)."""
    return {
        key
        for i, _, key in c.pairs
        if owned[i] is not None and key in c.known and c.known[key].revision == 0
    }


def decide(
    c: Candidates,
    seqs: Sequence[int],
    owned: Sequence[tuple[int, ...] | None],
    created: Mapping[str, Mark],
    *,
    recrawl: bool,
    recrawl_jobs: Container[str] = (),
) -> Decision:
    """The tasks to publish. ``owned``: for a message that may have made marks before, the
    sequences they carry (None on a first delivery); ``created``: the marks this batch made;
    ``c.known`` holds every other mark read. With ``recrawl`` (or for a job of
    ``recrawl_jobs``: its spec re-crawls), a task carries its mark's revision (``gen``), which
    tells one crawl of a URL from the next."""
    decision = Decision()
    published: set[str] = set()
    for i, task, key in c.pairs:
        mark = created.get(key)
        own = owned[i]
        if mark is None and own is None:
            decision.duplicates += 1  # the common case: a link to a URL already seen
        elif key in published:
            decision.duplicates += 1
        elif mark is not None and mark.origin == seqs[i]:
            again = recrawl or task.lineage.job in recrawl_jobs
            decision.tasks.append((i, _generation(task, mark.revision, again)))
            published.add(key)
            decision.admitted += 1
        elif own is not None and (known := c.known.get(key)) is not None and known.origin in own:
            again = recrawl or task.lineage.job in recrawl_jobs
            decision.tasks.append((i, _generation(task, known.revision, again)))
            published.add(key)
            decision.republished += 1
        else:
            decision.duplicates += 1
    return decision


def _generation(task: Task, revision: int, recrawl: bool) -> Task:
    return dataclasses.replace(task, gen=revision) if recrawl else task
