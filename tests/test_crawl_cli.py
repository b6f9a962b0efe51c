"""``jetcrawl crawl`` end to end: the real command in a subprocess, against local websites.

Each run gets the test's environment without any ``JETCRAWL_*`` variable, plus 16 shards, no
politeness delay and a ``TMPDIR`` of its own, so the test can check that the run left no temporary
directory behind. Its stdout, stderr (not a TTY: progress comes as log lines) and ``--output`` are
files in the test's directory. While a crawl runs, the test can list its services from /proc; on
the way out every process the test saw is killed by pid, so a failing test leaves nothing running.

EndlessSite is a website with no end (every page links 50 new ones), for crawls that must still
be running when the test interrupts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self
from urllib.parse import urlsplit

import pytest
from aiohttp import web
from nats.js import JetStreamContext

from bench.runners import stored_messages_in
from jetcrawl.cli.commands import EXIT_NOTHING_FETCHED
from jetcrawl.contract.messages import Result
from jetcrawl.contract.urls import host_of, shard_of
from jetcrawl.local.children import MAX_RESTARTS
from jetcrawl.local.crawl import nats_threads
from jetcrawl.local.embedded import EtcdServer, NatsServer
from jetcrawl.local.services import NAME_PREFIX
from tests.support import faulty
from tests.support.badsite import RawServer
from tests.support.ledger import read_ledger
from tests.support.procfs import EXITED, environ, stat
from tests.support.site import MultiHostSite
from tests.support.streams import eventually

SHARDS = 16
ALLOW_LOOPBACK = ("--allow-net", "127.0.0.0/8")
CRAWL_TIMEOUT_S = 60.0  # a whole crawl of the test site takes ~3 s
STOP_WITHIN_S = 20.0  # from Ctrl-C to the exit of the command, a second Ctrl-C included
# From one Ctrl-C to the exit: the 2 s the services have to stop, and a margin for a machine
# busy with parallel tests.
INTERRUPTED_WITHIN_S = 8.0
GONE_WITHIN_S = 10.0  # from the exit of the command to the end of its last service
KILLED_GONE_WITHIN_S = 3.0  # from SIGKILL of the command (PR_SET_PDEATHSIG is at once)
LOG_TAIL_LINES = 15
SUMMARY = re.compile(r"^crawled (\d+) URLs in \S+ s")
SERVICES = ["dispatcher", "etcd", "nats-server", "worker", "worker"]


# ---------------------------------------------------------------- processes, from /proc


@dataclass(frozen=True, slots=True)
class Proc:
    """One process, identified by pid and start time (a reused pid is another process)."""

    pid: int
    start_time: int
    argv: tuple[str, ...]
    comm: str  # a forked service is named jc-<role>; a spawned one keeps the command's name

    @property
    def kind(self) -> str:
        """The service: nats-server, etcd, dispatcher, worker; else the program's name."""
        program = Path(self.argv[0]).name if self.argv else "?"
        if self.comm.startswith(NAME_PREFIX):
            return self.comm.removeprefix(NAME_PREFIX)
        if "jetcrawl" in self.argv and self.argv[-1] in ("dispatcher", "worker"):
            return self.argv[-1]
        return program

    def alive(self) -> bool:
        found = stat(self.pid)
        return (
            found is not None and found.start_time == self.start_time and found.state not in EXITED
        )

    def kill(self) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


def _proc(pid: int) -> Proc | None:
    """The process ``pid`` if it is alive."""
    found = stat(pid)
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    if found is None or found.state in EXITED:
        return None
    args = tuple(arg.decode(errors="replace") for arg in argv if arg)
    return Proc(pid, found.start_time, args, found.name)


def descendants(pid: int) -> list[Proc]:
    """Every live descendant of ``pid``, from /proc/<pid>/task/*/children, recursively."""
    found: list[Proc] = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            pids = [int(child) for child in children.read_text().split()]
        except OSError:
            continue  # the thread or the process is gone
        for child in pids:
            proc = _proc(child)
            if proc is not None:
                found.append(proc)
                found.extend(descendants(child))
    return found


async def until(check: Callable[[], bool], within_s: float) -> None:
    """Wait until ``check()`` holds; TimeoutError after ``within_s``."""

    async def holds() -> bool:
        return check()

    await eventually(holds, within_s)


async def settle(check: Callable[[], bool], within_s: float) -> None:
    """Wait until ``check()`` holds, at most ``within_s``; the caller asserts the state after."""
    with contextlib.suppress(TimeoutError):
        await until(check, within_s)


# ---------------------------------------------------------------- the command


@dataclass(frozen=True, slots=True)
class Finished:
    returncode: int
    stdout: str
    stderr: str
    lines: list[bytes]  # of --output
    leftovers: list[str]  # what the run left in its TMPDIR

    def results(self) -> list[Result]:
        return [Result.from_wire(line) for line in self.lines]

    def summary_count(self) -> int:
        match = SUMMARY.match(self.stdout)
        assert match is not None, f"no summary line on stdout:\n{self.stdout}"
        return int(match.group(1))

    def explain(self) -> str:
        return f"exit {self.returncode}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


class Crawl:
    """``jetcrawl crawl ARGS --output workdir/out.jsonl --allow-net 127.0.0.0/8``, its files in
    ``workdir``; an async context manager that kills, on exit, the command and every service of
    it seen so far. With ``fault``, its services crash on it (tests/support/faulty.py)."""

    def __init__(
        self,
        workdir: Path,
        *args: str,
        env: Mapping[str, str] | None = None,
        new_session: bool = False,
        shards: int | None = SHARDS,
        fault: str | None = None,
    ) -> None:
        self.workdir = workdir
        self.output = workdir / "out.jsonl"
        self.args = (*args, "--output", str(self.output), *ALLOW_LOOPBACK)
        self.tmpdir = workdir / "tmp"
        self._command = faulty.command(fault)
        self._env = faulty.environ(
            {
                **{k: v for k, v in os.environ.items() if not k.startswith("JETCRAWL_")},
                **({"JETCRAWL_SHARDS": str(shards)} if shards is not None else {}),
                "JETCRAWL_HOST_DELAY_S": "0",  # the product's 1 s per host would take minutes here
                "TMPDIR": str(self.tmpdir),
                **(env or {}),
            }
        )
        self._new_session = new_session
        self._proc: asyncio.subprocess.Process | None = None
        self._seen: dict[int, Proc] = {}

    async def __aenter__(self) -> Self:
        self.tmpdir.mkdir(parents=True)
        with (
            (self.workdir / "stdout").open("wb") as stdout,
            (self.workdir / "stderr").open("wb") as stderr,
        ):
            self._proc = await asyncio.create_subprocess_exec(
                *self._command,
                "crawl",
                *self.args,
                env=self._env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=self._new_session,
            )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        proc = self.proc
        if proc.returncode is None:
            self.services()
            proc.kill()
            await proc.wait()
        for seen in self._seen.values():
            seen.kill()

    @property
    def proc(self) -> asyncio.subprocess.Process:
        assert self._proc is not None, "not started"
        return self._proc

    def proc_argv(self) -> tuple[str, ...]:
        """The command's own command line, as /proc shows it."""
        proc = _proc(self.proc.pid)
        assert proc is not None, "the command is gone"
        return proc.argv

    def services(self) -> list[Proc]:
        """The command's live descendants now (each one remembered for the cleanup)."""
        now = descendants(self.proc.pid)
        self._seen.update((proc.pid, proc) for proc in now)
        return now

    def all_services(self) -> list[Proc]:
        """The services now, failing the test unless they are all there."""
        services = self.services()
        if sorted(p.kind for p in services) != SERVICES:
            pytest.fail(f"expected {SERVICES}, found {services}\n{self.diagnosis()}")
        return services

    def interrupt(self) -> None:
        """Ctrl-C: SIGINT to the command, or to its whole process group as a terminal does."""
        if self._new_session:
            os.killpg(self.proc.pid, signal.SIGINT)
        else:
            self.proc.send_signal(signal.SIGINT)

    async def until(self, check: Callable[[], bool], within_s: float, what: str) -> None:
        """Wait until ``check()`` holds while the command runs; fail with its logs if it ends
        first or ``within_s`` passes."""
        with contextlib.suppress(TimeoutError):
            await until(lambda: check() or self.proc.returncode is not None, within_s)
        if not check():
            pytest.fail(f"never {what} (within {within_s:g} s)\n{self.diagnosis()}")

    async def finish(self, within_s: float = CRAWL_TIMEOUT_S) -> Finished:
        try:
            async with asyncio.timeout(within_s):
                returncode = await self.proc.wait()
        except TimeoutError:
            pytest.fail(f"still running after {within_s:g} s\n{self.diagnosis()}")
        return Finished(
            returncode=returncode,
            stdout=(self.workdir / "stdout").read_text(),
            stderr=(self.workdir / "stderr").read_text(),
            lines=self.output.read_bytes().splitlines() if self.output.exists() else [],
            leftovers=sorted(p.name for p in self.tmpdir.iterdir()),
        )

    def diagnosis(self) -> str:
        """Exit code or live services, stderr, and the tail of every service log still there."""
        if self.proc.returncode is not None:
            parts = [f"--- exited with {self.proc.returncode}"]
        else:
            parts = [
                "--- services",
                *(f"{p.pid} {p.comm} {' '.join(p.argv)}" for p in self.services()),
            ]
        parts += ["--- stderr", (self.workdir / "stderr").read_text(errors="replace")]
        for log in sorted(self.tmpdir.glob("jetcrawl-*/*.log")):
            tail = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            parts += [f"--- {log.name}", *tail]
        return "\n".join(parts)


async def crawl(
    workdir: Path,
    *args: str,
    env: Mapping[str, str] | None = None,
    shards: int | None = SHARDS,
    fault: str | None = None,
) -> Finished:
    """Run the command to its end (with ``JETCRAWL_SHARDS=shards`` unless None)."""
    async with Crawl(workdir, *args, env=env, shards=shards, fault=fault) as running:
        return await running.finish()


def urls_of(results: list[Result]) -> set[str]:
    urls = [r.url for r in results]
    assert len(urls) == len(set(urls)), f"URLs recorded twice: {_repeated(urls)}"
    return set(urls)


def _repeated(items: list[str]) -> list[str]:
    return [item for item, n in Counter(items).items() if n > 1]


def robots_url(host: str) -> str:
    return f"http://{host}/robots.txt"


# ---------------------------------------------------------------- a website with no end


class EndlessSite:
    """One host on 127.0.0.1: page N links pages 50N+1 .. 50N+50, each answered after
    ``delay_s``, or with ``hang=True`` not before the site stops; robots.txt allows all."""

    def __init__(self, delay_s: float = 0.02, hang: bool = False) -> None:
        self._delay_s = delay_s
        self._hang = hang
        self._released = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._port = 0
        self.page_requests = 0

    @property
    def seed(self) -> str:
        return f"http://127.0.0.1:{self._port}/p/0"

    async def __aenter__(self) -> Self:
        app = web.Application()
        app.router.add_get("/robots.txt", self._robots)
        app.router.add_get("/p/{n:[0-9]+}", self._page)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self._port = self._runner.addresses[0][1]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._released.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _robots(self, request: web.Request) -> web.Response:
        return web.Response(text="User-agent: *\nAllow: /\n")

    async def _page(self, request: web.Request) -> web.Response:
        self.page_requests += 1
        if self._hang:
            await self._released.wait()
        else:
            await asyncio.sleep(self._delay_s)
        n = int(request.match_info["n"])
        links = "".join(f'<a href="/p/{50 * n + i}">{i}</a>' for i in range(1, 51))
        return web.Response(text=f"<html><body>{links}</body></html>", content_type="text/html")


# ---------------------------------------------------------------- a whole crawl


@pytest.mark.parametrize("fork", ["true", "false"])
async def test_crawl_records_every_reachable_url_once(
    tmp_path: Path, site: MultiHostSite, fork: str
) -> None:
    # Forked from the command (the default) or each a new interpreter: the same crawl.
    env = {"JETCRAWL_LOCAL_FORK": fork}
    finished = await crawl(tmp_path, *site.seeds, "--workers", "2", "--scope", "any", env=env)
    assert finished.returncode == 0, finished.explain()

    # The output: one well-formed Result per line, one line per URL, exactly the reachable set.
    results = finished.results()
    assert urls_of(results) == site.reachable
    assert len({r.fp for r in results}) == len(results)
    by_url = {r.url: r for r in results}

    # Robots: disallowed URLs are recorded as such and never asked for.
    counts = site.request_counts
    for url in site.disallowed:
        assert by_url[url].outcome == "robots_disallowed", url
        assert by_url[url].status is None, url
        assert counts[url] == 0, url

    # Fetching: every fetchable URL asked for exactly once (redirect sources and their targets
    # alike), with the status the site answers; nothing else asked for but robots.txt.
    for url in site.fetchable:
        record = by_url[url]
        assert record.outcome == "fetched", record
        assert record.status == site.statuses[url], record
    robots = {robots_url(host) for host in site.hosts}
    assert {url: n for url, n in counts.items() if url not in robots} == dict.fromkeys(
        site.fetchable, 1
    )
    # robots.txt once per host and worker that crawled the host (a worker caches it; a host
    # moves to the second worker when it joins and shards are rebalanced).
    for host in site.hosts:
        workers = {r.worker for r in results if urlsplit(r.url).netloc == host}
        assert 1 <= counts[robots_url(host)] == len(workers) <= 2, (host, workers)

    # Lineage and placement.
    for record in results:
        assert record.depth == site.depths[record.url], record
        assert record.job == "default"
        assert record.shard == shard_of(host_of(record.url), SHARDS), record
        assert record.worker in ("local-1", "local-2"), record
        assert record.attempt == 1, record  # a fault-free run redelivers nothing
        if record.depth == 0:
            assert record.parent is None, record
        else:
            assert record.parent is not None, record
            assert by_url[record.parent].outcome == "fetched", record

    # The command's own report, and nothing left behind.
    assert finished.summary_count() == len(results)
    assert "duplicate results 0" in finished.stdout
    assert "dead letters 0" in finished.stdout
    assert f"results written to {tmp_path / 'out.jsonl'}" in finished.stdout
    # What it stored, logged once drained: a task and a result per URL, no dead letter, and
    # the seeds and the links messages (at most one a page that has links to send).
    stored = stored_messages_in(finished.stderr)
    assert stored, f"no stored-messages line in the log:\n{finished.stderr}"
    assert stored["CRAWL_TASKS"] == stored["CRAWL_RESULTS"] == len(results)
    assert stored["CRAWL_DEAD"] == 0
    linking = sum(1 for r in results if r.outlinks or r.redirect_to)
    assert len(site.seeds) < stored["CRAWL_FRONTIER"] <= len(site.seeds) + linking
    noisy = [line for line in finished.stderr.splitlines() if " INFO " not in line]
    assert noisy == [], finished.stderr
    assert finished.leftovers == []


async def test_with_the_extension_filter_off_binaries_are_requested_and_recorded_unread(
    tmp_path: Path, site: MultiHostSite
) -> None:
    """The setting switches the default list off crawl-wide: the PDFs and PNGs the default crawl
    never asks for (the test above) are requested once each, and recorded as skipped, their
    bodies not downloaded, since the default job reads HTML only."""
    env = {"JETCRAWL_IGNORED_EXTENSIONS": ""}
    finished = await crawl(tmp_path, *site.seeds, "--scope", "any", env=env)
    assert finished.returncode == 0, finished.explain()
    everything = site.expected(skip_binaries=False)
    results = finished.results()
    assert urls_of(results) == everything.reachable
    binaries = set(everything.fetchable) - site.fetchable
    assert binaries and all(site.kind(url) == "resource" for url in binaries)
    for record in results:
        if record.url not in binaries:
            assert record.outcome in ("fetched", "robots_disallowed"), record
            continue
        assert (record.outcome, record.status, record.length) == ("skipped", 200, 0), record
        assert record.content_type in ("application/pdf", "image/png"), record
        assert record.error is not None and record.error.kind == "unwanted_type", record
        assert record.payload_digest is None, record
    requested = site.request_counts
    assert all(requested[url] == 1 for url in binaries)
    assert f"skipped {len(binaries)}" in finished.stdout


@pytest.mark.parametrize(
    ("flags", "shards"),
    [((), 2), (("--shards", "5"), 5)],
    ids=["one per worker", "--shards"],
)
async def test_a_crawl_on_its_own_servers_has_a_shard_per_worker_unless_told(
    tmp_path: Path, site: MultiHostSite, flags: tuple[str, ...], shards: int
) -> None:
    args = ("--workers", "2", "--scope", "any", "--max-pages", "40", *flags)
    finished = await crawl(tmp_path, *site.seeds, *args, shards=None)  # no JETCRAWL_SHARDS
    assert finished.returncode == 0, finished.explain()
    results = finished.results()
    assert len(results) == 40
    owners: dict[int, set[str]] = {}
    for record in results:
        assert record.shard == shard_of(host_of(record.url), shards), record
        owners.setdefault(record.shard, set()).add(record.worker)
    assert all(len(workers) == 1 for workers in owners.values()), owners  # a shard, one owner
    if shards == 2 and len(owners) == 2:  # one each
        assert owners[0] != owners[1], owners


# ---------------------------------------------------------------- limits


async def test_max_depth_one_stops_one_link_from_the_seed(
    tmp_path: Path, site: MultiHostSite
) -> None:
    args = ("--workers", "2", "--scope", "any", "--max-depth", "1")
    finished = await crawl(tmp_path, *site.seeds, *args)
    assert finished.returncode == 0, finished.explain()

    results = finished.results()
    expected = site.expected(site.seeds, "any", max_depth=1).reachable
    assert expected == site.reachable_within(1)
    assert expected < site.reachable  # the limit does cut the crawl
    assert urls_of(results) == expected
    assert {r.url: r.depth for r in results} == {url: site.depths[url] for url in expected}
    assert finished.summary_count() == len(results)


async def test_scope_host_keeps_each_seed_on_its_host(tmp_path: Path, site: MultiHostSite) -> None:
    seeds = site.base_urls  # one root per host; links between the hosts abound
    finished = await crawl(tmp_path, *seeds, "--workers", "2", "--scope", "host")
    assert finished.returncode == 0, finished.explain()

    results = finished.results()
    expected = site.expected(seeds, "host").reachable
    assert expected < site.expected(seeds, "any").reachable
    assert urls_of(results) == expected
    for record in results:
        if record.parent is not None:
            assert urlsplit(record.parent).netloc == urlsplit(record.url).netloc, record


async def test_max_pages_holds_across_the_mesh(tmp_path: Path, site: MultiHostSite) -> None:
    limit = 20
    assert len(site.reachable) > 5 * limit
    args = ("--workers", "2", "--scope", "any", "--max-pages", str(limit))
    finished = await crawl(tmp_path, *site.seeds, *args)
    assert finished.returncode == 0, finished.explain()

    results = finished.results()
    urls = urls_of(results)
    assert len(results) == limit  # admissions are reserved before the seen marks: no overshoot
    assert urls <= site.reachable
    assert set(site.seeds) <= urls
    assert finished.summary_count() == limit
    # Only admitted URLs were fetched, each once.
    robots = {robots_url(host) for host in site.hosts}
    fetched = {r.url for r in results if r.outcome == "fetched"}
    counts = site.request_counts
    assert {url: n for url, n in counts.items() if url not in robots} == dict.fromkeys(fetched, 1)


# ---------------------------------------------------------------- stopping


@pytest.mark.parametrize("fork", [True, False])
async def test_services_are_forked_from_the_command_unless_told(tmp_path: Path, fork: bool) -> None:
    env = {} if fork else {"JETCRAWL_LOCAL_FORK": "false"}
    async with EndlessSite() as site, Crawl(tmp_path, site.seed, env=env) as running:
        await running.until(lambda: site.page_requests >= 20, CRAWL_TIMEOUT_S, "crawling")
        services = [p for p in running.all_services() if p.kind in ("dispatcher", "worker")]
        # Forked: the command's own command line, named jc-<role>. Spawned: `-m jetcrawl <role>`.
        assert all(p.comm.startswith(NAME_PREFIX) == fork for p in services), services
        assert all((p.argv == running.proc_argv()) == fork for p in services), services
        # Its servers are sized to it: one Go thread each for two workers (unless told).
        servers = [p for p in running.all_services() if p.kind in ("nats-server", "etcd")]
        threads = os.environ.get("GOMAXPROCS", "1")
        assert [environ(p.pid).get("GOMAXPROCS") for p in servers] == [threads, threads]
        running.interrupt()
        finished = await running.finish(STOP_WITHIN_S)
        assert finished.returncode == 130, finished.explain()


@pytest.mark.parametrize("target", ["process", "process group"])
async def test_ctrl_c_stops_every_service(tmp_path: Path, target: str) -> None:
    async with (
        EndlessSite() as site,
        Crawl(
            tmp_path, site.seed, "--workers", "2", new_session=target == "process group"
        ) as running,
    ):
        await running.until(lambda: site.page_requests >= 100, CRAWL_TIMEOUT_S, "crawling")
        services = running.all_services()

        # On Python 3.11 asyncio.wait_for (under nats-py's fetch and requests) may swallow the
        # cancellation that Ctrl-C is: then the command hangs, or fails with "exited early".
        running.interrupt()
        finished = await running.finish(INTERRUPTED_WITHIN_S)
        assert finished.returncode == 130, finished.explain()
        assert "interrupted" in finished.stderr
        await settle(lambda: not any(p.alive() for p in services), GONE_WITHIN_S)
        assert [p for p in services if p.alive()] == []

        finished.results()  # what was written is whole records
        assert finished.leftovers == []


async def test_ctrl_c_while_the_crawl_connects_stops_it_at_once(tmp_path: Path) -> None:
    # A --nats server that accepts and never speaks: the connect would wait out its timeout.
    async with (
        RawServer(b"", hang=True) as silent,
        Crawl(
            tmp_path,
            "http://a.test/",
            *("--nats", f"nats://127.0.0.1:{silent.port}", "--connect-timeout", "60"),
        ) as running,
    ):
        await asyncio.wait_for(silent.connected.wait(), CRAWL_TIMEOUT_S)
        running.interrupt()
        finished = await running.finish(INTERRUPTED_WITHIN_S)
    assert finished.returncode == 130, finished.explain()
    assert "interrupted" in finished.stderr and "Traceback" not in finished.stderr
    assert finished.leftovers == []


async def test_second_ctrl_c_during_shutdown_leaves_no_service_behind(tmp_path: Path) -> None:
    # Fetches that never answer keep a worker draining for JETCRAWL_DRAIN_DEADLINE_S after the
    # first Ctrl-C; the second one comes while the command waits for it.
    drain = {"JETCRAWL_DRAIN_DEADLINE_S": "8"}
    async with (
        EndlessSite(hang=True) as site,
        Crawl(tmp_path, site.seed, "--workers", "2", env=drain) as running,
    ):
        await running.until(lambda: site.page_requests >= 1, CRAWL_TIMEOUT_S, "crawling")
        services = running.all_services()
        dispatcher = next(p for p in services if p.kind == "dispatcher")

        running.interrupt()
        await running.until(lambda: not dispatcher.alive(), STOP_WITHIN_S, "stopping")
        if not any(p.alive() for p in services if p.kind == "worker"):
            pytest.fail("the workers stopped too fast to interrupt their shutdown")
        running.interrupt()
        finished = await running.finish(STOP_WITHIN_S)
        assert finished.returncode == 130, finished.explain()
        assert [p for p in services if p.alive()] == []  # all stopped before the command ends


async def test_killed_command_leaves_no_service_behind(tmp_path: Path) -> None:
    async with (
        EndlessSite() as site,
        Crawl(tmp_path, site.seed, "--workers", "2") as running,
    ):
        await running.until(lambda: site.page_requests >= 20, CRAWL_TIMEOUT_S, "crawling")
        services = running.all_services()

        running.proc.kill()
        await running.proc.wait()
        await settle(lambda: not any(p.alive() for p in services), KILLED_GONE_WITHIN_S)
        assert [p for p in services if p.alive()] == []


# ---------------------------------------------------------------- failures


async def test_a_service_that_keeps_dying_fails_the_crawl(tmp_path: Path) -> None:
    # Every worker is killed as soon as it is seen, its restarts too: after MAX_RESTARTS the
    # crawl gives up, says which service and why, and stops the others.
    async with EndlessSite() as site, Crawl(tmp_path, site.seed, "--workers", "1") as running:

        def kill_workers_until_it_ends() -> bool:
            for service in running.services():
                if service.kind == "worker":
                    service.kill()
            return running.proc.returncode is not None

        await running.until(kill_workers_until_it_ends, CRAWL_TIMEOUT_S, "giving up")
        finished = await running.finish()
    assert finished.returncode == 2, finished.explain()  # like every other JetcrawlError
    assert re.search(
        rf"worker-1 exited early with code -9, after {MAX_RESTARTS} restarts", finished.stderr
    ), finished.explain()
    assert finished.stderr.count("worker-1 started again") == MAX_RESTARTS
    assert "crawled" not in finished.stdout and "Traceback" not in finished.stderr
    assert finished.leftovers == []


@pytest.mark.parametrize("victim", ["worker", "dispatcher"])
async def test_a_service_killed_mid_crawl_is_started_again_and_nothing_is_lost(
    tmp_path: Path,
    nats_server: NatsServer,
    etcd_server: EtcdServer,
    js: JetStreamContext,
    victim: str,
) -> None:
    # The mesh's own servers are the test's, so that the ledger can be read after the crawl.
    quick = {
        "JETCRAWL_HOST_DELAY_S": "0.02",
        "JETCRAWL_LEASE_TTL_S": "2",
        "JETCRAWL_ACK_WAIT_S": "2",
        "JETCRAWL_DUPLICATE_WINDOW_S": "600",
    }
    servers = ("--nats", nats_server.url, "--etcd", etcd_server.url)
    async with (
        MultiHostSite(seed=7, hosts=3, pages_per_host=80) as site,
        Crawl(tmp_path, *site.seeds, "--scope", "any", *servers, env=quick) as running,
    ):

        def results_so_far() -> int:
            return len(running.output.read_bytes().splitlines()) if running.output.exists() else 0

        await running.until(lambda: results_so_far() >= 20, CRAWL_TIMEOUT_S, "crawling")
        [killed, *_] = [p for p in running.services() if p.kind == victim]
        killed.kill()
        finished = await running.finish()
    assert finished.returncode == 0, finished.explain()
    assert re.search(rf"{victim}(-\d)? exited with code -9; starting it again", finished.stderr)
    assert "services restarted 1" in finished.stdout, finished.explain()
    ledger = await read_ledger(js)
    print(ledger.summary())
    assert (ledger.lost, ledger.unexpected, ledger.duplicates) == (frozenset(), frozenset(), 0)
    assert len(ledger.admitted) == finished.summary_count() > 100


async def test_unknown_setting_is_named_and_nothing_starts(tmp_path: Path) -> None:
    finished = await crawl(tmp_path, "http://127.0.0.1:9/", env={"JETCRAWL_FOO": "1"})
    assert finished.returncode != 0
    assert "JETCRAWL_FOO" in finished.stderr, finished.explain()
    assert "Traceback" not in finished.stderr
    assert finished.stdout == ""
    assert finished.leftovers == []


async def test_more_partitions_than_a_local_crawl_has_shards_is_named_and_nothing_starts(
    tmp_path: Path,
) -> None:
    args = ("http://127.0.0.1:9/", "--workers", "2", "--set", "partitions=3")
    finished = await crawl(tmp_path / "refused", *args, shards=None)
    assert finished.returncode == 2, finished.explain()
    assert "setting partitions" in finished.stderr and "--workers N" in finished.stderr
    assert "started nats-server" not in finished.stderr, "refused before any server starts"
    assert finished.leftovers == []
    # Shards chosen with --set are the crawl's, as with --shards (the seed cannot be fetched)
    finished = await crawl(tmp_path / "chosen", *args, "--set", "shards=3", shards=None)
    assert finished.returncode == EXIT_NOTHING_FETCHED, finished.explain()
    assert "CRAWL_TASKS_2" in finished.stderr, finished.explain()


async def test_missing_seed_is_a_usage_error(tmp_path: Path) -> None:
    finished = await crawl(tmp_path)
    assert finished.returncode == 2
    assert finished.stderr.startswith("usage: jetcrawl crawl"), finished.explain()
    assert "SEED" in finished.stderr
    assert finished.leftovers == []


@pytest.mark.parametrize(
    "flags", [("--workers", "0"), ("--max-pages", "0"), ("--max-depth", "-1")], ids=str
)
async def test_nonsense_limits_are_usage_errors(tmp_path: Path, flags: tuple[str, str]) -> None:
    finished = await crawl(tmp_path, "http://127.0.0.1:9/", *flags)
    assert finished.returncode == 2, finished.explain()
    assert flags[0] in finished.stderr and "usage:" in finished.stderr
    assert finished.leftovers == []


async def test_a_crawl_whose_seed_is_no_url_fails_before_it_starts_and_says_why(
    tmp_path: Path,
) -> None:
    finished = await crawl(tmp_path, "javascript:alert(1)", "--workers", "1")
    assert finished.returncode == 2, finished.explain()
    assert finished.stderr.strip() == (
        "jetcrawl: seed 'javascript:alert(1)': not a URL jetcrawl can crawl (unsupported_scheme)"
    )
    assert finished.stdout == "" and finished.leftovers == []


# ---------------------------------------------------------------- sizing


@pytest.mark.parametrize(
    ("workers", "cores", "threads"), [(1, 2, 1), (4, 2, 1), (5, 2, 2), (9, 2, 2), (9, 8, 3)]
)
def test_the_crawls_nats_server_gets_a_thread_per_four_workers(
    workers: int, cores: int, threads: int
) -> None:
    assert nats_threads(workers, cores) == threads
