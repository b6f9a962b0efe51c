"""The report: medians and ranges over repetitions, comparisons and targets, as markdown and JSON.

Throughput is pages per second over the *crawl span*, from the site's first request to its last,
which leaves out what no crawl of a large site notices: interpreter and server start-up, and the
drain check at the end. Pages per second from launch to exit are reported beside it. CPU is every
process of a system from launch to exit (nats-server and etcd included for jetcrawl); the site's
processes are counted for none. A page is an HTML page, the work every system shares; the work
table says what else each system fetched (binaries, redirects, 404s) and where systems differed.
The targets of issue 29 (ratios within one run) are evaluated, not asserted.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.ceiling import Ceiling
from bench.memory import MemoryResult
from bench.profile import Profile
from bench.runners import POLITENESS, SYSTEMS, RunResult

__all__ = ["TARGETS", "Report", "Stat", "memory_markdown"]

SCRAPY = "scrapy"
FRONTIER = "CRAWL_FRONTIER"  # the stream of seeds and links messages
BARE_EXTRACT = "bare-extract"
TARGET_VS_SCRAPY = 10.0  # jetcrawl pages/s at least 10x Scrapy's
TARGET_VS_BARE = 0.6  # ... and at least 60 % of the bare fetch + extract loop's
TARGET_CPU_VS_BARE = 2.5  # CPU per page (all processes) at most 2.5x the bare loop's
TARGET_WORKERS = 1.3  # two workers' pages/s at least 1.3x one worker's
ONE_WORKER, TWO_WORKERS = "jetcrawl-1", "jetcrawl-2"
LEVELS = "jetcrawl-levels"  # one worker, seeds over the four priority levels
TARGET_LEVELS = 0.95  # priority handling costs at most 5% of one worker's pages/s
# Issue 7's absolute target, retired by issue 29; the floor and the machine lines still weigh it.
TARGET_CPU_MS = 0.8
# Scrapy's CPU per page and the bare fetch+extract loop's pages/s on the machine where issue 7
# set the targets: two yardsticks for how much faster that machine was than this one.
REFERENCE_SCRAPY_CPU_MS = 4.4
REFERENCE_BARE_EXTRACT_PAGES_S = 3400.0
TARGETS = {
    "vs_scrapy": f">= {TARGET_VS_SCRAPY:g}x Scrapy pages/s",
    "vs_bare_extract": f">= {TARGET_VS_BARE:.0%} of bare fetch+extract pages/s",
    "cpu_vs_bare_extract": f"<= {TARGET_CPU_VS_BARE:g}x bare fetch+extract CPU per page "
    "(all processes)",
    "vs_one_worker": f">= {TARGET_WORKERS:g}x {ONE_WORKER} pages/s (two workers)",
    "levels_vs_one_worker": f">= {TARGET_LEVELS:.0%} of {ONE_WORKER} pages/s (four levels)",
}
WORK_LABELS = {
    "html": "the HTML pages (a known list)",
    "skip-binaries": "a crawl skipping binaries by extension",
    "all": "a crawl fetching every URL found",
}
BACKGROUND_WARN_CORES = 0.25
SITE_WARN_CORES = 0.8  # per site process
PROFILE_ROWS = 10


@dataclass(frozen=True, slots=True)
class Stat:
    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Stat:
        return cls(statistics.median(values), min(values), max(values)) if values else cls(0, 0, 0)

    def to_dict(self) -> dict[str, float]:
        return {"median": self.median, "min": self.low, "max": self.high}

    def show(self, digits: int = 3) -> str:
        if self.low == self.high:
            return _num(self.median, digits)
        return f"{_num(self.median, digits)} ({_num(self.low, digits)}-{_num(self.high, digits)})"


METRICS: dict[str, Callable[[RunResult], float]] = {
    "pages_per_s": lambda r: r.pages_per_s,
    "pages_per_s_e2e": lambda r: r.pages_per_s_e2e,
    "cpu_ms_per_page": lambda r: r.cpu_ms_per_page,
    "span_cpu_ms_per_page": lambda r: r.span_cpu_ms_per_page,
    "peak_rss_mb": lambda r: r.peak_rss_mb,
    "wall_s": lambda r: r.wall_s,
    "span_s": lambda r: r.span_s,
    "site_cores": lambda r: r.site_cores,
    "background_cores": lambda r: r.background_cores,
    "urls": lambda r: r.urls,
    "mb": lambda r: r.bytes / 1e6,
    "html": lambda r: r.html,
    "binaries": lambda r: r.binaries,
}


@dataclass(slots=True)
class Report:
    meta: dict[str, Any]
    runs: list[RunResult]
    ceiling: Ceiling | None = None
    profiles: Mapping[str, Profile] | None = None

    # ------------------------------------------------------------------ numbers

    @property
    def systems(self) -> list[str]:
        return list(dict.fromkeys(r.system for r in self.runs))

    def stat(self, system: str, metric: str, rep: int | None = None) -> Stat:
        """Over the system's runs, or those of one repetition."""
        runs = [r for r in self.runs if r.system == system and rep in (None, r.rep)]
        return Stat.of([METRICS[metric](r) for r in runs])

    def exact(self, system: str) -> tuple[int, int]:
        runs = [r for r in self.runs if r.system == system]
        return sum(r.exact for r in runs), len(runs)

    def role_ms_per_page(self, system: str, *, span: bool = False) -> dict[str, Stat]:
        """CPU ms per page by process role, launch to exit (or in the crawl span)."""
        runs = [r for r in self.runs if r.system == system]
        by_role = [r.span_cpu_by_role_s if span else r.cpu_by_role_s for r in runs]
        roles = dict.fromkeys(role for split in by_role for role in split)
        return {
            role: Stat.of(
                [
                    1000 * split.get(role, 0.0) / r.pages
                    for r, split in zip(runs, by_role, strict=True)
                ]
            )
            for role in roles
        }

    def workers_ceiling(self, rep: int | None = None) -> dict[str, float] | None:
        """What this machine leaves two workers, from their runs and one worker's (medians, or
        one repetition's): the cores the site and other load left (``cores_left``), those the
        system used in its crawl span (``cores_used``), and the pages/s the cores left allow at
        its CPU per page in the span (``pages_per_s``), as a multiple of one worker's
        (``vs_one_worker``). None unless both ran and the machine's cores are known."""
        cores = self.meta.get("cores")
        two = [r for r in self.runs if r.system == TWO_WORKERS and rep in (None, r.rep)]
        one = self.stat(ONE_WORKER, "pages_per_s", rep).median
        if not cores or not two or not one:
            return None
        left = Stat.of([cores - r.site_cores - r.background_cores for r in two]).median
        used = Stat.of([r.span_cpu_s / r.span_s for r in two if r.span_s > 0]).median
        ms = self.stat(TWO_WORKERS, "span_cpu_ms_per_page", rep).median
        if ms <= 0:
            return None
        rate = 1000 * left / ms
        return {
            "cores_left": left,
            "cores_used": used,
            "pages_per_s": rate,
            "vs_one_worker": rate / one,
        }

    def comparisons(self, system: str, rep: int | None = None) -> dict[str, float | None]:
        """The medians' ratios, or those of one repetition's runs (a baseline not run in it:
        None)."""

        def median(system: str, metric: str) -> float:
            return self.stat(system, metric, rep).median  # 0 for a system not run

        rate = median(system, "pages_per_s")
        scrapy = median(SCRAPY, "pages_per_s")
        bare = median(BARE_EXTRACT, "pages_per_s")
        scrapy_cpu = median(SCRAPY, "cpu_ms_per_page")
        cpu = median(system, "cpu_ms_per_page")
        bare_cpu = median(BARE_EXTRACT, "cpu_ms_per_page")
        one = median(ONE_WORKER, "pages_per_s")
        return {
            "vs_scrapy": rate / scrapy if scrapy else None,
            "vs_bare_extract": rate / bare if bare else None,
            "cpu_vs_bare_extract": cpu / bare_cpu if bare_cpu else None,
            "vs_one_worker": rate / one if one and system == TWO_WORKERS else None,
            "levels_vs_one_worker": rate / one if one and system == LEVELS else None,
            # CPU per page as a share of Scrapy's, which does not depend on the machine as much
            # as milliseconds do; the CPU target was TARGET_CPU_MS / REFERENCE_SCRAPY_CPU_MS.
            "cpu_vs_scrapy": cpu / scrapy_cpu if scrapy_cpu else None,
            # The CPU per page scaled to that machine by the bare loop's speed instead (a
            # CPU-bound single process, so its pages/s goes with the machine's speed).
            "cpu_ms_scaled_by_bare": cpu * bare / REFERENCE_BARE_EXTRACT_PAGES_S if bare else None,
        }

    def targets(
        self, system: str, rep: int | None = None
    ) -> dict[str, tuple[float | None, bool | None]]:
        """Target -> (measured, passed) on the medians, or on one repetition's runs; None where
        the baseline was not run."""
        c = self.comparisons(system, rep)
        vs_scrapy, vs_bare = c["vs_scrapy"], c["vs_bare_extract"]
        cpu, workers = c["cpu_vs_bare_extract"], c["vs_one_worker"]
        return {
            "vs_scrapy": (vs_scrapy, None if vs_scrapy is None else vs_scrapy >= TARGET_VS_SCRAPY),
            "vs_bare_extract": (vs_bare, None if vs_bare is None else vs_bare >= TARGET_VS_BARE),
            "cpu_vs_bare_extract": (cpu, None if cpu is None else cpu <= TARGET_CPU_VS_BARE),
            "vs_one_worker": (workers, None if workers is None else workers >= TARGET_WORKERS),
            "levels_vs_one_worker": (
                c["levels_vs_one_worker"],
                None
                if c["levels_vs_one_worker"] is None
                else c["levels_vs_one_worker"] >= TARGET_LEVELS,
            ),
        }

    def targets_met(self, system: str) -> dict[str, tuple[int, int]]:
        """Target -> (repetitions that met it, repetitions it was measured in), each repetition's
        run against the baselines' runs of that repetition: the machine drifts between
        repetitions, so how often a target holds says what a single median cannot."""
        reps = sorted({r.rep for r in self.runs if r.system == system})
        met: dict[str, tuple[int, int]] = {name: (0, 0) for name in TARGETS}
        for rep in reps:
            for name, (_, passed) in self.targets(system, rep).items():
                if passed is not None:
                    k, n = met[name]
                    met[name] = (k + passed, n + 1)
        return met

    def _targets_met(self) -> dict[str, dict[str, tuple[int, int]]]:
        return {system: self.targets_met(system) for system in self.jetcrawl_systems}

    def cpu_floor(self) -> dict[str, float] | None:
        """The CPU per page under which no jetcrawl run on this machine can go, as measured here:
        the bare fetch+extract loop's (a worker fetches and extracts every page the same way)
        plus the JetStream message mix's, nats-server's and the Python client's (the ceiling).
        None unless both were measured."""
        ceiling = self.weighted_ceiling
        if BARE_EXTRACT not in self.systems or ceiling is None:
            return None
        bare = self.stat(BARE_EXTRACT, "cpu_ms_per_page").median
        messages = (ceiling.server_us_per_page + ceiling.client_us_per_page) / 1000
        return {"bare_extract_ms": bare, "messages_ms": messages, "ms_per_page": bare + messages}

    @property
    def jetcrawl_systems(self) -> list[str]:
        return [s for s in self.systems if s.startswith("jetcrawl")]

    # ------------------------------------------------------------------ renderings

    def to_dict(self) -> dict[str, Any]:
        return {
            "meta": self.meta,
            "workers_ceiling": self.workers_ceiling(),
            "systems": {
                system: {
                    "metrics": {m: self.stat(system, m).to_dict() for m in METRICS},
                    "exact_runs": self.exact(system)[0],
                    "runs": self.exact(system)[1],
                    "cpu_ms_per_page_by_role": {
                        role: stat.to_dict() for role, stat in self.role_ms_per_page(system).items()
                    },
                    "comparisons": self.comparisons(system),
                    "messages_per_page": {
                        stream: stat.to_dict()
                        for stream, stat in self.messages_per_page(system).items()
                    },
                }
                for system in self.systems
            },
            "targets": {
                system: {
                    name: {
                        "target": TARGETS[name],
                        "measured": measured,
                        "pass": passed,
                        "reps_met": met[name],
                    }
                    for name, (measured, passed) in self.targets(system).items()
                }
                for system, met in self._targets_met().items()
            },
            "runs": [r.to_dict() for r in self.runs],
            "ceiling": ceiling.to_dict() if (ceiling := self.weighted_ceiling) else None,
            "cpu_floor": self.cpu_floor(),
            "profiles": {k: v.to_dict() for k, v in (self.profiles or {}).items()},
        }

    def markdown(self) -> str:
        meta = self.meta
        spec = meta["site"]
        shape = meta.get("shape", "tree")
        lines = [
            "# jetcrawl benchmark",
            "",
            f"{meta['date']} · {meta['machine']} · Python {meta['python']} · jetcrawl "
            f"{meta['jetcrawl_commit']} · {meta['versions']}",
            "",
            f"Site ({shape}): {spec['hosts']} hosts, {meta['pages']} fetchable URLs "
            f"({meta['html_pages']} HTML pages of ~{spec['links_per_page']} links, "
            f"{meta['disallowed']} more robots-disallowed), served by {meta['site_processes']} "
            f"separate processes. {meta['reps']} repetitions; median (min-max). "
            "Pages are HTML pages, for every system (the work table shows the rest). "
            "Pages/s over the crawl span (the site's first to last request); launch→exit "
            "includes start-up and the end-of-crawl check. CPU: all processes of the system, "
            "launch to exit (jetcrawl: crawl command, dispatcher, workers, nats-server, etcd).",
            "",
            "| system | pages/s | pages/s launch→exit | CPU ms/page | CPU ms/page in span "
            "| peak RSS MB | exact | vs Scrapy | vs bare+extract | other load, cores |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for system in self.systems:
            ok, runs = self.exact(system)
            cmp = self.comparisons(system)
            lines.append(
                f"| {system} | {self.stat(system, 'pages_per_s').show()} "
                f"| {self.stat(system, 'pages_per_s_e2e').show()} "
                f"| {self.stat(system, 'cpu_ms_per_page').show()} "
                f"| {self.stat(system, 'span_cpu_ms_per_page').show()} "
                f"| {self.stat(system, 'peak_rss_mb').show()} "
                f"| {'yes' if ok == runs else 'NO'} {ok}/{runs} "
                f"| {_ratio(cmp['vs_scrapy'])} | {_percent(cmp['vs_bare_extract'])} "
                f"| {self.stat(system, 'background_cores').show(2)} |"
            )
        lines += self._work_md() + self._targets_md() + self._roles_md() + self._messages_md()
        lines += self._conditions_md()
        lines += self._problems_md() + self._ceiling_md() + self._profiles_md()
        return "\n".join(lines) + "\n"

    def _targets_md(self) -> list[str]:
        systems = self.jetcrawl_systems
        if not systems:
            return []
        lines = ["", "## Targets (issue 29)", ""]
        if cores := self.meta.get("worker_cores"):
            lines += [
                f"**Each jetcrawl worker was held to {cores:g} cores** (`--worker-cores`), as a "
                "container's CPU limit holds it: these are readings of workers of that size "
                f"({TWO_WORKERS} against {ONE_WORKER}: the mesh with a second one, the rest of "
                "the mesh on the machine's other cores), not of the targets as issue 29 sets "
                "them, with the workers as the machine lets them run.",
                "",
            ]
        lines.append(f"| target | {' | '.join(systems)} |")
        lines.append("|---|" + "---|" * len(systems))
        met = self._targets_met()
        for name, label in TARGETS.items():
            cells = []
            for system in systems:
                measured, passed = self.targets(system)[name]
                if measured is None:
                    cells.append("-" if name == "vs_one_worker" else "not run")
                    continue
                shown = _percent(measured) if name == "vs_bare_extract" else _ratio(measured)
                k, n = met[system][name]
                cells.append(f"{shown} {'pass' if passed else 'FAIL'} ({k}/{n} reps)")
            lines.append(f"| {label} | {' | '.join(cells)} |")
        lines += [
            "",
            "On the medians; (k/n reps): the repetitions in which the system's run met the "
            "target against the baselines' runs of the same repetition, run beside it.",
        ]
        lines += self._workers_ceiling_md()
        lines += self._slow_host_md()
        lines += self._machine_scaled_md(systems)
        return lines

    def _slow_host_md(self) -> list[str]:
        """How busy the polite systems kept the site's slow host, which none can hurry: a line.
        (The bare loops know no per-host limit.)"""
        shown = []
        polite = [s for s in SYSTEMS if s == "scrapy" or s.startswith("jetcrawl")]
        for system in polite:
            runs = [r for r in self.runs if r.system == system]
            busy = [r.slow_host_in_flight for r in runs if r.slow_host_in_flight is not None]
            if busy:  # a site with a slow host: every run has the figure
                shown.append(f"{system} {Stat.of(busy).show()}")
        if not shown:
            return []
        return [
            "",
            "The slow host's requests in flight on average, from its first request to its last "
            "answer (a latency-bound host ends no sooner than its connections allow; jetcrawl "
            f"and Scrapy may keep {POLITENESS['host_concurrency']} busy): {', '.join(shown)}.",
        ]

    def _workers_ceiling_md(self) -> list[str]:
        """Whether two workers were held back by their coordination or by the machine: a line."""
        if self.meta.get("worker_cores"):
            return []  # the cores left do not bound workers held to a budget: the heading says
        ceiling = self.workers_ceiling()
        if ceiling is None:
            return []
        reps = sorted({r.rep for r in self.runs if r.system == TWO_WORKERS})
        per_rep = [self.workers_ceiling(rep) for rep in reps]
        allowed = sum(c is not None and c["vs_one_worker"] >= TARGET_WORKERS for c in per_rep)
        return [
            "",
            f"What this machine leaves {TWO_WORKERS}: of its {self.meta['cores']} cores, the site "
            f"and other load left {ceiling['cores_left']:.2f} and it used "
            f"{ceiling['cores_used']:.2f} in its crawl span; at its CPU per page there, those "
            f"cores allow at most {ceiling['pages_per_s']:,.0f} pages/s, "
            f"{ceiling['vs_one_worker']:.2f}x {ONE_WORKER} ({allowed}/{len(reps)} reps at least "
            f"{TARGET_WORKERS:g}x). " + _ceiling_verdict(ceiling),
        ]

    def _machine_scaled_md(self, systems: list[str]) -> list[str]:
        """The CPU per page as it would be on the machine where the targets were set, by the two
        yardsticks this run measured (Scrapy's CPU, the bare loop's speed); a report line."""
        sentences = []
        comparisons = {system: self.comparisons(system) for system in systems}
        shares = [(s, comparisons[s]["cpu_vs_scrapy"]) for s in systems]
        if all(share is not None for _, share in shares):
            reference = TARGET_CPU_MS / REFERENCE_SCRAPY_CPU_MS
            sentences.append(
                f"Where the targets were set, Scrapy spent {REFERENCE_SCRAPY_CPU_MS:g} CPU ms per "
                f"page, so {TARGET_CPU_MS:g} ms was {reference:.2f}x Scrapy's CPU per page. Here, "
                "as a share of Scrapy's: "
                + ", ".join(
                    f"{system} {share:.2f}x (as {share * REFERENCE_SCRAPY_CPU_MS:.2f} ms there)"
                    for system, share in shares
                    if share is not None
                )
                + "."
            )
        scaled = [(s, comparisons[s]["cpu_ms_scaled_by_bare"]) for s in systems]
        if all(ms is not None for _, ms in scaled):
            sentences.append(
                "Scaled by the bare fetch+extract loop's speed instead "
                f"({REFERENCE_BARE_EXTRACT_PAGES_S:,.0f} pages/s there): "
                + ", ".join(
                    f"{system} {ms:.2f} ms there" for system, ms in scaled if ms is not None
                )
                + "."
            )
        lines = ["", "Machines differ. " + " ".join(sentences)] if sentences else []
        return lines + self._floor_md(systems)

    def _floor_md(self, systems: list[str]) -> list[str]:
        """What this machine allows: the CPU floor against the target and each system; a line."""
        floor = self.cpu_floor()
        if floor is None:
            return []
        ms = floor["ms_per_page"]
        verdict = (
            f"That is over the {TARGET_CPU_MS:g} ms target, so the target cannot be met on this "
            "machine"
            if ms > TARGET_CPU_MS
            else f"That is {TARGET_CPU_MS - ms:.2f} ms under the {TARGET_CPU_MS:g} ms target: what "
            "the target leaves for all the rest"
        )
        above = ", ".join(
            f"{system} {self.stat(system, 'cpu_ms_per_page').median - ms:+.2f} ms"
            for system in systems
        )
        return [
            "",
            f"The floor here: the bare fetch+extract loop's {_num(floor['bare_extract_ms'])} "
            f"CPU ms per page plus the message mix's {_num(floor['messages_ms'])} (nats-server "
            f"and client, the JetStream ceiling below) make **{_num(ms)} ms**, before any of the "
            "crawler's own work (dispatch, dedupe, robots, politeness, results, its other "
            f"processes). {verdict}. CPU per page above the floor: {above}.",
        ]

    def different_work(self) -> list[str]:
        """How each system's work differed from the one that fetched the most URLs; empty when
        every system fetched the same URLs, HTML pages and binaries (medians)."""
        if not self.systems:
            return []
        counts = {
            s: tuple(self.stat(s, m).median for m in ("urls", "html", "binaries"))
            for s in self.systems
        }
        most = max(self.systems, key=lambda s: counts[s][0])
        urls, html, binaries = counts[most]
        return [
            f"{s} fetched {urls - u:,.0f} fewer URLs than {most} "
            f"({html - h:,.0f} HTML pages, {binaries - b:,.0f} binaries)"
            for s, (u, h, b) in counts.items()
            if (u, h, b) != counts[most]
        ]

    def _work_md(self) -> list[str]:
        lines = [
            "",
            "## Work done (what the site answered each system)",
            "",
            "| system | fetches | URLs fetched | MB transferred | HTML pages | binaries "
            "| pages/s | CPU ms/page |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for system in self.systems:
            work = next(r.work for r in self.runs if r.system == system)
            lines.append(
                f"| {system} | {WORK_LABELS.get(work, work)} | {self.stat(system, 'urls').show()} "
                f"| {self.stat(system, 'mb').show()} | {self.stat(system, 'html').show()} "
                f"| {self.stat(system, 'binaries').show()} "
                f"| {self.stat(system, 'pages_per_s').show()} "
                f"| {self.stat(system, 'cpu_ms_per_page').show()} |"
            )
        differences = self.different_work()
        lines.append("")
        if differences:
            lines.append(
                "**The systems did different work**: "
                + "; ".join(differences)
                + ". Pages/s and CPU per page count the same HTML pages for every system."
            )
        else:
            lines.append("Every system did the same work.")
        return lines

    def messages_per_page(self, system: str) -> dict[str, Stat]:
        """Messages each stream stored per page, over the runs that report them."""
        runs = [r for r in self.runs if r.system == system and r.messages]
        streams = dict.fromkeys(stream for r in runs for stream in r.messages)
        return {
            stream: Stat.of([r.messages.get(stream, 0) / r.pages for r in runs])
            for stream in streams
        }

    def _messages_md(self) -> list[str]:
        by_system = {s: self.messages_per_page(s) for s in self.jetcrawl_systems}
        return _table(
            "Messages stored per page (CRAWL_FRONTIER: the seeds and the links messages)",
            "stream",
            {s: stats for s, stats in by_system.items() if stats},
        )

    def _roles_md(self) -> list[str]:
        lines = []
        for span, title in ((False, "launch to exit"), (True, "in the crawl span")):
            by_system = {s: self.role_ms_per_page(s, span=span) for s in self.systems}
            lines += _table(
                f"CPU ms per page by process ({title}, sampled)",
                "process",
                {s: stats for s, stats in by_system.items() if len(stats) > 1},
            )
        return lines

    def _conditions_md(self) -> list[str]:
        site = max((r.site_cores for r in self.runs), default=0.0)
        background = max((r.background_cores for r in self.runs), default=0.0)
        processes = self.meta["site_processes"]
        lines = [
            "",
            "## Conditions",
            "",
            f"- The site's processes used at most {_num(site)} cores during a crawl span "
            f"({processes} processes, so {processes} cores at most): "
            + (
                "it may have been the bottleneck."
                if site > SITE_WARN_CORES * processes
                else "it was not the bottleneck."
            ),
            f"- Other load on the machine (not the system, the site or the harness): at most "
            f"{_num(background)} cores during a run"
            + (
                " — results are disturbed; rerun on a quiet machine."
                if background > BACKGROUND_WARN_CORES
                else "."
            ),
        ]
        env = self.meta.get("jetcrawl_env") or {}
        shown = " ".join(f"{k}={v}" for k, v in env.items()) or "none"
        lines.append(f"- jetcrawl environment set by the harness: {shown}.")
        if cores := self.meta.get("worker_cores"):
            held = [r.workers_held for r in self.runs if r.system.startswith("jetcrawl")]
            lines.append(
                f"- Each jetcrawl worker held to {cores:g} cores by a cgroup of its own: "
                f"{sum(held)} worker processes in {len(held)} jetcrawl runs."
            )
        if site_env := self.meta.get("site_env"):
            shown = " ".join(f"{k}={v}" for k, v in site_env.items())
            lines.append(f"- Every system's environment for this site: {shown}.")
        return lines

    def _problems_md(self) -> list[str]:
        failed = [r for r in self.runs if r.problems or r.notes]
        if not failed:
            return []
        lines = ["", "## Problems and notes", ""]
        for r in failed:
            for text in r.problems:
                lines.append(f"- {r.system} rep {r.rep}: {text}")
            for text in r.notes:
                lines.append(f"- {r.system} rep {r.rep} (note): {text}")
        return lines

    @property
    def weighted_ceiling(self) -> Ceiling | None:
        """The ceiling with links messages weighted as the first jetcrawl system's crawls
        stored them (CRAWL_FRONTIER per page, seeds included), where they say."""
        if self.ceiling is None:
            return None
        for system in self.jetcrawl_systems:
            frontier = self.messages_per_page(system).get(FRONTIER)
            if frontier is not None:
                return dataclasses.replace(self.ceiling, links_per_page=frontier.median)
        return self.ceiling

    def _ceiling_md(self) -> list[str]:
        c = self.weighted_ceiling
        if c is None:
            return []
        lines = [
            "",
            "## JetStream ceiling for the message mix",
            "",
            "One Python client through jetcrawl's Outbox (pipelined, 256 at a time) and "
            "`fetch(256)` + `ack()`; nats-server with jetcrawl's topology, file storage.",
            "",
            "| per page | bytes | msgs/s (one client) | nats-server µs/msg | client µs/msg |",
            "|---|---|---|---|---|",
        ]
        for p in c.phases:
            lines.append(
                f"| {p.name} | {p.payload_bytes} | {_num(p.rate)} | {_num(p.server_us)} "
                f"| {_num(p.client_us)} |"
            )
        lines += [
            f"| **one page** (links messages x{_num(c.links_per_page, 3)}) | | "
            f"| **{_num(c.server_us_per_page)}** | **{_num(c.client_us_per_page)}** |",
            "",
            f"One nats-server core carries about **{_num(c.pages_per_server_core)} pages/s** of "
            f"this mix; the services' own NATS client work is about "
            f"{_num(c.client_us_per_page / 1000)} CPU ms per page of Python.",
        ]
        measured = [(s, self.role_ms_per_page(s).get("nats-server")) for s in self.jetcrawl_systems]
        shown = ", ".join(f"{s} {stat.show()}" for s, stat in measured if stat is not None)
        if shown:
            lines.append(f"In the crawls, nats-server spent (CPU ms per page): {shown}.")
        return lines

    def _profiles_md(self) -> list[str]:
        if not self.profiles:
            return []
        lines = [
            "",
            "## Profile (py-spy, one extra jetcrawl-1 run; share of CPU samples)",
            "",
            "Self time of `Runner.run` is the event loop itself (uvloop's C code: polling, "
            "socket I/O, callbacks); of `StreamWriter.writelines`, the NATS client's socket "
            "writes. Samples count a thread that is runnable, so on a busy machine waiting for "
            "a core counts too.",
        ]
        for name, profile in self.profiles.items():
            lines += [
                "",
                f"### {name} ({profile.samples} samples)",
                "",
                "| self: function | % | self: source file | % |",
                "|---|---|---|---|",
            ]
            for i in range(min(PROFILE_ROWS, len(profile.self_top))):
                fn, share = profile.self_top[i]
                file, file_share = profile.files_top[i] if i < len(profile.files_top) else ("", 0)
                lines.append(
                    f"| `{fn}` | {share:.1%} | `{file}` | {file_share:.1%} |"
                    if file
                    else f"| `{fn}` | {share:.1%} | | |"
                )
            if profile.inclusive_top:
                lines += [
                    "",
                    "Inclusive: " + ", ".join(f"`{fn}` {s:.0%}" for fn, s in profile.inclusive_top),
                ]
        return lines


def memory_markdown(result: MemoryResult) -> str:
    lines = [
        "# Dispatcher memory while the seen set grows",
        "",
        f"{result.urls} distinct seed URLs published to an embedded nats-server; one "
        f"`jetcrawl dispatcher` admits them into KV `crawl_seen` (its in-memory LRU cache holds "
        f"{result.dedupe_cache_size} fingerprints, `dedupe_cache_size`).",
        "",
        "| admitted | seconds | dispatcher RSS MB | nats-server RSS MB |",
        "|---|---|---|---|",
    ]
    for c in result.checkpoints:
        lines.append(
            f"| {c.admitted} | {_num(c.seconds)} | {_num(c.dispatcher_rss_mb)} "
            f"| {_num(c.nats_rss_mb)} |"
        )
    lines += [
        "",
        f"- Admissions per second: {_num(result.admissions_per_s)} "
        f"({_num(result.dispatcher_us_per_admission)} dispatcher CPU µs per URL).",
        f"- KV disk: {_num(result.kv_bytes_per_url)} bytes per URL "
        f"({result.kv_disk_bytes} bytes for {result.admitted} URLs); the admitted tasks "
        f"waiting in CRAWL_TASKS: {result.tasks_disk_bytes} bytes.",
        f"- Peak dispatcher RSS: {_num(result.peak_dispatcher_rss_mb)} MB.",
    ]
    return "\n".join(lines) + "\n"


def _num(x: float, digits: int = 3) -> str:
    if x == 0:
        return "0"
    if abs(x) >= 10 ** (digits - 1):
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2g}x" if x < 10 else f"{x:.0f}x"


def _percent(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _ceiling_verdict(ceiling: dict[str, float]) -> str:
    if ceiling["vs_one_worker"] < TARGET_WORKERS:
        return (
            f"Under {TARGET_WORKERS:g}x even with every core left busy: on this machine the "
            "cores, not the workers' coordination, hold two workers back."
        )
    idle = 1 - ceiling["cores_used"] / ceiling["cores_left"]
    return (
        f"The way from its pages/s to that ceiling is the {idle:.0%} of those cores it left idle "
        "(its start, hosts' tails, waits on the mesh): what the workers' coordination costs."
    )


def _table(title: str, label: str, by_system: dict[str, dict[str, Stat]]) -> list[str]:
    """A markdown section: a row per key of the systems' stats, a column per system; none
    without a system."""
    systems = list(by_system)
    if not systems:
        return []
    rows = list(dict.fromkeys(row for stats in by_system.values() for row in stats))
    lines = [
        "",
        f"## {title}",
        "",
        f"| {label} | {' | '.join(systems)} |",
        "|---|" + "---|" * len(systems),
    ]
    for row in rows:
        cells = [stats[row].show() if row in stats else "-" for stats in by_system.values()]
        lines.append(f"| {row} | {' | '.join(cells)} |")
    return lines
