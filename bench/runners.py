"""The systems measured, each one run as a process tree against the same site.

    bare-fetch    python -m bench.bare fetch: the site's HTML pages (a known list), 64 in flight,
                  no parsing
    bare-extract  python -m bench.bare extract: the same, plus link extraction and canonical URLs
    scrapy        python -m bench.scrapy_spider: a Scrapy crawl from the seeds (robots, 64 / 8,
                  LinkExtractor's defaults: links to binaries skipped by extension)
    jetcrawl-N    python -m jetcrawl crawl SEEDS --workers N --scope any --allow-net 127.0.0.0/8:
                  the crawl command, its dispatcher and workers, nats-server and etcd (its
                  defaults: links to binaries skipped by extension, as Scrapy's; every URL it
                  finds with ``--env JETCRAWL_IGNORED_EXTENSIONS=``)

Each system has its own known set (``WORK``), so systems that do different work are each checked
exactly, and the report says how their work differed. ``run_system`` resets the site's counters,
runs one system to its end under ``run_monitored``, and turns what it wrote and what the site saw
into a ``RunResult``: pages/s (HTML pages, the unit every system shares) over the site's crawl span
(first to last request) and from launch to exit, CPU of every process of the system, peak RSS, the
work the site saw (URLs, bytes, HTML pages, binaries), and the check that it fetched exactly its
known set (``problems`` is empty).
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

import orjson

from bench.cpulimit import Budgets
from bench.procs import (
    UNKNOWN_ROLE,
    TreeMonitor,
    busy_cpu_s,
    child_env,
    cpu_seconds,
    run_monitored,
    self_cpu_s,
)
from bench.siteserver import SiteServer, SiteStats
from tests.support.site.model import Expected

__all__ = [
    "SYSTEMS",
    "WORK",
    "Context",
    "RunResult",
    "expected_for",
    "jetcrawl_env",
    "run_system",
    "stored_messages",
    "stored_messages_in",
]

# jetcrawl-levels: one worker, the seeds spread over the four priority levels (what priority
# handling costs, against jetcrawl-1)
SYSTEMS = ("bare-fetch", "bare-extract", "scrapy", "jetcrawl-1", "jetcrawl-2", "jetcrawl-levels")
MAX_DEPTH = 100  # the site is a few links deep; no system may stop early
# Per-host politeness settings other engineers are adding; set when this build has them.
POLITENESS = {"host_delay_s": "0", "host_concurrency": "8"}
EXAMPLES = 3
# What each system fetches: "html" the HTML pages alone, "skip-binaries" what a crawl that skips
# links to binaries by extension finds, "all" every URL a crawl finds.
SKIP_BINARIES = "skip-binaries"
WORK = {
    "bare-fetch": "html",
    "bare-extract": "html",
    "scrapy": SKIP_BINARIES,
    "jetcrawl-1": SKIP_BINARIES,
    "jetcrawl-2": SKIP_BINARIES,
    "jetcrawl-levels": SKIP_BINARIES,
}
ALL = "all"


@dataclass(frozen=True, slots=True)
class Context:
    site: SiteServer
    expected: Expected  # the crawl that fetches everything
    out_dir: Path
    timeout_s: float
    jetcrawl_env: dict[str, str]  # the JETCRAWL_* variables of jetcrawl runs
    skipping: Expected | None = None  # the crawl that skips binaries (default: ``expected``)
    site_env: dict[str, str] = field(default_factory=dict)  # every system's (tracking params)
    worker_cores: float | None = None  # each jetcrawl worker's CPU budget (None: the machine's)

    @property
    def pages(self) -> int:
        """The HTML pages: what every system fetches, and the unit of pages/s and CPU/page."""
        return len(self.expected.html_pages)


@dataclass(slots=True)
class Output:
    """What a system says it did."""

    fetched: dict[str, int] = field(default_factory=dict)  # URL -> status
    disallowed: set[str] | None = None  # robots-blocked URLs it recorded (jetcrawl)
    links: set[str] | None = None  # canonical links it extracted (bare-extract)
    duplicates: int = 0  # records of a URL already recorded


@dataclass(slots=True)
class RunResult:
    system: str
    rep: int
    pages: int
    wall_s: float  # launch to exit
    span_s: float  # the site's first to last request
    cpu_s: float  # every process of the system, launch to exit
    span_cpu_s: float  # the same, between the site's first and last request (sampled)
    cpu_by_role_s: dict[str, float]  # launch to exit, sampled
    span_cpu_by_role_s: dict[str, float]  # in the span, sampled
    peak_rss_mb: float
    peak_rss_by_role_mb: dict[str, float]
    site_cpu_s: float  # the site's processes over the run (counted for no system)
    background_cores: float  # CPU used by anything else on the machine, in cores
    returncode: int
    problems: list[str]  # why the crawl was not exactly the known set (empty: exact)
    notes: list[str]  # worth knowing, not a failure (e.g. URLs fetched twice)
    # jetcrawl: the messages each stream stored during the crawl, from the command's log
    messages: dict[str, int] = field(default_factory=dict)
    # the work the site saw: WORK's kind, distinct URLs, bytes answered, HTML pages, binaries
    work: str = ALL
    urls: int = 0
    bytes: int = 0
    html: int = 0
    binaries: int = 0
    # the slowest host's requests in flight on average, first request to last answer (None: the
    # site has no slow host)
    slow_host_in_flight: float | None = None
    workers_held: int = 0  # jetcrawl workers held to ``Context.worker_cores`` each

    @property
    def exact(self) -> bool:
        return not self.problems

    @property
    def pages_per_s(self) -> float:
        return self.pages / self.span_s if self.span_s > 0 else 0.0

    @property
    def pages_per_s_e2e(self) -> float:
        return self.pages / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def cpu_ms_per_page(self) -> float:
        return 1000 * self.cpu_s / self.pages

    @property
    def span_cpu_ms_per_page(self) -> float:
        return 1000 * self.span_cpu_s / self.pages

    @property
    def site_cores(self) -> float:
        """The site's CPU over the run, in cores (it can use one per server process)."""
        return self.site_cpu_s / self.span_s if self.span_s > 0 else 0.0

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {f.name: getattr(self, f.name) for f in fields(self)}
        out.update(
            exact=self.exact,
            pages_per_s=self.pages_per_s,
            pages_per_s_e2e=self.pages_per_s_e2e,
            cpu_ms_per_page=self.cpu_ms_per_page,
            span_cpu_ms_per_page=self.span_cpu_ms_per_page,
            site_cores=self.site_cores,
        )
        return out


def jetcrawl_env(work_dir: Path) -> dict[str, str]:
    """The ``JETCRAWL_*`` variables a jetcrawl run gets: the politeness settings of ``POLITENESS``
    that the measured build has (an unknown ``JETCRAWL_*`` variable is an error there)."""
    probe = (
        "import dataclasses, jetcrawl.contract.settings as s; "
        "print(' '.join(f.name for f in dataclasses.fields(s.Settings)))"
    )
    names = subprocess.run(
        [sys.executable, "-c", probe],
        env=child_env(),
        cwd=work_dir,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return {f"JETCRAWL_{name.upper()}": v for name, v in POLITENESS.items() if name in names}


# jetcrawl.local.services.NAME_PREFIX, written out: the bench also measures builds without it.
FORKED_PREFIX = "jc-"
SERVERS = frozenset({"nats-server", "etcd", "py-spy"})  # programs that are their own role


def classify(command: list[str], name: str = "") -> str:
    """The role of a process of a system, from its command line and its name (comm)."""
    if name.startswith(FORKED_PREFIX):  # a service forked by `jetcrawl crawl`
        return name.removeprefix(FORKED_PREFIX)
    if name in SERVERS:  # its name is all it takes, even while its command line is unreadable
        return name
    if not command:
        return UNKNOWN_ROLE
    program = os.path.basename(command[0])
    if program in SERVERS:
        return program
    if "jetcrawl" in command:
        rest = command[command.index("jetcrawl") + 1 :]
        for role in ("dispatcher", "worker", "crawl"):
            if role in rest:
                return role
    for module, role in (("bench.scrapy_spider", "scrapy"), ("bench.bare", "bare")):
        if module in command:
            return role
    return program


def run_system(
    name: str, rep: int, ctx: Context, on_new: Callable[[int, str], None] | None = None
) -> RunResult:
    run_dir = ctx.out_dir / "runs" / f"{name}-{rep}"
    run_dir.mkdir(parents=True, exist_ok=True)
    output = run_dir / ("out.json" if name.startswith("bare") else "out.jsonl")
    command, env = _command(name, ctx, run_dir, output)

    held = ctx.worker_cores is not None and name.startswith("jetcrawl")
    budgets = Budgets(ctx.worker_cores or 0.0, "worker")  # attached to the workers when held
    ctx.site.reset()
    site_before = sum(cpu_seconds(pid) for pid in ctx.site.pids)
    busy_before, self_before = busy_cpu_s(), self_cpu_s()
    with budgets:
        done = run_monitored(
            command,
            env=env,
            cwd=run_dir,
            log_path=run_dir / "log.txt",
            timeout_s=ctx.timeout_s,
            classify=classify,
            on_new=_each(on_new, budgets.attach) if held else on_new,
        )
    site_cpu = sum(cpu_seconds(pid) for pid in ctx.site.pids) - site_before
    others = busy_cpu_s() - busy_before - done.cpu_s - site_cpu - (self_cpu_s() - self_before)
    stats = ctx.site.stats()

    problems: list[str] = []
    notes: list[str] = []
    if done.returncode != 0:
        problems.append(f"exit code {done.returncode} (log: {run_dir / 'log.txt'})")
    if done.timed_out:
        problems.append(f"stopped after the {ctx.timeout_s:g} s timeout")
    try:
        result = _read(name, output)
    except (OSError, ValueError) as e:
        problems.append(f"no readable output: {e!r}")
        result = Output()
    problems += check(result, expected_for(name, ctx), stats, name)
    if held:
        problems += [
            f"a worker not held to {ctx.worker_cores:g} cores: {e}" for e in budgets.errors
        ]
        if not budgets.held and not budgets.errors:
            problems.append(f"no worker process was seen to hold to {ctx.worker_cores:g} cores")
    if stats.refetches:
        notes.append(f"{stats.refetches} requests for URLs already fetched")
    if tail := last_host_alone(stats):
        notes.append(tail)
    span_cpu, span_roles = _span_cpu(done.monitor, stats)
    return RunResult(
        system=name,
        rep=rep,
        pages=ctx.pages,
        wall_s=done.wall_s,
        span_s=stats.span_s,
        cpu_s=done.cpu_s,
        span_cpu_s=span_cpu,
        cpu_by_role_s=done.monitor.cpu_by_role(),
        span_cpu_by_role_s=span_roles,
        peak_rss_mb=done.monitor.peak_rss_bytes / 2**20,
        peak_rss_by_role_mb={k: v / 2**20 for k, v in done.monitor.peak_rss_by_role().items()},
        site_cpu_s=site_cpu,
        background_cores=max(0.0, others / done.wall_s) if done.wall_s > 0 else 0.0,
        returncode=done.returncode,
        problems=problems,
        notes=notes,
        messages=stored_messages(run_dir / "log.txt") if name.startswith("jetcrawl") else {},
        work=work_of(name, ctx),
        urls=len(stats.counts),
        bytes=stats.bytes,
        html=stats.html,
        binaries=stats.binaries,
        slow_host_in_flight=slow_host_in_flight(stats),
        workers_held=len(budgets.held),
    )


def _each(
    *hooks: Callable[[int, str], None] | None,
) -> Callable[[int, str], None]:
    """One ``on_new`` that calls each of ``hooks`` (None: none)."""

    def each(pid: int, role: str) -> None:
        for hook in hooks:
            if hook is not None:
                hook(pid, role)

    return each


def work_of(name: str, ctx: Context) -> str:
    """What ``name`` fetches (``WORK``); jetcrawl fetches everything when its environment
    switches the default extension filter off."""
    if name.startswith("jetcrawl") and ctx.jetcrawl_env.get("JETCRAWL_IGNORED_EXTENSIONS") == "":
        return ALL
    return WORK.get(name, ALL)


def expected_for(name: str, ctx: Context) -> Expected:
    """The known set ``name`` must fetch exactly (``work_of``)."""
    match work_of(name, ctx):
        case "html":
            pages = ctx.expected.html_pages
            return dataclasses.replace(
                ctx.expected,
                fetchable={u: s for u, s in ctx.expected.fetchable.items() if u in pages},
                links=ctx.expected.page_links,
            )
        case "skip-binaries":
            return ctx.skipping or ctx.expected
        case _:
            return ctx.expected


# jetcrawl crawl logs, once drained: "messages stored by this crawl: CRAWL_FRONTIER 2193, ..."
_STORED_MESSAGES = re.compile(r"messages stored by this crawl: (.*)$", re.MULTILINE)


def stored_messages(log: Path) -> dict[str, int]:
    """Messages per stream that a ``jetcrawl crawl`` says in its log it stored ({} from a build
    that does not say)."""
    try:
        return stored_messages_in(log.read_text(errors="replace"))
    except OSError:
        return {}


def stored_messages_in(text: str) -> dict[str, int]:
    """The stream -> count of a crawl's "messages stored" log line in ``text``; {} without one."""
    match = _STORED_MESSAGES.search(text)
    if match is None:
        return {}
    counts = {}
    for part in match.group(1).split(","):
        stream, _, count = part.strip().rpartition(" ")
        if stream and count.isdigit():
            counts[stream] = int(count)
    return counts


def _span_cpu(monitor: TreeMonitor, stats: SiteStats) -> tuple[float, dict[str, float]]:
    if not stats.first:
        return 0.0, {}
    return monitor.cpu_between(stats.first, stats.last)


def _command(
    name: str, ctx: Context, run_dir: Path, output: Path
) -> tuple[list[str], dict[str, str]]:
    seeds = list(ctx.expected.seeds)
    python = sys.executable
    if name in ("bare-fetch", "bare-extract"):
        urls = run_dir / "urls.txt"
        urls.write_text("\n".join(expected_for(name, ctx).fetchable) + "\n")
        mode = name.removeprefix("bare-")
        return [python, "-m", "bench.bare", mode, str(urls), str(output)], child_env(ctx.site_env)
    if name == "scrapy":
        seeds_file = run_dir / "seeds.txt"
        seeds_file.write_text("\n".join(seeds) + "\n")
        command = [python, "-m", "bench.scrapy_spider", str(seeds_file), str(output)]
        return command, child_env(ctx.site_env)
    if name == "jetcrawl-levels":
        seeds = [orjson.dumps({"url": s, "priority": i % 4}).decode() for i, s in enumerate(seeds)]
        name = "jetcrawl-1"
    if name.startswith("jetcrawl-"):
        workers = name.removeprefix("jetcrawl-")
        env = child_env(ctx.site_env | ctx.jetcrawl_env)
        command = [python, "-m", "jetcrawl", "crawl", *seeds, "--workers", workers]
        command += ["--scope", "any", "--allow-net", "127.0.0.0/8"]
        command += ["--max-depth", str(MAX_DEPTH), "--output", str(output)]
        return command, env
    raise ValueError(f"unknown system {name!r}")


# ---------------------------------------------------------------------- outputs and checks


def _read(name: str, output: Path) -> Output:
    out = Output()
    if name.startswith("bare"):
        data = orjson.loads(output.read_bytes())
        out.fetched = data["fetched"]
        if name == "bare-extract":
            out.links = set(data["links"])
        return out
    if name.startswith("jetcrawl"):
        out.disallowed = set()
    for line in output.read_bytes().splitlines():
        record = orjson.loads(line)
        url = record["url"]
        if url in out.fetched or (out.disallowed is not None and url in out.disallowed):
            out.duplicates += 1
        elif record.get("outcome") == "robots_disallowed" and out.disallowed is not None:
            out.disallowed.add(url)
        else:
            out.fetched[url] = record.get("status") or 0
    return out


def last_host_alone(stats: SiteStats, share: float = 0.05) -> str | None:
    """A line naming the host the site heard from last, when it went on alone for more than
    ``share`` of the span (a slow host set the span, not the crawl's pace); else None."""
    ends = sorted((end, name) for name, end in stats.hosts.items())
    if len(ends) < 2 or stats.span_s <= 0:
        return None
    (before, _), (last, host) = ends[-2:]
    if last - before <= share * stats.span_s:
        return None
    return (
        f"the last host ({host}) went on alone for the last {last - before:.2f} s "
        f"of the {stats.span_s:.2f} s span"
    )


def slow_host_in_flight(stats: SiteStats) -> float | None:
    """How many requests the slowest host of the site was answering on average, from its first
    request to its last answer; None if no host answers late. A latency-bound host can be no
    faster than its connections allow: this says how many of them a system kept busy."""
    if not stats.delays_s:
        return None
    host = max(stats.delays_s, key=stats.delays_s.__getitem__)
    delay_s = stats.delays_s[host]
    if host not in stats.hosts:
        return None
    busy_s = stats.hosts[host] + delay_s - stats.host_first[host]
    return stats.host_requests[host] * delay_s / busy_s


def check(out: Output, expected: Expected, stats: SiteStats, name: str) -> list[str]:
    """Why ``out`` and what the site saw differ from the known crawl; empty if they do not."""
    problems = []
    problems += _compare("fetched", set(out.fetched), set(expected.fetchable))
    wrong = [
        u for u, s in out.fetched.items() if u in expected.fetchable and expected.fetchable[u] != s
    ]
    if wrong:
        problems.append(
            f"{len(wrong)} URLs with another status than served, e.g. {wrong[:EXAMPLES]}"
        )
    if out.disallowed is not None:
        problems += _compare("robots-disallowed", out.disallowed, set(expected.disallowed))
    if out.links is not None:
        seeds = set(expected.seeds)
        problems += _compare("links", out.links | seeds, set(expected.links) | seeds)
    if out.duplicates:
        problems.append(f"{out.duplicates} duplicate records")
    problems += _compare("requested at the site", set(stats.counts), set(expected.fetchable))
    if stats.disallowed_hits:
        problems.append(f"{stats.disallowed_hits} robots-disallowed URLs requested ({name})")
    return problems


def _compare(what: str, got: set[str], want: set[str]) -> list[str]:
    problems = []
    if missing := sorted(want - got):
        problems.append(f"{what}: {len(missing)} missing, e.g. {missing[:EXAMPLES]}")
    if extra := sorted(got - want):
        problems.append(f"{what}: {len(extra)} unexpected, e.g. {extra[:EXAMPLES]}")
    return problems
