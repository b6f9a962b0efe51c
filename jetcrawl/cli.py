"""The ``jetcrawl`` command: the composition root of every service.

jetcrawl topology    print the JetStream definitions for the nats CLI
jetcrawl dispatcher  run a dispatcher (frontier -> sharded tasks)
jetcrawl status      the mesh now: workers, shard owners, backlogs, results, rates
jetcrawl dlq         list or replay dead letters
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib.util
import logging
import os
import secrets
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import orjson

from jetcrawl import __version__
from jetcrawl.contract.errors import JetcrawlError
from jetcrawl.contract.settings import ENV_PREFIX, Settings

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from jetcrawl.local.services import Prefork
    from jetcrawl.plumbing.health import Readiness

log = logging.getLogger("jetcrawl")


# ---------------------------------------------------------------- arguments


def _connection_flags(p: argparse.ArgumentParser, etcd: bool = False) -> None:
    p.add_argument("--nats", dest="nats_url", help="NATS server URL(s), comma-separated")
    if etcd:
        p.add_argument("--etcd", dest="etcd_url", help="etcd endpoint, http://host:port")
        p.add_argument("--cluster", help="name of this crawl cluster in etcd")
    p.add_argument(
        "--shards", type=positive, help="shard count (fixed when the topology is created)"
    )


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jetcrawl", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"jetcrawl {__version__}")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("topology", help="print stream and consumer definitions as JSON")
    p.add_argument("--shards", type=int, help="shard count")
    p.add_argument(
        "--apply",
        action="store_true",
        help="create or update them on the server instead (as a NATS user that may)",
    )
    p.add_argument("--nats", dest="nats_url", help="NATS server URL(s) for --apply")
    p.add_argument(
        "--write",
        metavar="DIR",
        type=Path,
        help="write one --config file per stream and consumer into DIR and print the nats commands",
    )

    p = sub.add_parser("dispatcher", help="run a dispatcher")
    _connection_flags(p)
    _metrics_flag(p)

    p = sub.add_parser("worker", help="run a worker")
    _connection_flags(p, etcd=True)
    p.add_argument("--id", dest="worker_id", help="worker id (default: host-pid-random)")
    p.add_argument("--concurrency", type=positive, help="tasks in flight at most")
    _crawl_limits(p)
    _metrics_flag(p)

    p = sub.add_parser("status", help="show workers, shards, backlogs, results and rates")
    _connection_flags(p, etcd=True)
    p.add_argument("--job", help="also count this job's results by outcome (reads them all)")
    p.add_argument(
        "--watch",
        nargs="?",
        const=2.0,
        type=float,
        metavar="SECONDS",
        help="show it again every SECONDS (default 2) until interrupted",
    )
    p.add_argument(
        "--interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="without --watch: measure rates over this long (default 1; 0: no rates)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object (per line with --watch)")

    p = sub.add_parser("crawl", help="crawl on one machine and write the results")
    p.add_argument("seeds", nargs="+", metavar="SEED", help="start URL(s)")
    _connection_flags(p, etcd=True)
    p.add_argument("--workers", type=positive, default=2, help="worker processes (default 2)")
    p.add_argument("--concurrency", type=positive, help="tasks in flight per worker")
    p.add_argument("--max-pages", dest="max_pages", type=positive, help="admit at most N URLs")
    p.add_argument(
        "--max-depth", dest="max_depth", type=non_negative, help="link depth from the seeds"
    )
    p.add_argument("--scope", choices=["host", "domain", "any"], help="default: host")
    p.add_argument("--job", help="job name for the seeds (default: default)")
    p.add_argument("--output", type=Path, help="write one JSON line per result here")
    _crawl_limits(p)
    _results_parser(sub)
    _dlq_parser(sub)
    return parser


def _dlq_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("dlq", help="list or replay dead letters (CRAWL_DEAD)")
    actions = p.add_subparsers(dest="dlq_action", required=True, metavar="ACTION")
    for name, text in [("list", "show dead letters"), ("replay", "send them back, then drop them")]:
        a = actions.add_parser(name, help=text)
        a.add_argument("--nats", dest="nats_url", help="NATS server URL(s), comma-separated")
        a.add_argument("--stage", help="only this stage: seeds, discovered, task, fetch, poison")
        a.add_argument("--reason", help="only this reason (max_deliveries, retries_exhausted, ...)")
        if name == "list":
            a.add_argument("--json", action="store_true", help="one JSON object per line")


def _results_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("results", help="export results as JSON lines or WARC")
    _connection_flags(p)
    p.add_argument("--job", help="only this job's results")
    p.add_argument("--since", help="from this time on: ISO 8601, or a duration back (15m, 2h)")
    p.add_argument("--follow", action="store_true", help="keep writing results as they arrive")
    p.add_argument("--format", choices=["jsonl", "warc"], help="default: from the file name")
    p.add_argument("-o", "--output", type=Path, help="write here (default: standard output)")


def _metrics_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--metrics-port",
        dest="metrics_port",
        type=int,
        metavar="PORT",
        help="serve /metrics, /healthz and /readyz on this port (default 0: off)",
    )


def _crawl_limits(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--allow-net",
        dest="allow_nets",
        action="append",
        metavar="CIDR",
        help="let the crawl reach this private or loopback network (repeatable)",
    )


FLAG_SETTINGS = (
    "nats_url",
    "etcd_url",
    "cluster",
    "shards",
    "worker_id",
    "concurrency",
    "max_pages",
    "metrics_port",
)


def settings_from(args: argparse.Namespace, **extra: Any) -> Settings:
    flags = {n: getattr(args, n) for n in FLAG_SETTINGS if getattr(args, n, None) is not None}
    if getattr(args, "allow_nets", None):
        flags["allow_nets"] = tuple(args.allow_nets)
    return Settings.from_env(**flags, **extra)


# ---------------------------------------------------------------- commands


def cmd_topology(args: argparse.Namespace) -> int:
    from jetcrawl.contract.topology import as_cli_json

    if args.apply:
        return int(run_async(lambda: apply_topology(settings_from(args))))
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
    from jetcrawl.plumbing.topology import ensure

    settings = settings.replace(create_topology=True)
    nc = await connect(settings, "jetcrawl-topology")
    try:
        await ensure(nc.jetstream(), settings)
    finally:
        await nc.close()
    topology = Topology.from_settings(settings)
    print(
        f"topology applied: {len(topology.streams)} streams, "
        f"{len(topology.consumers)} consumers, {settings.shards} shards"
    )
    return 0


# The services allocate many short-lived containers per page (messages, results, link lists).
# With CPython's default (a young collection every 700 net allocations) the worker spent ~8% of
# its CPU in the cycle collector, much of it walking long-lived objects again: 786 young, 72
# middle and 6 full collections, 0.96 s of 12 s, in a 10,000-page bench run. What exists once a
# service has imported its code is frozen out of collection, and young collections run every
# 10,000 allocations: 19 collections, 0.10 s, in the same run.
GC_THRESHOLDS = (10_000, 20, 20)


def _tune_gc() -> None:
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


async def run_dispatcher(settings: Settings) -> None:
    from jetcrawl.dispatcher import Dispatcher
    from jetcrawl.otel import DISPATCHER_SERVICE, setup_tracing
    from jetcrawl.plumbing.health import Readiness, nats_ready
    from jetcrawl.plumbing.metrics import DispatcherMetrics

    _tune_gc()

    instance = default_worker_id()
    tracing = setup_tracing(DISPATCHER_SERVICE, instance, __version__)
    metrics = DispatcherMetrics(DISPATCHER_SERVICE, __version__, instance)
    readiness = Readiness()
    try:
        async with (
            _endpoint(settings, metrics.registry, readiness),
            Dispatcher(settings, tracing) as dispatcher,
        ):
            metrics.bind(dispatcher)
            readiness.add("nats", nats_ready(dispatcher.nc, settings))
            _on_signals(dispatcher.stop)
            log.info("dispatcher running (nats %s, %d shards)", settings.nats_url, settings.shards)
            await dispatcher.run()
        log.info("dispatcher stopped: %s", dispatcher.stats)
    finally:
        await asyncio.to_thread(tracing.shutdown)


async def run_worker(settings: Settings) -> None:
    from jetcrawl.otel import WORKER_SERVICE, setup_tracing
    from jetcrawl.plumbing.health import Readiness, nats_ready, registry_ready
    from jetcrawl.plumbing.metrics import WorkerMetrics
    from jetcrawl.registry import Registry, WorkerInfo
    from jetcrawl.worker import Worker

    _tune_gc()

    worker_id = settings.worker_id or default_worker_id()
    tracing = setup_tracing(WORKER_SERVICE, worker_id, __version__)
    # Pages are counted and timed only for a /metrics that someone can read (~5 us a page).
    metrics = (
        WorkerMetrics(WORKER_SERVICE, __version__, worker_id) if settings.metrics_port else None
    )
    readiness = Readiness()
    stopping = asyncio.Event()
    try:
        async with (
            _endpoint(settings, metrics.registry if metrics else None, readiness),
            Worker(settings, worker_id, tracing, metrics) as worker,
            asyncio.TaskGroup() as tg,
        ):
            if metrics is not None:
                metrics.bind(worker)
            readiness.add("nats", nats_ready(worker.nc, settings))
            tg.create_task(worker.run())
            await worker.wait_running()
            info = WorkerInfo.local(worker_id, capacity=settings.concurrency)
            async with Registry(settings, info, worker) as registry:
                readiness.add("etcd", registry_ready(registry))
                _on_signals(stopping.set)
                log.info("worker %s running (etcd %s)", worker_id, settings.etcd_url)
                await stopping.wait()
                log.info("worker %s stopping: releasing shards", worker_id)
            worker.stop()  # the registry has drained and released every shard, revoked the lease
        log.info("worker %s stopped: %s", worker_id, worker.stats)
    finally:
        await asyncio.to_thread(tracing.shutdown)


def _endpoint(
    settings: Settings, registry: CollectorRegistry | None, readiness: Readiness
) -> contextlib.AbstractAsyncContextManager[object]:
    """The service's /metrics, /healthz and /readyz, when ``metrics_port`` is set."""
    if not settings.metrics_port or registry is None:
        return contextlib.nullcontext()
    from jetcrawl.plumbing.endpoint import Endpoint  # not before: it loads aiohttp's server

    return Endpoint(settings.metrics_port, registry, readiness)


async def run_status(settings: Settings, args: argparse.Namespace) -> int:
    from jetcrawl.ops.status import run_status as show

    task = asyncio.current_task()
    assert task is not None
    _on_signals(task.cancel)
    try:
        await show(
            settings, watch_s=args.watch, interval_s=args.interval, as_json=args.json, job=args.job
        )
    except asyncio.CancelledError:
        return 0 if args.watch is not None else 130
    return 0


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def _prefork(settings: Settings, workers: int) -> contextlib.AbstractContextManager[Prefork | None]:
    """The crawl's services forked now, before the event loop, where ``local_fork`` and the
    platform allow (see :mod:`jetcrawl.local.services`); else nothing, and they are spawned."""
    if not settings.local_fork:
        return contextlib.nullcontext()
    from jetcrawl.local.services import Prefork

    prefork = Prefork.start(["dispatcher", *["worker"] * workers], main)
    return prefork if prefork is not None else contextlib.nullcontext()


async def run_crawl(
    settings: Settings, args: argparse.Namespace, prefork: Prefork | None = None
) -> int:
    from jetcrawl.local.crawl import CrawlRequest, Interrupt, Interrupted, crawl
    from jetcrawl.ops.export import format_for

    _tune_gc()

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
    _on_signals(interrupt)
    try:
        summary = await crawl(settings, request, interrupt, prefork)
    except Interrupted:
        print("jetcrawl: interrupted; every service was stopped", file=sys.stderr)
        return 130
    print(summary.line())
    if args.output:
        print(f"results written to {args.output}")
    if summary.results == 0 and summary.dead_letters:
        print("jetcrawl: no seed was accepted (see the dead letters above)", file=sys.stderr)
        return 2
    return 0


def _shards_chosen(args: argparse.Namespace) -> bool:
    return args.shards is not None or f"{ENV_PREFIX}SHARDS" in os.environ


async def run_results(settings: Settings, args: argparse.Namespace) -> int:
    from jetcrawl.ops.results import Query, export_results, parse_since

    query = Query(
        job=args.job,
        since=parse_since(args.since) if args.since else None,
        follow=args.follow,
    )
    stop = asyncio.Event()  # an event, not a cancellation: see jetcrawl.local.crawl.Interrupt
    _on_signals(stop.set)
    written, skipped = await export_results(settings, query, args.output, args.format, stop)
    print(f"{written} records written, {skipped} without a WARC form skipped", file=sys.stderr)
    return 130 if stop.is_set() and not args.follow else 0


async def run_dlq(settings: Settings, args: argparse.Namespace) -> int:
    from jetcrawl.ops.dlq import run_command

    return await run_command(
        settings, args.dlq_action, args.stage, args.reason, getattr(args, "json", False)
    )


# ---------------------------------------------------------------- plumbing


def _on_signals(stop: Callable[[], object]) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)


def run_async(main: Callable[[], Awaitable[Any]]) -> Any:
    try:
        import uvloop

        return uvloop.run(main())  # type: ignore[arg-type]
    except ImportError:
        return asyncio.run(main())  # type: ignore[arg-type]


class _DeferredImport:
    """A ``sys.meta_path`` finder for one top-level module that gives it a ``LazyLoader``: the
    module is loaded when first used, not when first imported. (Not an ``importlib.abc``
    subclass: importing that costs ~10 ms, for a protocol of one method.)"""

    def __init__(self, name: str) -> None:
        self._name = name

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != self._name:
            return None
        sys.meta_path.remove(self)  # its job is done: find the real spec without it
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = importlib.util.LazyLoader(spec.loader)
        return spec


def defer_aiohttp() -> None:
    """Load aiohttp when it is first used, not when nats-py imports it.

    nats-py imports aiohttp as it loads, for a websocket transport jetcrawl does not use; that
    cost every ``jetcrawl`` process ~0.14 s of CPU (a third of a dispatcher's start-up, most of
    a short command's). Only the processes that use it load it now: a worker (its HTTP client)
    and a service serving ``metrics_port``.
    """
    if "aiohttp" in sys.modules or any(isinstance(f, _DeferredImport) for f in sys.meta_path):
        return  # imported already, or deferred by an earlier call
    sys.meta_path.insert(0, _DeferredImport("aiohttp"))


def main(argv: Sequence[str] | None = None) -> int:
    defer_aiohttp()
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        if args.command == "topology":
            return cmd_topology(args)
        if args.command == "dispatcher":
            settings = settings_from(args)
            run_async(lambda: run_dispatcher(settings))
            return 0
        if args.command == "worker":
            settings = settings_from(args)
            run_async(lambda: run_worker(settings))
            return 0
        if args.command == "results":
            settings = settings_from(args)
            return int(run_async(lambda: run_results(settings, args)))
        if args.command == "crawl":
            settings = settings_from(args)
            with _prefork(settings, args.workers) as prefork:
                return int(run_async(lambda: run_crawl(settings, args, prefork)))
        if args.command == "status":
            settings = settings_from(args)
            return int(run_async(lambda: run_status(settings, args)))
        if args.command == "dlq":
            settings = settings_from(args)
            return int(run_async(lambda: run_dlq(settings, args)))
    except JetcrawlError as e:
        print(f"jetcrawl: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    raise AssertionError(f"unhandled command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
