"""What each ``jetcrawl`` subcommand does; the parser (:mod:`jetcrawl.cli.parser`) names them.

Each takes the parsed arguments and returns the exit status. Heavy modules are imported inside
the command that needs them, so a short command loads only its own.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from jetcrawl.cli.runtime import (
    STOP_GRACE_S,
    cancel_on_signals,
    on_signals,
    run_async,
    tune_gc,
)
from jetcrawl.cli.services import run_dispatcher, run_renderer, run_sink, run_worker
from jetcrawl.cli.settings import settings_from
from jetcrawl.contract.errors import UrlError, UsageError
from jetcrawl.contract.fetchpolicy import FetchPolicy
from jetcrawl.contract.settings import ENV_PREFIX, Settings, parse_assignments

# Exit statuses of `jetcrawl crawl` (README, "Exit status"): 0 a crawl that fetched pages, 1 one
# that fetched none (its last lines say why), 2 bad input or a server or service that failed,
# 130 interrupted.
EXIT_NOTHING_FETCHED = 1

if TYPE_CHECKING:
    from jetcrawl.local.services import Entry, Prefork


def cmd_topology(args: argparse.Namespace) -> int:
    from jetcrawl.contract.topology import as_cli_json

    if args.apply:
        settings = settings_from(args)
        return int(run_async(lambda: _until_signalled(apply_topology(settings))))
    doc = as_cli_json(settings_from(args))
    if args.write is None:
        sys.stdout.buffer.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
        return 0
    out: Path = args.write
    out.mkdir(parents=True, exist_ok=True)
    for name, config in doc["streams"].items():
        path = out / f"stream-{name}.json"
        path.write_bytes(orjson.dumps(config, option=orjson.OPT_INDENT_2))
        print(f"nats stream add {name} --config {path}")
    for entry in doc["consumers"].values():
        stream, name = entry["stream"], entry["config"]["durable_name"]
        path = out / f"consumer-{stream}-{name}.json"
        path.write_bytes(orjson.dumps(entry["config"], option=orjson.OPT_INDENT_2))
        print(f"nats consumer add {stream} {name} --config {path}")
    return 0


async def apply_topology(settings: Settings) -> int:
    """Create or update the topology, whatever ``create_topology`` says: that is what it is for."""
    from jetcrawl.contract.topology import Topology
    from jetcrawl.plumbing.bus import connect
    from jetcrawl.plumbing.leaders import spread_leaders
    from jetcrawl.plumbing.topology import ensure

    settings = settings.replace(create_topology=True)
    nc = await connect(settings, "jetcrawl-topology", give_up_s=settings.command_timeout_s)
    try:
        await ensure(nc.jetstream(), settings)
        await spread_leaders(nc, settings.partitions)
    finally:
        await nc.close()
    topology = Topology.from_settings(settings)
    print(
        f"topology applied: {len(topology.streams)} streams, "
        f"{len(topology.consumers)} consumers, {settings.shards} shards"
    )
    return 0


def cmd_dispatcher(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    run_async(lambda: run_dispatcher(settings))
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    run_async(lambda: run_worker(settings))
    return 0


def cmd_renderer(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    check_can_render(settings)
    run_async(lambda: run_renderer(settings))
    return 0


def check_can_render(settings: Settings) -> None:
    """Raise ``UsageError`` unless this install can render: Playwright (the ``render`` extra)
    importable and ``chromium_path`` a program this user may run."""
    try:
        import playwright  # noqa: F401  only whether it is installed
    except ImportError:
        raise UsageError(
            "render", "rendering needs Playwright: pip install 'jetcrawl[render]'"
        ) from None
    if not os.access(settings.chromium_path, os.X_OK):
        raise UsageError(
            "chromium_path",
            f"{settings.chromium_path} is not an executable Chromium "
            "(apt-get install chromium, or set chromium_path)",
        )


def cmd_status(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    return int(run_async(lambda: _status(settings, args)))


def cmd_crawl(args: argparse.Namespace) -> int:
    """``args.entry`` is the CLI's main: what the crawl's forked services run."""
    check_crawl_input(args.seeds, args.output)  # before any server or service starts
    settings = settings_from(args)
    if FetchPolicy.from_settings(settings).may_render:
        check_can_render(settings)
    with _prefork(settings, args.workers, args.entry) as prefork:
        return int(run_async(lambda: _crawl(settings, args, prefork)))


def cmd_results(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    return int(run_async(lambda: _results(settings, args)))


def cmd_dlq(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    return int(run_async(lambda: _dlq(settings, args)))


async def _status(settings: Settings, args: argparse.Namespace) -> int:
    from jetcrawl.ops.status import run_status as show

    cancel_on_signals()
    try:
        await show(
            settings, watch_s=args.watch, interval_s=args.interval, as_json=args.json, job=args.job
        )
    except asyncio.CancelledError:
        return 0 if args.watch is not None else 130
    return 0


def check_crawl_input(seeds: list[str], output: Path | None) -> None:
    """Raise ``UsageError`` for a seed that is no crawlable URL or an output that cannot be
    written, so that a typo costs one line and nothing else."""
    from jetcrawl.contract.messages import SeedReject, decode_seeds
    from jetcrawl.contract.urls import canonicalize

    for seed in seeds:
        url = seed
        if seed.startswith("{"):  # a seed object, as crawl.seeds takes it: {"url", "priority"...}
            [read] = decode_seeds(seed.encode()) or [SeedReject("empty", "no seed", "")]
            if isinstance(read, SeedReject):
                raise UsageError(f"seed {seed[:80]!r}", f"{read.reason}: {read.detail}")
            url = read.url
        try:
            canonicalize(url)
        except UrlError as e:
            raise UsageError(f"seed {seed!r}", f"not a URL jetcrawl can crawl ({e.reason})") from e
    if output is None:
        return
    where = output.parent.resolve()
    if output.is_dir():
        raise UsageError(f"--output {output}", "is a directory; name a file")
    if not where.is_dir():
        raise UsageError(f"--output {output}", f"no such directory: {where}")
    if not os.access(where, os.W_OK) or (output.exists() and not os.access(output, os.W_OK)):
        raise UsageError(f"--output {output}", "not writable")


def _prefork(
    settings: Settings, workers: int, entry: Entry
) -> contextlib.AbstractContextManager[Prefork | None]:
    """The crawl's services forked now, before the event loop, where ``local_fork`` and the
    platform allow (see :mod:`jetcrawl.local.services`); else nothing, and they are spawned."""
    if not settings.local_fork:
        return contextlib.nullcontext()
    from jetcrawl.local.services import Prefork

    prefork = Prefork.start(["dispatcher", *["worker"] * workers], entry)
    return prefork if prefork is not None else contextlib.nullcontext()


async def _crawl(
    settings: Settings, args: argparse.Namespace, prefork: Prefork | None = None
) -> int:
    from jetcrawl.local.crawl import CrawlRequest, Interrupt, Interrupted, crawl
    from jetcrawl.ops.export import format_for

    tune_gc()

    request = CrawlRequest(
        seeds=tuple(args.seeds),
        workers=args.workers,
        output=args.output,
        format=format_for(args.output),
        max_depth=args.max_depth,
        scope=args.scope,
        job=args.job,
        local_shards=None if _shards_chosen(args) else args.workers,
    )
    interrupt = Interrupt()
    on_signals(interrupt)
    try:
        summary = await crawl(settings, request, interrupt, prefork)
    except Interrupted:
        print("jetcrawl: interrupted; every service was stopped", file=sys.stderr)
        return 130
    print(summary.line())
    causes = summary.cause_lines()
    if causes:
        print("no page from:" if summary.fetched == 0 else "URLs without a page, by cause:")
        for line in causes:
            print(f"  {line}")
    if args.output:
        print(f"results written to {args.output}")
    if summary.fetched == 0:
        why = causes[0] if causes else "no URL was admitted (see the dead letters above)"
        print(f"jetcrawl: no page was fetched: {why}", file=sys.stderr)
        return EXIT_NOTHING_FETCHED
    return 0


def _shards_chosen(args: argparse.Namespace) -> bool:
    chosen_by_set = "shards" in parse_assignments(args.assignments or [])
    return args.shards is not None or chosen_by_set or f"{ENV_PREFIX}SHARDS" in os.environ


def cmd_sink(args: argparse.Namespace) -> int:
    from jetcrawl.contract.messages import JOB_RE
    from jetcrawl.sinks.plugins import Unusable

    plugin = args.sink_plugin
    if isinstance(plugin, Unusable):
        raise UsageError(f"sink {plugin.name} ({plugin.target})", plugin.problem)
    if args.job is not None and not JOB_RE.match(args.job):
        raise UsageError(f"--job {args.job!r}", f"a job name matches {JOB_RE.pattern}")
    settings = settings_from(args)
    sink = plugin.create(args, settings)
    run_async(
        lambda: run_sink(settings, sink, plugin.kinds, args.sink_name, args.job, args.consumer)
    )
    return 0


async def _results(settings: Settings, args: argparse.Namespace) -> int:
    from jetcrawl.ops.results import Query, export_results, parse_since

    if args.items:
        return await _items(settings, args)

    query = Query(
        job=args.job,
        since=parse_since(args.since) if args.since else None,
        follow=args.follow,
    )
    stop = asyncio.Event()  # an event, not a cancellation: see jetcrawl.local.interrupt.Interrupt
    on_signals(stop.set, grace_s=STOP_GRACE_S)
    written, skipped = await export_results(settings, query, args.output, args.format, stop)
    print(f"{written} records written, {skipped} without a WARC form skipped", file=sys.stderr)
    return 130 if stop.is_set() and not args.follow else 0


async def _items(settings: Settings, args: argparse.Namespace) -> int:
    from jetcrawl.ops.items import export_items

    if args.since or args.follow:
        raise UsageError("--items", "exports every stored item: no --since or --follow")
    stop = asyncio.Event()
    on_signals(stop.set, grace_s=STOP_GRACE_S)
    written, read = await export_items(settings, args.job, args.output, args.format, stop)
    print(f"{written} items written ({read} messages read)", file=sys.stderr)
    return 130 if stop.is_set() else 0


async def _dlq(settings: Settings, args: argparse.Namespace) -> int:
    from jetcrawl.ops.dlq import run_command

    return await _until_signalled(
        run_command(
            settings, args.dlq_action, args.stage, args.reason, getattr(args, "json", False)
        )
    )


def cmd_job(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    return int(run_async(lambda: _job(settings, args)))


async def _job(settings: Settings, args: argparse.Namespace) -> int:
    from jetcrawl.ops.control import ACTIONS, run_control

    if args.job_action in ACTIONS:
        return await _until_signalled(run_control(settings, args.job_action, args.name))
    from jetcrawl.ops.jobs import run_command

    return await _until_signalled(
        run_command(
            settings,
            args.job_action,
            file=getattr(args, "file", None),
            name=getattr(args, "name", None),
            version=getattr(args, "version", None),
            versions=getattr(args, "versions", None),
        )
    )


async def _until_signalled(command: Awaitable[int]) -> int:
    """``command``'s exit status, or 130 when Ctrl-C or SIGTERM cancelled it."""
    cancel_on_signals()
    try:
        return await command
    except asyncio.CancelledError:
        return 130
