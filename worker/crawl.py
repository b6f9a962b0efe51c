"""One task, start to finish: robots -> fetch -> parse -> publish result and links -> ack.

The task is acked only after JetStream has acknowledged its result and its discovered links, so a
crash anywhere before that redelivers it; both publishes carry ``Nats-Msg-Id`` so the redelivery
adds no second record. Transient failures are handed back with ``nak(delay)`` until the delivery
count runs out (:mod:`worker.retry`); then the failure is the result.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass

from nats.aio.msg import Msg

from jetcrawl.bus import MSG_ID, Outbox, Outgoing, PublishFailed
from jetcrawl.errors import MessageError
from jetcrawl.messages import DeadLetter, Discovered, Failure, Result, Task
from jetcrawl.settings import Settings
from jetcrawl.topology import DISCOVERED, dead_subject, result_subject
from jetcrawl.urls import UrlRules, in_scope
from worker.errors import FetchError
from worker.fetcher import Fetched, Fetcher
from worker.parse import Page, extract
from worker.retry import retry_delay
from worker.robots import Robots

log = logging.getLogger(__name__)

PUBLISH_RETRY_DELAY_S = 1.0
FAULT_AFTER_RESULT = "worker.after_result"


@dataclass(slots=True)
class CrawlStats:
    tasks: int = 0  # tasks finished (acked or terminated)
    fetched: int = 0
    disallowed: int = 0
    failed: int = 0
    retried: int = 0
    links_published: int = 0
    dead_letters: int = 0


@dataclass(frozen=True, slots=True)
class Ownership:
    """Which shard a task came from, and the fencing token of our ownership of it."""

    shard: int
    fence: int


class TaskProcessor:
    def __init__(
        self,
        settings: Settings,
        worker_id: str,
        outbox: Outbox,
        fetcher: Fetcher,
        robots: Robots,
    ) -> None:
        self._settings = settings
        self._worker_id = worker_id
        self._outbox = outbox
        self._fetcher = fetcher
        self._robots = robots
        self._rules = UrlRules.from_settings(settings)
        self.stats = CrawlStats()

    async def process(self, msg: Msg, owner: Ownership) -> None:
        try:
            task = Task.from_wire(msg.data)
        except MessageError as e:
            await self._dead_letter(msg, e.reason, e.detail)
            return
        delivered = msg.metadata.num_delivered or 1
        started = time.time()
        verdict = await self._robots.check(task.url)
        if not verdict.allowed and verdict.reason == "unavailable":
            delay = retry_delay(delivered, self._settings.task_max_deliver, transient=True)
            if delay is not None:
                await self._retry(msg, delay)
                return
            result = self._failure(
                task, owner, started, delivered, "robots_unavailable", "robots.txt unavailable"
            )
            await self._finish(msg, result, None)
            return
        if not verdict.allowed:
            self.stats.disallowed += 1
            result = self._result(task, owner, started, delivered, "robots_disallowed", None, None)
            await self._finish(msg, result, None)
            return
        try:
            fetched = await self._fetcher.fetch(
                task.url, follow_redirects=self._settings.follow_redirects
            )
        except FetchError as e:
            delay = retry_delay(delivered, self._settings.task_max_deliver, e.transient)
            if delay is not None:
                await self._retry(msg, delay)
                return
            self.stats.failed += 1
            result = self._failure(task, owner, started, delivered, e.kind, e.message)
            await self._finish(msg, result, None)
            return
        page = None
        if fetched.is_html and 200 <= fetched.status < 300:
            page = extract(fetched.body, fetched.final_url, fetched.charset, self._rules)
        self.stats.fetched += 1
        result = self._result(task, owner, started, delivered, "fetched", fetched, page)
        await self._finish(msg, result, self._discovered(task, fetched, page))

    # ------------------------------------------------------------------ building records

    def _discovered(self, task: Task, fetched: Fetched, page: Page | None) -> Discovered | None:
        """The page's links one level deeper, or a redirect's target at the same depth."""
        lineage = task.lineage
        if fetched.location is not None:
            # A redirect hop is not a link: its target keeps the source's depth.
            if fetched.location == task.url or not in_scope(
                fetched.location, lineage.scope, lineage.root
            ):
                return None
            return Discovered(task.url, task.fp, task.depth, lineage, (fetched.location,))
        if task.depth + 1 > lineage.max_depth:
            return None
        candidates: list[str] = []
        if fetched.final_url != task.url:
            candidates.append(fetched.final_url)  # a followed redirect's target: its own record
        if page is not None:
            candidates.extend(page.links)
        links = tuple(
            dict.fromkeys(
                link
                for link in candidates
                if link != task.url and in_scope(link, lineage.scope, lineage.root)
            )
        )
        if not links:
            return None
        return Discovered(task.url, task.fp, task.depth + 1, lineage, links)

    def _result(
        self,
        task: Task,
        owner: Ownership,
        started: float,
        attempt: int,
        outcome: str,
        fetched: Fetched | None,
        page: Page | None,
    ) -> Result:
        return Result(
            url=task.url,
            fp=task.fp,
            job=task.lineage.job,
            depth=task.depth,
            parent=task.parent,
            outcome=outcome,
            status=fetched.status if fetched else None,
            final_url=fetched.final_url if fetched else None,
            redirects=fetched.redirects if fetched else (),
            content_type=(fetched.content_type or None) if fetched else None,
            length=fetched.length if fetched else 0,
            title=page.title if page else None,
            outlinks=len(page.links) if page else 0,
            fetched_at=fetched.fetched_at if fetched else started,
            elapsed_ms=fetched.elapsed_ms if fetched else (time.time() - started) * 1000,
            shard=owner.shard,
            fence=owner.fence,
            worker=self._worker_id,
            attempt=attempt,
            redirect_to=fetched.location if fetched else None,
        )

    def _failure(
        self,
        task: Task,
        owner: Ownership,
        started: float,
        attempt: int,
        kind: str,
        message: str,
    ) -> Result:
        result = self._result(task, owner, started, attempt, "failed", None, None)
        return dataclasses.replace(result, error=Failure(kind, message))

    # ------------------------------------------------------------------ publishing and acking

    async def _finish(self, msg: Msg, result: Result, links: Discovered | None) -> None:
        outgoing = [Outgoing(result_subject(result.shard), result.to_wire(), {MSG_ID: result.fp})]
        if links is not None:
            outgoing.append(Outgoing(DISCOVERED, links.to_wire(), {MSG_ID: f"links-{result.fp}"}))
        acks = await self._outbox.send(outgoing)
        failed = [a for a in acks if isinstance(a, PublishFailed)]
        if failed:
            log.warning("publishing the result of %s failed, retrying: %s", result.url, failed[0])
            await self._retry(msg, PUBLISH_RETRY_DELAY_S)
            return
        if self._settings.fault == FAULT_AFTER_RESULT:
            log.error("fault injection: exiting after the result, before the ack")
            os._exit(137)
        await msg.ack()
        self.stats.tasks += 1
        if links is not None:
            self.stats.links_published += len(links.links)

    async def _retry(self, msg: Msg, delay_s: float) -> None:
        await msg.nak(delay=delay_s)
        self.stats.retried += 1

    async def _dead_letter(self, msg: Msg, reason: str, detail: str) -> None:
        letter = DeadLetter.of(
            stage="task",
            reason=reason,
            detail=detail,
            subject=msg.subject,
            received_at=time.time(),
            original=msg.data,
            max_bytes=self._settings.dead_original_max_bytes,
            stream_seq=msg.metadata.sequence.stream,
        )
        msg_id = f"dead-task-{msg.metadata.sequence.stream}"
        [ack] = await self._outbox.send(
            [Outgoing(dead_subject("task"), letter.to_wire(), {MSG_ID: msg_id})]
        )
        if isinstance(ack, PublishFailed):
            await self._retry(msg, PUBLISH_RETRY_DELAY_S)
            return
        log.warning(
            "dead-lettered task (seq %d): %s %s", msg.metadata.sequence.stream, reason, detail
        )
        await msg.term()
        self.stats.dead_letters += 1
        self.stats.tasks += 1
