"""Message shapes: the wire (JSON via orjson, with ``"v"``) and frozen dataclasses in code.

Seeds are the one exception to "internal JSON": they are whatever ``nats pub crawl.seeds ...``
sends — one URL, URLs one per line, a JSON object ``{"url", "max_depth", "scope", "job", "spec",
"priority"}`` or a JSON list of objects (or URL strings). :func:`decode_seeds` splits a body
into valid seeds and per-item rejects, so one bad line never costs the good ones.

Internal messages are strict about types and about the major version, lenient about unknown fields.
A decoding failure raises :class:`~jetcrawl.contract.errors.MessageError` with a short ``reason``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Self

import orjson

from jetcrawl.contract.errors import MessageError
from jetcrawl.contract.settings import PRIORITY_LEVELS, SCOPES
from jetcrawl.contract.urls import fingerprint
from jetcrawl.contract.wire import WIRE_VERSION
from jetcrawl.contract.wire import check_version as _check_version
from jetcrawl.contract.wire import json_object as _object
from jetcrawl.contract.wire import typed as _field

DEFAULT_JOB = "default"
JOB_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
SEED_FIELDS = frozenset({"v", "url", "max_depth", "scope", "job", "spec", "priority"})
DEFAULT_PRIORITY = 2  # a task that names none (settings.default_priority is the dispatcher's)


# ---------------------------------------------------------------- helpers


def _depth(obj: dict[str, Any], name: str, optional: bool = False) -> int | None:
    value = _field(obj, name, int, optional)
    if value is not None and value < 0:
        raise MessageError("wrong_type", f"{name} must be >= 0, got {value}")
    return value


def _scope(obj: dict[str, Any], optional: bool = False) -> str | None:
    scope = _field(obj, "scope", str, optional)
    if scope is not None and scope not in SCOPES:
        raise MessageError("bad_scope", f"scope must be one of {SCOPES}, got {scope!r}")
    return scope


def check_priority(value: Any, what: str = "priority") -> int:
    """``value`` as a priority level, or :class:`MessageError` ``bad_priority`` saying why."""
    if type(value) is not int or not 0 <= value < PRIORITY_LEVELS:
        raise MessageError(
            "bad_priority",
            f"{what} must be a whole number 0-{PRIORITY_LEVELS - 1} (0 is the highest), "
            f"got {str(value)[:40]!r}",
        )
    return value


def _priority(obj: dict[str, Any], name: str = "priority") -> int | None:
    value = obj.get(name)
    return None if value is None else check_priority(value, name)


def _job(obj: dict[str, Any], optional: bool = False) -> str | None:
    job = _field(obj, "job", str, optional)
    if job is not None and not JOB_RE.match(job):
        raise MessageError("bad_job", f"job must match {JOB_RE.pattern}, got {job[:80]!r}")
    return job


# ---------------------------------------------------------------- seeds


@dataclass(frozen=True, slots=True)
class Seed:
    """One seed as the user sent it; the URL is not canonicalized yet."""

    url: str
    max_depth: int | None = None
    scope: str | None = None
    job: str | None = None
    spec: Mapping[str, Any] | None = None  # a job spec carried inline (read by the dispatcher)
    priority: int | None = None  # the level of the seed and of what it leads to


@dataclass(frozen=True, slots=True)
class SeedReject:
    reason: str
    detail: str
    fragment: str  # the offending line or element, for the dead letter


def decode_seeds(body: bytes) -> list[Seed | SeedReject]:
    """Split a ``crawl.seeds`` body into seeds and rejects, in order. Never raises."""
    if b"\x00" in body:
        return [SeedReject("binary", "body contains NUL bytes", "")]
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        return [SeedReject("invalid_utf8", str(e), "")]
    stripped = text.strip()
    if not stripped:
        return [SeedReject("empty", "body holds no URL", "")]
    if stripped[0] in "{[":
        try:
            doc = orjson.loads(stripped)
        except orjson.JSONDecodeError as e:
            return [SeedReject("invalid_json", str(e), stripped[:200])]
        items = doc if isinstance(doc, list) else [doc]
        if not items:
            return [SeedReject("empty", "empty JSON list", "")]
        return [_seed_from_json(item) for item in items]
    out: list[Seed | SeedReject] = []
    for line in stripped.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if any(ord(c) < 0x20 or c == "\x7f" for c in line):
            out.append(SeedReject("binary", "control characters in line", line[:200]))
        elif any(c.isspace() for c in line):
            out.append(SeedReject("invalid_url", "whitespace inside a URL line", line[:200]))
        else:
            out.append(Seed(url=line))
    return out or [SeedReject("empty", "body holds only comments", "")]


def _seed_from_json(item: Any) -> Seed | SeedReject:
    fragment = orjson.dumps(item)[:200].decode("utf-8", "replace")
    if isinstance(item, str):
        return Seed(url=item.strip())
    if not isinstance(item, dict):
        return SeedReject(
            "wrong_type",
            f"a seed is a URL string or an object, got {type(item).__name__}",
            fragment,
        )
    try:
        _check_version(item, required=False)
        unknown = set(item) - SEED_FIELDS
        if unknown:
            raise MessageError("unknown_field", f"unknown seed fields {sorted(unknown)}")
        return Seed(
            url=_field(item, "url", str).strip(),
            max_depth=_depth(item, "max_depth", optional=True),
            scope=_scope(item, optional=True),
            job=_job(item, optional=True),
            spec=_field(item, "spec", dict, optional=True),
            priority=_priority(item),
        )
    except MessageError as e:
        return SeedReject(e.reason, e.detail, fragment)


# ---------------------------------------------------------------- internal messages


@dataclass(frozen=True, slots=True)
class Lineage:
    """What a URL inherits from the seed that led to it."""

    job: str
    scope: str
    root: str  # the scope's anchor: the seed's host, its registered domain, or "" for "any"
    max_depth: int
    # The seed's level, if it gave one: its descendants' too. Not part of equality: a link found
    # under two levels of one crawl is one link to send (worker/sent.py, worker/discovered.py);
    # the first admitted keeps its level.
    priority: int | None = field(default=None, compare=False)

    def to_wire(self) -> dict[str, Any]:
        wire = {
            "job": self.job,
            "scope": self.scope,
            "root": self.root,
            "max_depth": self.max_depth,
        }
        if self.priority is not None:
            wire["priority"] = self.priority
        return wire

    @classmethod
    def from_obj(cls, obj: dict[str, Any]) -> Lineage:
        """The lineage ``obj`` carries; one seen before (tasks and pages of a crawl share a
        few) is the same object, checked once."""
        try:
            key = (
                obj.get("job"),
                obj.get("scope"),
                obj.get("root"),
                obj.get("max_depth"),
                obj.get("priority"),
            )
            known = _LINEAGES.get(key)
        except TypeError:  # a list or an object where a scalar belongs: unhashable
            known = None
        # A cached entry's key had exactly these types (True == 1 would find an int's entry).
        if known is not None and type(key[3]) is int and type(key[4]) in (int, type(None)):
            return known
        root = _field(obj, "root", str)
        lineage = Lineage(
            job=_job(obj) or "",
            scope=_scope(obj) or "",
            root=root,
            max_depth=_depth(obj, "max_depth") or 0,
            priority=_priority(obj),
        )
        if len(_LINEAGES) >= LINEAGES_KEPT:
            _LINEAGES.clear()
        _LINEAGES[key] = lineage
        return lineage


LINEAGES_KEPT = 1024
_LINEAGES: dict[tuple[Any, ...], Lineage] = {}  # (job, scope, root, max_depth, priority) decoded


def seen_key(job: str, url: str, fp: str) -> str:
    """``Task.seen_key`` of the canonical ``url`` (fingerprint ``fp``) in ``job``."""
    if job == DEFAULT_JOB:
        return fp
    return fingerprint(f"{job}\n{url}")


@dataclass(frozen=True, slots=True)
class Task:
    """One admitted URL on ``crawl.tasks.<shard>``."""

    url: str
    fp: str
    depth: int
    lineage: Lineage
    parent: str | None = None
    gen: int = 0  # the seen mark's revision: tells re-crawls of one URL apart
    prio: int | None = None  # its level; the dispatcher sets it (dispatcher/jobrules.py)

    @property
    def level(self) -> int:
        """The priority level it is queued at (``crawl.tasks.<shard>.<level>.<job>``)."""
        return DEFAULT_PRIORITY if self.prio is None else self.prio

    @property
    def seen_key(self) -> str:
        """The URL's key in crawl_seen: its fingerprint, within its job (jobs dedupe apart).

        The default job keeps the plain fingerprint, as the design says; a named job's key is
        the fingerprint of job and URL together, so two jobs over one site both crawl it.
        """
        return seen_key(self.lineage.job, self.url, self.fp)

    @property
    def crawl_id(self) -> str:
        """Identity of this crawl of this URL: the Nats-Msg-Id of what the task produces."""
        return f"{self.seen_key}-{self.gen}" if self.gen else self.seen_key

    def to_wire(self) -> bytes:
        wire = {
            "v": WIRE_VERSION,
            "url": self.url,
            "fp": self.fp,
            "depth": self.depth,
            "parent": self.parent,
            "gen": self.gen,
        }
        if self.prio is not None:  # else the default level
            wire["prio"] = self.prio
        return orjson.dumps(wire | self.lineage.to_wire())

    @classmethod
    def from_wire(cls, data: bytes) -> Self:
        obj = _object(data)
        url, fp, depth = obj.get("url"), obj.get("fp"), obj.get("depth")
        parent, gen, prio = obj.get("parent"), obj.get("gen"), obj.get("prio")
        # Every task a worker takes comes this way: the general path's field checks below,
        # written once as exact types (JSON gives no subclasses; bool is no int here).
        if (
            type(url) is str
            and type(fp) is str
            and type(depth) is int
            and depth >= 0
            and (parent is None or type(parent) is str)
            and (gen is None or type(gen) is int)
            and (prio is None or (type(prio) is int and 0 <= prio < PRIORITY_LEVELS))
        ):
            return cls(url, fp, depth, Lineage.from_obj(obj), parent, gen or 0, prio)
        return cls(
            url=_field(obj, "url", str),
            fp=_field(obj, "fp", str),
            depth=_depth(obj, "depth") or 0,
            lineage=Lineage.from_obj(obj),
            parent=_field(obj, "parent", str, optional=True),
            gen=_field(obj, "gen", int, optional=True) or 0,
            prio=_priority(obj, "prio"),
        )


@dataclass(frozen=True, slots=True)
class Discovered:
    """The outlinks of one fetched page (canonical, scoped, unique): a page of a
    :class:`DiscoveredPages` message on ``crawl.discovered``."""

    parent: str
    parent_fp: str
    depth: int  # the depth of the links, i.e. the parent's depth + 1
    lineage: Lineage
    links: tuple[str, ...]
    # Levels a plugin gave some of the links (link -> level); the others get their job's.
    priorities: Mapping[str, int] = field(default_factory=dict)

    def to_obj(self) -> dict[str, Any]:
        obj = {
            "parent": self.parent,
            "parent_fp": self.parent_fp,
            "depth": self.depth,
            "links": list(self.links),
        } | self.lineage.to_wire()
        if self.priorities:
            obj["priorities"] = dict(self.priorities)
        return obj

    def to_wire(self) -> bytes:
        return orjson.dumps({"v": WIRE_VERSION} | self.to_obj())

    @classmethod
    def from_wire(cls, data: bytes) -> Self:
        return cls.from_obj(_object(data))

    @classmethod
    def from_obj(cls, obj: dict[str, Any]) -> Self:
        links = _field(obj, "links", list)
        if not all(isinstance(link, str) for link in links):
            raise MessageError("wrong_type", "links must be strings")
        return cls(
            parent=_field(obj, "parent", str),
            parent_fp=_field(obj, "parent_fp", str),
            depth=_depth(obj, "depth") or 0,
            lineage=Lineage.from_obj(obj),
            links=tuple(links),
            priorities=_link_priorities(obj),
        )


def _link_priorities(obj: dict[str, Any]) -> dict[str, int]:
    priorities = _field(obj, "priorities", dict, optional=True) or {}
    for link, level in priorities.items():
        check_priority(level, f"priority of link {link[:200]!r}")
    return priorities


@dataclass(frozen=True, slots=True)
class DiscoveredPages:
    """A message on ``crawl.discovered``: the outlinks of one page or of several.

    One page is the page's own object (``Discovered.to_wire``); several are
    ``{"v": 1, "pages": [page, ...]}``, each page the same object without ``"v"``. A reader takes
    both; a page of a message that cannot be read makes the whole message unreadable.
    """

    pages: tuple[Discovered, ...]

    def to_wire(self) -> bytes:
        if len(self.pages) == 1:
            return self.pages[0].to_wire()
        return orjson.dumps({"v": WIRE_VERSION, "pages": [page.to_obj() for page in self.pages]})

    @classmethod
    def from_wire(cls, data: bytes) -> Self:
        obj = _object(data)
        if "pages" not in obj:
            return cls((Discovered.from_obj(obj),))
        pages = _field(obj, "pages", list)
        if not pages:
            raise MessageError("wrong_type", "pages must not be empty")
        if not all(isinstance(page, dict) for page in pages):
            raise MessageError("wrong_type", "pages must be JSON objects")
        return cls(tuple(Discovered.from_obj(page) for page in pages))


OUTCOMES = ("fetched", "robots_disallowed", "failed", "blocked", "skipped")


def _headers(obj: dict[str, Any]) -> dict[str, str]:
    headers = _field(obj, "headers", dict, optional=True) or {}
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise MessageError("wrong_type", "headers must map strings to strings")
    return headers


@dataclass(frozen=True, slots=True)
class Failure:
    kind: str  # "timeout", "connect", "too_large", ... (worker.errors.FetchError kinds)
    message: str


@dataclass(frozen=True, slots=True)
class Result:
    """One terminal record per task on ``crawl.results.<shard>``, ``Nats-Msg-Id`` = fingerprint.

    ``outcome`` is ``fetched`` (an HTTP response, whatever its status), ``robots_disallowed``
    (never requested), ``failed`` (no usable response; ``error`` says why) or ``blocked`` (a soft
    block: a bot wall, CAPTCHA or login wall served as a page; ``error`` names the signal) or
    ``skipped`` (a 2xx response of a media type the job does not read: its body was not
    downloaded, ``length`` is 0; ``error`` of kind ``unwanted_type`` says so).
    ``rendered``: the links and title come from the page as a browser built it. ``fence`` is the
    revision of the shard's owner key in etcd when the worker crawled it.
    """

    url: str
    fp: str
    job: str
    depth: int
    parent: str | None
    outcome: str
    status: int | None
    final_url: str | None
    redirects: tuple[str, ...]
    content_type: str | None
    length: int
    title: str | None
    outlinks: int
    fetched_at: float
    elapsed_ms: float
    shard: int
    fence: int
    worker: str
    attempt: int = 1  # JetStream's delivery count of the task when this record was made
    redirect_to: str | None = None  # a redirect's canonical target (a record of its own)
    charset: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)  # a selected few, lowercase names
    payload_digest: str | None = None  # "sha1:<base32>" of the body as served (decoded), as WARC
    body_ref: str | None = None  # object name in the crawl_bodies store, when bodies are kept
    trace_id: str | None = None  # the W3C trace id of the task's processing
    error: Failure | None = None
    rendered: bool = False
    spec_version: int = 0  # the job spec's version the page was processed under (0: none)

    def to_obj(self) -> dict[str, Any]:
        return {
            "v": WIRE_VERSION,
            "url": self.url,
            "fp": self.fp,
            "job": self.job,
            "depth": self.depth,
            "parent": self.parent,
            "outcome": self.outcome,
            "status": self.status,
            "final_url": self.final_url,
            "redirects": list(self.redirects),
            "content_type": self.content_type,
            "length": self.length,
            "title": self.title,
            "outlinks": self.outlinks,
            "fetched_at": self.fetched_at,
            "elapsed_ms": self.elapsed_ms,
            "shard": self.shard,
            "fence": self.fence,
            "worker": self.worker,
            "attempt": self.attempt,
            "redirect_to": self.redirect_to,
            "charset": self.charset,
            "headers": dict(self.headers),
            "payload_digest": self.payload_digest,
            "body_ref": self.body_ref,
            "trace_id": self.trace_id,
            "error": (
                None
                if self.error is None
                else {"kind": self.error.kind, "message": self.error.message}
            ),
            "rendered": self.rendered,
            "spec_version": self.spec_version,
        }

    def to_wire(self) -> bytes:
        return orjson.dumps(self.to_obj())

    @classmethod
    def from_wire(cls, data: bytes) -> Self:
        return cls.from_obj(_object(data))

    @classmethod
    def from_obj(cls, obj: dict[str, Any]) -> Self:
        """From a decoded record whose version is checked (``_object``)."""
        outcome = _outcome(obj)
        error_obj = _field(obj, "error", dict, optional=True)
        redirects = _field(obj, "redirects", list)
        return cls(
            url=_field(obj, "url", str),
            fp=_field(obj, "fp", str),
            job=_field(obj, "job", str),
            depth=_depth(obj, "depth") or 0,
            parent=_field(obj, "parent", str, optional=True),
            outcome=outcome,
            status=_field(obj, "status", int, optional=True),
            final_url=_field(obj, "final_url", str, optional=True),
            redirects=tuple(str(r) for r in redirects),
            content_type=_field(obj, "content_type", str, optional=True),
            length=_field(obj, "length", int),
            title=_field(obj, "title", str, optional=True),
            outlinks=_field(obj, "outlinks", int),
            fetched_at=float(_field(obj, "fetched_at", (int, float))),
            elapsed_ms=float(_field(obj, "elapsed_ms", (int, float))),
            shard=_field(obj, "shard", int),
            fence=_field(obj, "fence", int),
            worker=_field(obj, "worker", str),
            attempt=_field(obj, "attempt", int, optional=True) or 1,
            redirect_to=_field(obj, "redirect_to", str, optional=True),
            charset=_field(obj, "charset", str, optional=True),
            headers=_headers(obj),
            payload_digest=_field(obj, "payload_digest", str, optional=True),
            body_ref=_field(obj, "body_ref", str, optional=True),
            trace_id=_field(obj, "trace_id", str, optional=True),
            error=(
                None
                if error_obj is None
                else Failure(_field(error_obj, "kind", str), _field(error_obj, "message", str))
            ),
            rendered=bool(_field(obj, "rendered", bool, optional=True)),
            spec_version=_field(obj, "spec_version", int, optional=True) or 0,
        )


@dataclass(frozen=True, slots=True)
class ResultHead:
    """What a reader that dedupes and counts needs of a result record, checked as
    ``Result.from_wire`` checks it, without building the whole ``Result``.
    ``record()`` builds it from the same parse."""

    fp: str
    outcome: str
    status: int | None
    obj: dict[str, Any]

    @classmethod
    def from_wire(cls, data: bytes) -> ResultHead:
        obj = _object(data)
        return cls(
            fp=_field(obj, "fp", str),
            outcome=_outcome(obj),
            status=_field(obj, "status", int, optional=True),
            obj=obj,
        )

    @property
    def url(self) -> str:
        return str(self.obj.get("url", ""))

    @property
    def error(self) -> Failure | None:
        error = _field(self.obj, "error", dict, optional=True)
        if error is None:
            return None
        return Failure(_field(error, "kind", str), _field(error, "message", str))

    def record(self) -> Result:
        return Result.from_obj(self.obj)


def _outcome(obj: dict[str, Any]) -> str:
    outcome = _field(obj, "outcome", str)
    if outcome not in OUTCOMES:
        raise MessageError("wrong_type", f"outcome {outcome!r}")
    return str(outcome)


# ---------------------------------------------------------------- worker reports


@dataclass(frozen=True, slots=True)
class WaitingOn:
    """A URL a worker holds, or has handed back, and what it waits for."""

    url: str
    why: str  # "host turn", "Retry-After", "robots.txt", "fetching", "retry 2 after timeout", ...
    since: float  # unix time it began to wait so
    due: float | None = None  # unix time it is due back (handed back or retried), if known

    def to_obj(self) -> dict[str, Any]:
        return {"url": self.url, "why": self.why, "since": self.since, "due": self.due}

    @classmethod
    def from_obj(cls, obj: Any) -> Self:
        if not isinstance(obj, dict):
            raise MessageError("wrong_type", "waiting_on items must be objects")
        due = _field(obj, "due", (int, float), optional=True)
        return cls(
            url=_field(obj, "url", str),
            why=_field(obj, "why", str),
            since=float(_field(obj, "since", (int, float))),
            due=None if due is None else float(due),
        )


@dataclass(frozen=True, slots=True)
class JobActivity:
    """One job's pages on one worker, for ``jetcrawl status --job``: totals since it started,
    and its rate over the last report interval."""

    pages: int  # results stored (fetched, blocked, failed or disallowed)
    errors: int  # of those, failed or blocked
    pages_per_s: float
    settled: int = 0  # tasks of a cancelled job acked without a fetch

    def to_obj(self) -> dict[str, Any]:
        return {
            "pages": self.pages,
            "errors": self.errors,
            "pages_per_s": self.pages_per_s,
            "settled": self.settled,
        }

    @classmethod
    def from_obj(cls, obj: Any) -> Self:
        if not isinstance(obj, dict):
            raise MessageError("wrong_type", "jobs values must be objects")
        return cls(
            pages=_field(obj, "pages", int),
            errors=_field(obj, "errors", int),
            pages_per_s=float(_field(obj, "pages_per_s", (int, float))),
            settled=_field(obj, "settled", int, optional=True) or 0,
        )


@dataclass(frozen=True, slots=True)
class WorkerReport:
    """What a worker says of its waiting room, kept in KV ``crawl_workers`` under its id.

    A crawl whose pending tasks all sit handed back (``nak`` with a delay) looks idle from
    JetStream's counts; this says when the furthest of them is due.
    """

    worker: str
    at: float  # unix time of the report
    held: int  # tasks pulled and not yet acked
    waiting: int  # of those, waiting for their host's turn
    handed_back: int  # waiting tasks handed back to JetStream, ever
    handbacks_due: int  # of those, due back still
    furthest_due_at: float | None  # unix time the last of those is due
    hosts_waiting: int = 0  # hosts whose tasks wait for their turn here
    hosts_paused: int = 0  # of those, paused by a 429/503 Retry-After
    waiting_on: tuple[WaitingOn, ...] = ()  # the longest waits, a few
    jobs: Mapping[str, JobActivity] = field(default_factory=dict)  # by job name

    def to_wire(self) -> bytes:
        return orjson.dumps(
            {
                "v": WIRE_VERSION,
                "worker": self.worker,
                "at": self.at,
                "held": self.held,
                "waiting": self.waiting,
                "handed_back": self.handed_back,
                "handbacks_due": self.handbacks_due,
                "furthest_due_at": self.furthest_due_at,
                "hosts_waiting": self.hosts_waiting,
                "hosts_paused": self.hosts_paused,
                "waiting_on": [w.to_obj() for w in self.waiting_on],
                "jobs": {name: job.to_obj() for name, job in self.jobs.items()},
            }
        )

    @classmethod
    def from_wire(cls, data: bytes) -> Self:
        obj = _object(data)
        number = (int, float)
        furthest = _field(obj, "furthest_due_at", number, optional=True)
        return cls(
            worker=_field(obj, "worker", str),
            at=float(_field(obj, "at", number)),
            held=_field(obj, "held", int),
            waiting=_field(obj, "waiting", int),
            handed_back=_field(obj, "handed_back", int),
            handbacks_due=_field(obj, "handbacks_due", int),
            furthest_due_at=None if furthest is None else float(furthest),
            hosts_waiting=_field(obj, "hosts_waiting", int, optional=True) or 0,
            hosts_paused=_field(obj, "hosts_paused", int, optional=True) or 0,
            waiting_on=tuple(
                WaitingOn.from_obj(w) for w in _field(obj, "waiting_on", list, optional=True) or ()
            ),
            jobs={
                name: JobActivity.from_obj(job)
                for name, job in (_field(obj, "jobs", dict, optional=True) or {}).items()
            },
        )
