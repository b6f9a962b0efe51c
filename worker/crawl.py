"""One task, start to finish: robots -> politeness -> fetch -> parse -> publish -> ack.

Each step returns what the next one needs or the task's outcome (:mod:`jetcrawl.worker.outcome`),
and ``_carry_out`` does an outcome's I/O. The task is acked only after JetStream has acknowledged
its result, its discovered links and what its job made of the page (items, dead letters:
:mod:`jetcrawl.worker.pageout`), so a crash anywhere before that redelivers it; both
publishes carry ``Nats-Msg-Id`` so the redelivery adds no second record. A task waits for its
host's turn (:mod:`jetcrawl.worker.politeness`) holding no fetch slot; a task handed back while
waiting is not an attempt. Failures worth retrying are handed back with ``nak(delay)``
(:mod:`jetcrawl.worker.retry`) while the URL's budget lasts; then the failure is the task's
result, and a ``CRAWL_DEAD`` record (stage ``fetch``, reason ``retries_exhausted``) keeps the
task for ``jetcrawl dlq replay``. A failure not worth retrying is just the result.

A task's job may be paused or cancelled (KV ``crawl_control``) while the task is held: before
robots.txt and again at its host's turn, a paused job's task is parked
(:mod:`jetcrawl.worker.parking`) and a cancelled job's is settled: acked, nothing fetched.

What the job does not want is not fetched (:mod:`jetcrawl.contract.filetypes`): a page's links
whose extension the job skips are not sent, and a response whose media type the job does not
read is released unread and recorded as ``skipped`` (error kind ``unwanted_type``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import heapq
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from nats.aio.msg import Msg
from nats.errors import Error as NatsError

from jetcrawl.contract.deadletters import (
    REPLAY_HEADER,
    STAGE_EXTRACT,
    STAGE_FETCH,
    STAGE_TASK,
    DeadLetter,
)
from jetcrawl.contract.errors import MessageError
from jetcrawl.contract.filetypes import ExtensionRule, extension_rule, media_types
from jetcrawl.contract.messages import Discovered, Failure, Lineage, Result, Task, WaitingOn
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import ITEMS_PREFIX, dead_subject, result_subject
from jetcrawl.contract.urls import SCOPE_ANY, LinkCanonicalizer, UrlRules, host_of, in_scope
from jetcrawl.plumbing.backoff import backoff_s
from jetcrawl.plumbing.bodies import BodyStore, payload_digest
from jetcrawl.plumbing.bus import MSG_ID, Outbox, Outgoing, PublishFailed
from jetcrawl.plumbing.control import ControlWatch
from jetcrawl.plumbing.deadletters import dead_letter, to_outgoing
from jetcrawl.worker.discovered import DiscoveredOutbox
from jetcrawl.worker.errors import FetchError
from jetcrawl.worker.fetcher import HTML_TYPES, Fetched, Fetcher
from jetcrawl.worker.jobs import CompiledJob, Jobs
from jetcrawl.worker.outcome import (
    AGAIN_AT_ONCE,
    AGAIN_HANDED_BACK,
    AGAIN_RETRY,
    Again,
    Attempt,
    Done,
    Ownership,
    Settled,
    TaskRef,
    task_ref,
)
from jetcrawl.worker.pageout import job_output
from jetcrawl.worker.pages import Got, PageFetcher
from jetcrawl.worker.parking import LEAVING, Parking
from jetcrawl.worker.parse import Page, extract
from jetcrawl.worker.passes import OnePerPass
from jetcrawl.worker.politeness import Deferred, Politeness, Turn
from jetcrawl.worker.report import JobTally
from jetcrawl.worker.retry import (
    ROBOTS_UNAVAILABLE,
    SOFT_BLOCK,
    Backoff,
    retry_after_s,
    retry_delay,
    retryable,
)
from jetcrawl.worker.robots import Robots, RobotsVerdict
from jetcrawl.worker.sent import SentLinks
from jetcrawl.worker.telemetry import TaskTelemetry
from jetcrawl.worker.unpublished import Unpublished, unreachable
from jetcrawl.worker.validators import Validators

log = logging.getLogger(__name__)

# A task's records (result, links, dead letter) that JetStream did not store are published again
# in place, the task still held: a NATS hiccup (a leader election, a reconnect) then costs no
# second fetch of the page and no attempt. Their message ids make a repeat of one that was stored
# after all harmless. Refused ones are handed back after PUBLISH_TRIES; unanswered ones are held
# until stored (worker/unpublished.py).
PUBLISH_TRIES = 3
PUBLISH_RETRY_DELAY_S = 1.0  # before the first publish again; doubles
PUBLISH_RETRY_MAX_S = 5.0  # ... up to this, while NATS does not answer
HTTP_STATUS = "http_status"  # the failure kind of a response whose status is worth a retry
UNWANTED_TYPE = "unwanted_type"  # the error kind of a skipped record: a body of a type not read
MAX_REMEMBERED_DEFERRALS = 100_000
PAUSE_STATUSES = frozenset({429, 503})
Outcome = Done | Again | Settled
EXTRACT_DEAD_SUBJECT = dead_subject(STAGE_EXTRACT)


@dataclass(slots=True)
class CrawlStats:
    tasks: int = 0  # tasks finished (acked or terminated)
    fetched: int = 0
    disallowed: int = 0
    failed: int = 0
    retried: int = 0
    links_published: int = 0  # links carried by stored crawl.discovered messages
    links_messages: int = 0  # crawl.discovered messages stored (a message carries one page or more)
    # links left out of a page's links: this worker sent them, or an earlier page of the same
    # message carries them
    links_sent_before: int = 0
    dead_letters: int = 0
    deferred: int = 0  # waiting tasks handed back to make room (not attempts)
    publish_retries: int = 0  # records published again in place after a failed publish
    results_held: int = 0  # results held until stored, NATS not answering (worker/unpublished.py)
    copies_acked: int = 0  # deliveries of a task whose result was stored here: acked, not fetched
    blocked: int = 0  # soft blocks recorded (bot walls, CAPTCHAs, login walls)
    rendered: int = 0  # pages whose links came from a browser's DOM
    items: int = 0  # items of stored pages (crawl.items.<job>)
    extract_failures: int = 0  # a job's extraction or plugin failed on a page: dead letters
    settled: int = 0  # tasks of cancelled jobs acked unfetched
    parked: int = 0  # times a task of a paused job was parked
    skipped: int = 0  # responses of a media type their job does not read: released unread
    links_skipped: int = 0  # links not sent: their extension is one their job skips


class TaskProcessor:
    def __init__(
        self,
        settings: Settings,
        worker_id: str,
        outbox: Outbox,
        fetcher: Fetcher,
        robots: Robots,
        politeness: Politeness,
        telemetry: TaskTelemetry,
        bodies: BodyStore | None = None,
        validators: Validators | None = None,
        pages: PageFetcher | None = None,
        jobs: Jobs | None = None,
        control: tuple[ControlWatch, Parking] | None = None,
        paced: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self._settings = settings
        # job run states, and where a paused job's tasks wait (None: every job runs)
        self._control = control
        self._paced = paced  # waits for a fetch token of a job with max_pages_per_s
        self.tally = JobTally()  # each job's pages, errors and settled tasks here
        # the fetch under each job's policy: User-Agent, proxies, soft blocks, rendering
        self._pages = pages or PageFetcher(settings, fetcher, None)
        self._jobs = jobs  # job specs compiled (None: every job crawls as the default one)
        self._bodies = bodies  # kept only with store_bodies
        self._validators = validators  # used only for re-crawls (tasks with a generation)
        self._telemetry = telemetry  # spans and metrics (worker/telemetry.py)
        self._worker_id = worker_id
        self._outbox = outbox
        self._fetcher = fetcher
        self._robots = robots
        self._politeness = politeness
        self._links = LinkCanonicalizer(UrlRules.from_settings(settings))
        # pages parse one per pass of the loop, so a host's next request is not queued behind
        # a pass of parses (worker/passes.py)
        self._parses = OnePerPass()
        # the extensions a job without a spec skips: the crawl's default list
        self._default_extensions = extension_rule(ignored=settings.ignored_extensions)
        self._sent = SentLinks(settings.link_memory, settings.recrawl_after_s)
        # the spec version each job's pages were last processed under: a new one may follow
        # links the dispatcher refused before, so what was sent is forgotten
        self._spec_versions: dict[str, int] = {}
        self.stats = CrawlStats()
        self.unpublished = Unpublished()  # results held until stored, and their redeliveries
        # Whether the lease is still ours by its local deadline (the registry's holds_lease),
        # asked before each fetch; without a registry (tests), always.
        self.holds_lease: Callable[[], bool] = lambda: True
        # With tracing on, each page's links carry its trace context: one message per page.
        self._links_out = DiscoveredOutbox(
            outbox, 0.0 if telemetry.traced else settings.links_linger_s, self.stats
        )
        self._backoff = Backoff(
            settings.task_max_deliver,
            settings.retry_base_delay_s,
            settings.retry_max_delay_s,
            settings.retry_budget_s,
        )
        # Politeness hand-backs per task: deliveries that were no attempt.
        self._deferrals: OrderedDict[TaskRef, int] = OrderedDict()
        # When each task's first fetch here began (unix time): its retry budget in time. The
        # owner's memory, as the deferrals: a new owner starts the clock.
        self._first_tried: OrderedDict[TaskRef, float] = OrderedDict()
        # What the tasks held wait on now, and the tasks handed back or retried, with when they
        # are due: the tail that the progress shows.
        self._holding: dict[TaskRef, WaitingOn] = {}
        self._away: OrderedDict[TaskRef, WaitingOn] = OrderedDict()

    async def process(self, msg: Msg, owner: Ownership, abandoned: asyncio.Event) -> None:
        """Crawl one delivered task; ``abandoned`` (lease lost) hands a waiting one back."""
        ref = task_ref(msg)
        self._away.pop(ref, None)  # it is back
        if await self.unpublished.settled(ref):
            await self._outbox.ack(msg)  # its result is stored: a copy of a task done here
            self.stats.copies_acked += 1
            log.info("task %s %d delivered again after its result was stored: acked", *ref)
            return
        try:
            with self.unpublished.in_hand(ref), self._telemetry.processing(msg, owner.shard):
                await self._process(msg, owner, abandoned)
        finally:
            self._holding.pop(ref, None)

    def waiting_on(self, at_most: int) -> tuple[WaitingOn, ...]:
        """The tasks that have waited longest: held here, or handed back and not yet due."""
        now = time.time()
        # Past due, a task is JetStream's again (redelivered here or to the next owner): forget.
        self._away = OrderedDict(
            (ref, w) for ref, w in self._away.items() if w.due is None or w.due > now
        )
        waits = [*self._holding.values(), *self._away.values()]
        return tuple(heapq.nsmallest(at_most, waits, key=_since))

    def _waits(self, ref: TaskRef, url: str, why: str) -> None:
        self._holding[ref] = WaitingOn(url, why, time.time())

    def _goes_away(self, ref: TaskRef, url: str, why: str, delay_s: float) -> None:
        now = time.time()
        self._away[ref] = WaitingOn(url, why, now, now + delay_s)
        while len(self._away) > MAX_REMEMBERED_DEFERRALS:
            self._away.popitem(last=False)

    async def _process(self, msg: Msg, owner: Ownership, abandoned: asyncio.Event) -> None:
        try:
            task = Task.from_wire(msg.data)
        except MessageError as e:
            await self._dead_letter(msg, e.reason, e.detail)
            return
        ref = task_ref(msg)
        deferrals = self._deferrals.get(ref, 0)
        attempt = max(1, (msg.metadata.num_delivered or 1) - deferrals)
        a = Attempt(msg, task, owner, ref, attempt, deferrals, time.time())
        await self._carry_out(a, await self._crawl(a, abandoned))

    # ------------------------------------------------------------------ the steps

    async def _crawl(self, a: Attempt, abandoned: asyncio.Event) -> Outcome:
        """robots -> politeness -> fetch -> page: each step gives the next one what it needs,
        or the task's outcome. Its job's state is looked at first and again at the turn."""
        while True:
            stop = await self._job_runs(a, abandoned)
            if stop is not None:
                return stop
            verdict = await self._robots_step(a)
            if not isinstance(verdict, RobotsVerdict):
                return verdict
            if self._paced is not None:
                self._waits(a.ref, a.task.url, "job rate")
                await self._paced(a.task.lineage.job)
            turn = await self._turn_step(a, verdict, abandoned)
            if not isinstance(turn, Turn):
                return turn
            if self._control is None or self._control[0].runs(a.task.lineage.job):
                break
            self._politeness.done(turn)  # paused or cancelled while it waited for the host
        delay_s = self._politeness.delay_for(verdict.crawl_delay_s)
        fetched, pause_s = await self._fetch_step(a, turn, delay_s)
        return await self._page_step(a, fetched, pause_s)

    async def _job_runs(self, a: Attempt, abandoned: asyncio.Event) -> Outcome | None:
        """None if the task's job runs (after a pause, if it was paused); else its outcome."""
        if self._control is None:
            return None
        control, parking = self._control
        job = a.task.lineage.job
        state: str = control.state(job)
        if state == "paused":
            self._waits(a.ref, a.task.url, "job paused")
            self.stats.parked += 1
            state = await parking.park(job, a.owner.shard, abandoned)
        if state == "cancelled":
            return Settled(job)
        if state == LEAVING:
            return Again(0.0, "job paused, shard let go", AGAIN_AT_ONCE)
        return None

    async def _robots_step(self, a: Attempt) -> RobotsVerdict | Outcome:
        self._waits(a.ref, a.task.url, "robots.txt")
        agent = self._pages.policy(a.task.lineage.job).user_agent  # None: the worker's own
        verdict = await self._telemetry.robots(self._robots.check(a.task.url, agent))
        if verdict.allowed:
            return verdict
        if verdict.reason == "unavailable":
            self._first_attempt(a.ref, a.started)
            why = f"robots.txt unavailable: {verdict.detail or 'no answer'}"
            return self._failure(a, ROBOTS_UNAVAILABLE, why)
        self.stats.disallowed += 1
        return Done(self._result(a, "robots_disallowed", None, None))

    async def _turn_step(
        self, a: Attempt, verdict: RobotsVerdict, abandoned: asyncio.Event
    ) -> Turn | Outcome:
        self._waits(a.ref, a.task.url, "host turn")
        try:
            turn = await self._telemetry.politeness_wait(
                self._politeness.turn(
                    host_of(a.task.url),
                    verdict.crawl_delay_s,
                    deferrable=a.deferrals < self._settings.max_deferrals,
                    unless=abandoned,
                    shard=a.owner.shard,
                    level=a.task.level,
                )
            )
        except asyncio.CancelledError:
            # A drain deadline passed while it waited: hand it back now, not after AckWait.
            with contextlib.suppress(NatsError):
                await a.msg.nak()
            raise
        if turn is None:
            return Again(0.0, "lease lost", AGAIN_AT_ONCE)  # the next owner takes it at once
        if isinstance(turn, Deferred):
            return Again(turn.delay_s, "handed back, host busy", AGAIN_HANDED_BACK)
        if not self.holds_lease():  # fenced, or about to be: another worker may own the host
            self._politeness.done(turn)
            return Again(0.0, "lease deadline passed", AGAIN_AT_ONCE)
        return turn

    async def _fetch_step(
        self, a: Attempt, turn: Turn, delay_s: float
    ) -> tuple[Got | FetchError, float | None]:
        """The response (rendered, when the job's policy says so) or the fetch error, and the
        host's pause (a 429/503 Retry-After). A render holds the host's turn: the page's own
        requests are the host's politeness too."""
        self._waits(a.ref, a.task.url, "fetching")
        self._first_attempt(a.ref, time.time())  # waiting for the host is no part of the budget
        pause_s = None
        try:
            conditional = {}
            if a.task.gen and self._validators is not None:
                conditional = await self._validators.conditional_headers(a.task.fp)
            job = self._jobs.of(a.task.lineage.job) if self._jobs is not None else None
            got = await self._telemetry.get(
                a.task.url,
                self._pages.get(
                    a.task.url,
                    a.task.lineage.job,
                    delay_s=delay_s,
                    follow_redirects=self._settings.follow_redirects,
                    headers=conditional or None,
                    reads=media_types(job.spec.content_types) if job else HTML_TYPES,
                ),
            )
            response = got.fetched
            if response.status in PAUSE_STATUSES:  # Retry-After pauses the whole host
                pause_s = retry_after_s(
                    response.headers.get("retry-after"),
                    time.time(),
                    self._settings.max_retry_after_s,
                )
            return got, pause_s
        except FetchError as e:
            return e, pause_s
        finally:
            self._politeness.done(turn, pause_s=pause_s)

    async def _page_step(self, a: Attempt, got: Got | FetchError, pause_s: float | None) -> Outcome:
        if isinstance(got, FetchError):
            return self._failure(a, got.kind, got.message)
        fetched = got.fetched
        if retryable(status=fetched.status):
            return self._failure(a, HTTP_STATUS, f"HTTP {fetched.status}", fetched, pause_s)
        if got.blocked is not None:
            return self._blocked(a, got)
        if fetched.skipped:
            return self._skipped(a, fetched)
        self.stats.rendered += got.rendered
        page = None
        if fetched.is_html and 200 <= fetched.status < 300:
            await self._parses.wait()
            html, charset = got.html()  # the rendered DOM, when there is one
            with self._telemetry.parse():
                page = extract(
                    html, fetched.final_url, charset, self._links, self._settings.max_links_per_page
                )
        self.stats.fetched += 1
        digest, ref = await self._keep_body(a.task, fetched) if fetched.body else (None, None)
        job = self._jobs.of(a.task.lineage.job) if self._jobs is not None else None
        result = self._result(a, "fetched", fetched, page, digest=digest, body_ref=ref)
        if got.rendered:
            result = dataclasses.replace(result, rendered=True)
        if job is None:
            return Done(result, self._discovered(a.task, fetched, page, {}))
        if self._spec_versions.setdefault(a.task.lineage.job, job.version) != job.version:
            self._spec_versions[a.task.lineage.job] = job.version
            self._sent = SentLinks(self._settings.link_memory, self._settings.recrawl_after_s)
        # extraction reads what the links were read from: the rendered DOM, when there is one
        read = (
            fetched
            if got.dom is None
            else dataclasses.replace(fetched, body=got.dom, charset="utf-8")
        )
        outputs, page, levels = self._job_step(a, read, page, job)
        return Done(result, self._discovered(a.task, fetched, page, levels), outputs=outputs)

    def _job_step(
        self, a: Attempt, fetched: Fetched, page: Page | None, job: CompiledJob
    ) -> tuple[tuple[Outgoing, ...], Page | None, dict[str, int]]:
        """The job's items, failures and other jobs' links to publish, the page with the
        links its plugins add, and the levels they gave some of them; a page of a type the job
        does not process gives no links."""
        if not job.spec.processes(fetched.content_type):
            return (), None, {}
        if page is None or not fetched.body:
            return (), page, {}
        out = job_output(
            job,
            a.msg,
            a.task,
            fetched,
            self._crawl_id(a.msg, a.task),
            self._links.rules,
            trace_id=self._telemetry.trace_id(),
            dead_max_bytes=self._settings.dead_original_max_bytes,
        )
        if out.failures:
            log.warning("job %s: %d failures on %s", a.task.lineage.job, out.failures, a.task.url)
        added = [link for link in out.links if link != a.task.url]
        if added:
            page = dataclasses.replace(page, links=tuple(dict.fromkeys((*page.links, *added))))
        return tuple(out.outputs), page, out.levels

    def _blocked(self, a: Attempt, got: Got) -> Outcome:
        """A soft block is no page: recorded as ``blocked``, or retried later (``on_block:
        retry``) while the URL's budget lasts. Its links are not followed."""
        why = f"soft block at {got.fetched.final_url}" + (f" via {got.proxy}" if got.proxy else "")
        if self._pages.policy(a.task.lineage.job).on_block == "retry":
            return self._failure(a, SOFT_BLOCK, f"{got.blocked}: {why}", outcome="blocked")
        self.stats.blocked += 1
        result = self._result(a, "blocked", got.fetched, None)
        return Done(dataclasses.replace(result, error=Failure(SOFT_BLOCK, f"{got.blocked}: {why}")))

    def _skipped(self, a: Attempt, fetched: Fetched) -> Outcome:
        """A response of a media type the job does not read: its body was released unread."""
        self.stats.skipped += 1
        job = self._jobs.of(a.task.lineage.job) if self._jobs is not None else None
        types = ", ".join(job.spec.content_types if job else sorted(HTML_TYPES))
        why = (
            f"{fetched.content_type or 'no Content-Type'} is not a type job "
            f"{a.task.lineage.job} reads ({types}): body not downloaded"
        )
        result = self._result(a, "skipped", fetched, None)
        result = dataclasses.replace(result, error=Failure(UNWANTED_TYPE, why))
        return Done(result, self._discovered(a.task, fetched, None, {}))

    def _failure(
        self,
        a: Attempt,
        kind: str,
        message: str,
        fetched: Fetched | None = None,
        retry_after: float | None = None,
        outcome: str = "failed",
    ) -> Outcome:
        """Another attempt for a failure worth it while the URL's budget lasts; else the failure
        is the task's result (with a dead letter to replay it, when the budget ran out)."""
        status = fetched.status if fetched is not None else None
        error_kind = kind if fetched is None else None
        delay = retry_delay(
            a.attempt,
            self._backoff,
            kind=error_kind,
            status=status,
            retry_after=retry_after,
            spent_s=time.time() - self._first_tried.get(a.ref, a.started),
        )
        if delay is not None:
            return Again(delay, f"attempt {a.attempt + 1} after {kind}", AGAIN_RETRY)
        self.stats.failed += outcome == "failed"
        self.stats.blocked += outcome == "blocked"
        result = self._result(a, outcome, fetched, None)
        result = dataclasses.replace(result, error=Failure(kind, message))
        letter = None
        if retryable(kind=error_kind, status=status):  # the budget ran out
            letter = dead_letter(
                a.msg,
                STAGE_FETCH,
                "retries_exhausted",
                f"{kind}: {message} (attempt {a.attempt} of {self._backoff.max_attempts})",
                max_bytes=self._settings.dead_original_max_bytes,
            )
        return Done(result, None, letter)

    async def _carry_out(self, a: Attempt, outcome: Outcome) -> None:
        """The outcome's I/O: store the records and ack, or hand the task back."""
        if isinstance(outcome, Done):
            await self._finish(
                a.msg, a.task, outcome.result, outcome.links, outcome.letter, outcome.outputs
            )
            return
        if isinstance(outcome, Settled):
            await self._outbox.ack(a.msg)
            self.stats.settled += 1
            self.tally.settled(outcome.job)
            return
        if outcome.kind == AGAIN_AT_ONCE:
            await self._outbox.nak(a.msg)
            return
        self._goes_away(a.ref, a.task.url, outcome.why, outcome.delay_s)
        if outcome.kind == AGAIN_HANDED_BACK:
            self._remember_deferral(a.ref, a.deferrals + 1)
            await self._outbox.nak(a.msg, delay=outcome.delay_s)
            self.stats.deferred += 1
        else:
            await self._retry(a.msg, outcome.delay_s)

    async def _keep_body(self, task: Task, fetched: Fetched) -> tuple[str, str | None]:
        """The body's digest always; the body itself when kept (its reference); validators for
        re-crawls."""
        if task.gen and self._validators is not None:
            await self._validators.remember(task.fp, fetched)
        if self._bodies is None:
            return payload_digest(fetched.body), None
        ref, digest = await self._bodies.put(task.fp, fetched.body)
        return digest, ref

    def _first_attempt(self, ref: TaskRef, now: float) -> None:
        if ref not in self._first_tried:
            self._first_tried[ref] = now
            while len(self._first_tried) > MAX_REMEMBERED_DEFERRALS:
                self._first_tried.popitem(last=False)

    def _remember_deferral(self, ref: TaskRef, deferrals: int) -> None:
        self._deferrals[ref] = deferrals
        self._deferrals.move_to_end(ref)
        while len(self._deferrals) > MAX_REMEMBERED_DEFERRALS:
            self._deferrals.popitem(last=False)

    # ------------------------------------------------------------------ building records

    def _discovered(
        self, task: Task, fetched: Fetched, page: Page | None, levels: dict[str, int]
    ) -> Discovered | None:
        """The page's links one level deeper (with the levels plugins gave some of them), or a
        redirect's target at the same depth."""
        lineage = task.lineage
        if fetched.location is not None:
            # A redirect hop is not a link: its target keeps the source's depth.
            if fetched.location == task.url or not in_scope(
                fetched.location, lineage.scope, lineage.root
            ):
                return None
            # the dispatcher filters it as a link unless the source is a seed (depth 0)
            if task.depth > 0 and not self._wanted(lineage.job, (fetched.location,)):
                return None
            target = self._unsent(lineage, task.depth, (fetched.location,))
            return Discovered(task.url, task.fp, task.depth, lineage, target) if target else None
        if task.depth + 1 > lineage.max_depth:
            return None
        if page is not None and fetched.final_url == task.url and lineage.scope == SCOPE_ANY:
            links = page.links  # unique already, and without the page itself
        else:
            candidates: list[str] = []
            if fetched.final_url != task.url:
                candidates.append(fetched.final_url)  # a followed redirect's target: a record
            if page is not None:
                candidates.extend(page.links)
            links = tuple(
                dict.fromkeys(
                    link
                    for link in candidates
                    if link != task.url and in_scope(link, lineage.scope, lineage.root)
                )
            )
        # Most links were sent before, and a skipped one never is: asking the memory first
        # leaves the extension rule the few links that are new to this worker.
        links = self._wanted(lineage.job, self._unsent(lineage, task.depth + 1, links))
        if not links:
            return None
        given = {link: levels[link] for link in links if link in levels} if levels else {}
        return Discovered(task.url, task.fp, task.depth + 1, lineage, links, given)

    def _wanted(self, job: str, links: tuple[str, ...]) -> tuple[str, ...]:
        """``links`` without those whose extension the job skips: the dispatcher would refuse
        them (jetcrawl.dispatcher.jobrules), so they are not sent at all."""
        follows = self._extension_rule(job).follows_again
        kept = tuple(link for link in links if follows(link))
        self.stats.links_skipped += len(links) - len(kept)
        return kept

    def _extension_rule(self, job: str) -> ExtensionRule:
        compiled = self._jobs.of(job) if self._jobs is not None else None
        if compiled is None:
            return self._default_extensions
        return compiled.spec.extensions(self._settings.ignored_extensions)

    def _unsent(self, lineage: Lineage, depth: int, links: tuple[str, ...]) -> tuple[str, ...]:
        """``links`` (at ``depth``) without those this worker has sent already. A job whose
        spec re-crawls sends them all: its seen marks expire on the spec's clock, which the
        memory does not keep."""
        job = self._jobs.of(lineage.job) if self._jobs is not None else None
        if job is not None and job.spec.recrawl_after_s:
            return links
        unsent = self._sent.unsent(lineage, depth, links)
        self.stats.links_sent_before += len(links) - len(unsent)
        return unsent

    def _result(
        self,
        a: Attempt,
        outcome: str,
        fetched: Fetched | None,
        page: Page | None,
        *,
        digest: str | None = None,
        body_ref: str | None = None,
    ) -> Result:
        task, started = a.task, a.started
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
            shard=a.owner.shard,
            fence=a.owner.fence,
            worker=self._worker_id,
            attempt=a.attempt,
            redirect_to=fetched.location if fetched else None,
            charset=fetched.charset if fetched else None,
            headers=fetched.headers if fetched else {},  # KEPT_HEADERS: lowercase already
            trace_id=self._telemetry.trace_id(),
            payload_digest=digest,
            body_ref=body_ref,
            spec_version=self._spec_version(task.lineage.job),
        )

    def _spec_version(self, job: str) -> int:
        """The version of the job's spec a record is made under (0: the job has none)."""
        compiled = self._jobs.of(job) if self._jobs is not None else None
        return compiled.version if compiled is not None else 0

    # ------------------------------------------------------------------ publishing and acking

    async def _finish(
        self,
        msg: Msg,
        task: Task,
        result: Result,
        links: Discovered | None,
        letter: DeadLetter | None = None,
        outputs: tuple[Outgoing, ...] = (),
    ) -> None:
        crawl_id = self._crawl_id(msg, task)
        outgoing = [Outgoing(result_subject(result.shard), result.to_wire(), {MSG_ID: crawl_id})]
        if letter is not None:
            outgoing.append(to_outgoing(letter, f"dead-{crawl_id}"))
        ref = task_ref(msg)
        outgoing.extend(outputs)
        failed = await self._publish(outgoing, links, crawl_id, hold=True)
        if failed is not None:
            log.warning(
                "publishing the result of %s failed, handing it back: %s", result.url, failed
            )
            await self._retry(msg, PUBLISH_RETRY_DELAY_S)
            return
        self.unpublished.stored(ref)  # before the ack: a copy delivered from now on is acked too
        if links is not None:  # stored: its tasks may reach this worker before the ack returns
            self._sent.sent(links.lineage, links.depth, links.links)
        await self._outbox.ack(msg)
        self._first_tried.pop(ref, None)
        self.stats.tasks += 1
        self.tally.result(task.lineage.job, result.outcome)
        self._telemetry.finished(result)
        if letter is not None:
            self.stats.dead_letters += 1
        if outputs:
            extract_letters = sum(1 for o in outputs if o.subject == EXTRACT_DEAD_SUBJECT)
            self.stats.items += sum(1 for o in outputs if o.subject.startswith(ITEMS_PREFIX))
            self.stats.extract_failures += extract_letters
            self.stats.dead_letters += extract_letters

    @staticmethod
    def _crawl_id(msg: Msg, task: Task) -> str:
        """The identity of this crawl's records; a replayed dead letter's differ from the
        first crawl's, which would otherwise drop them as duplicates."""
        replay = (msg.headers or {}).get(REPLAY_HEADER)
        return f"{task.crawl_id}-replay-{replay}" if replay else task.crawl_id

    async def _publish(
        self,
        outgoing: list[Outgoing],
        links: Discovered | None = None,
        crawl_id: str = "",
        *,
        hold: bool = False,
    ) -> PublishFailed | None:
        """Publish all, and ``links`` (of the task ``crawl_id``) through the discovered outbox;
        again in place what was not stored (``PUBLISH_TRIES`` in all, or with ``hold`` for as
        long as NATS does not answer). The first failure left, or None when all are stored."""
        attempt = 0
        while True:
            links_stored = self._links_out.add(links, crawl_id) if links is not None else None
            acks = await self._outbox.send(outgoing) if outgoing else []
            failures = [ack for ack in acks if isinstance(ack, PublishFailed)]
            outgoing = [
                m for m, a in zip(outgoing, acks, strict=True) if isinstance(a, PublishFailed)
            ]
            if links_stored is not None:
                links_ack = await links_stored
                if isinstance(links_ack, PublishFailed):
                    failures.append(links_ack)
                else:
                    links = None
            if not failures:
                return None
            attempt += 1
            if attempt >= PUBLISH_TRIES and not (hold and all(map(unreachable, failures))):
                return failures[0]
            if attempt == PUBLISH_TRIES:
                log.warning(
                    "NATS does not answer: holding the records of %s until stored", crawl_id
                )
                self.stats.results_held += 1
            delay_s = backoff_s(attempt, PUBLISH_RETRY_DELAY_S, PUBLISH_RETRY_MAX_S)
            log.log(
                logging.WARNING if attempt < PUBLISH_TRIES else logging.DEBUG,
                "publishing %s failed, again in %.0f s: %s",
                failures[0].subject,
                delay_s,
                failures[0],
            )
            self.stats.publish_retries += len(failures)
            await asyncio.sleep(delay_s)

    async def _retry(self, msg: Msg, delay_s: float) -> None:
        await self._outbox.nak(msg, delay=delay_s)
        self.stats.retried += 1

    async def _dead_letter(self, msg: Msg, reason: str, detail: str) -> None:
        letter = dead_letter(
            msg, STAGE_TASK, reason, detail, max_bytes=self._settings.dead_original_max_bytes
        )
        stream, seq = task_ref(msg)
        failed = await self._publish([to_outgoing(letter, f"dead-task-{stream}-{seq}")])
        if failed is not None:
            await self._retry(msg, PUBLISH_RETRY_DELAY_S)
            return
        log.warning("dead-lettered task (%s %d): %s %s", stream, seq, reason, detail)
        await self._outbox.term(msg)
        self.stats.dead_letters += 1
        self.stats.tasks += 1


def _since(waiting: WaitingOn) -> float:
    return waiting.since
