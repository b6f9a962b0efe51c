"""What a page's job makes of it, as publishes: items, dead letters, links.

:func:`job_output` runs the job's sources on a fetched page (:func:`jetcrawl.worker.jobs.run_page`)
and returns what the task publishes before its ack, beside its result:

- each item on ``crawl.items.<job>`` with ``Nats-Msg-Id`` = ``Item.msg_id`` (a redelivered
  task's items are dropped as copies);
- each failure as a dead letter on ``crawl.dead.extract`` whose detail names the source, the
  exception and the page's fingerprint; its original is the task, so ``jetcrawl dlq replay``
  crawls the page again once the plugin is fixed;
- the links plugins returned, canonical: those of the page's own job join the page's links
  (the same scope and depth rules), those of another job go to the frontier in a message of
  their own, under that job.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from nats.aio.msg import Msg

from jetcrawl.contract.deadletters import STAGE_EXTRACT
from jetcrawl.contract.errors import UrlError
from jetcrawl.contract.items import Item
from jetcrawl.contract.messages import Discovered, Task
from jetcrawl.contract.plugin import Page
from jetcrawl.contract.topology import DISCOVERED, item_subject
from jetcrawl.contract.urls import UrlRules
from jetcrawl.plumbing.bus import MSG_ID, Outgoing
from jetcrawl.plumbing.deadletters import dead_letter, to_outgoing
from jetcrawl.worker.fetcher import Fetched
from jetcrawl.worker.jobs import CompiledJob, run_page

__all__ = ["JobOutput", "job_output"]


@dataclass(slots=True)
class JobOutput:
    outputs: list[Outgoing] = field(default_factory=list)  # items, dead letters, other jobs' links
    links: list[str] = field(default_factory=list)  # canonical links of the page's own job
    levels: dict[str, int] = field(default_factory=dict)  # of those, the levels plugins gave
    items: int = 0
    failures: int = 0
    invalid_links: int = 0  # plugin links that are no URL jetcrawl crawls: left out


def job_output(
    job: CompiledJob,
    msg: Msg,
    task: Task,
    fetched: Fetched,
    crawl_id: str,
    rules: UrlRules,
    *,
    trace_id: str | None,
    dead_max_bytes: int,
) -> JobOutput:
    name = task.lineage.job
    page = Page(
        url=task.url,
        final_url=fetched.final_url,
        status=fetched.status,
        headers=fetched.headers,
        content_type=fetched.content_type,
        body=fetched.body,
        text=fetched.body.decode(fetched.charset or "utf-8", "replace")
        if _known_codec(fetched.charset)
        else fetched.body.decode("utf-8", "replace"),
        depth=task.depth,
        job=name,
        spec_version=job.version,
    )
    ran = run_page(job, page)
    out = JobOutput(items=len(ran.items), failures=len(ran.failures))
    subject = item_subject(name)
    for source, produced in ran.items:
        item = Item(
            job=name,
            spec_version=job.version,
            key=produced.key,
            fp=task.fp,
            url=task.url,
            crawl_id=crawl_id,
            source=source,
            data=dict(produced.data),
            fetched_at=fetched.fetched_at,
            trace_id=trace_id,
        )
        out.outputs.append(Outgoing(subject, item.to_wire(), {MSG_ID: item.msg_id}))
    for failure in ran.failures:
        letter = dead_letter(
            msg,
            STAGE_EXTRACT,
            failure.reason,
            f"{failure.source} on {task.url} (fp {task.fp}): {failure.detail}",
            max_bytes=dead_max_bytes,
        )
        out.outputs.append(to_outgoing(letter, f"dead-{crawl_id}-{failure.source}"))
    others: dict[str, list[str]] = {}
    other_levels: dict[str, dict[str, int]] = {}
    for link in ran.links:
        try:
            url = rules.canonicalize(link.url, base=fetched.final_url)
        except UrlError:
            out.invalid_links += 1
            continue
        if link.job in (None, name):
            out.links.append(url)
            if link.priority is not None:
                out.levels[url] = link.priority
        else:
            others.setdefault(link.job, []).append(url)
            if link.priority is not None:
                other_levels.setdefault(link.job, {})[url] = link.priority
    for other, urls in others.items():
        lineage = dataclasses.replace(task.lineage, job=other)
        found = Discovered(
            task.url,
            task.fp,
            task.depth + 1,
            lineage,
            tuple(dict.fromkeys(urls)),
            other_levels.get(other, {}),
        )
        out.outputs.append(
            Outgoing(DISCOVERED, found.to_wire(), {MSG_ID: f"{crawl_id}:links:{other}"})
        )
    return out


def _known_codec(charset: str | None) -> bool:
    if not charset:
        return False
    try:
        b"".decode(charset)
    except LookupError:
        return False
    return True
