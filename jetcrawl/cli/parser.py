"""The ``jetcrawl`` command line: every subcommand's flags, and the settings they make.

Each subcommand names the function that runs it (``set_defaults(func=...)``, in
:mod:`jetcrawl.cli.commands`); flags that are settings override the ``JETCRAWL_*`` variables.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from jetcrawl import __version__
from jetcrawl.cli import commands

DESCRIPTION = "A distributed web crawler on NATS JetStream and etcd."


def _connection_flags(p: argparse.ArgumentParser, etcd: bool = False) -> None:
    p.add_argument("--nats", dest="nats_url", help="NATS server URL(s), comma-separated")
    _tls_flags(p, "nats")
    _timeout_flag(p)
    if etcd:
        p.add_argument(
            "--etcd",
            dest="etcd_urls",
            action="append",
            metavar="URL",
            help="etcd endpoint(s), http(s)://host:port, comma-separated or repeated (failover)",
        )
        _tls_flags(p, "etcd")
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
    parser = argparse.ArgumentParser(prog="jetcrawl", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"jetcrawl {__version__}")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    parser.add_argument(
        "--log-format",
        choices=["text", "json"],
        help="log lines as text (default) or JSON objects with trace ids (JETCRAWL_LOG_FORMAT)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("topology", help="print stream and consumer definitions as JSON")
    p.set_defaults(func=commands.cmd_topology)
    p.add_argument("--shards", type=int, help="shard count")
    p.add_argument(
        "--apply",
        action="store_true",
        help="create or update them on the server instead (as a NATS user that may)",
    )
    p.add_argument("--nats", dest="nats_url", help="NATS server URL(s) for --apply")
    _tls_flags(p, "nats")
    _timeout_flag(p)
    p.add_argument(
        "--write",
        metavar="DIR",
        type=Path,
        help="write one --config file per stream and consumer into DIR and print the nats commands",
    )

    p = sub.add_parser("dispatcher", help="run a dispatcher")
    p.set_defaults(func=commands.cmd_dispatcher)
    _connection_flags(p)
    _metrics_flag(p)
    _set_flag(p)

    p = sub.add_parser("worker", help="run a worker")
    p.set_defaults(func=commands.cmd_worker)
    _connection_flags(p, etcd=True)
    p.add_argument("--id", dest="worker_id", help="worker id (default: host-pid-random)")
    p.add_argument("--concurrency", type=positive, help="tasks in flight at most")
    _crawl_limits(p)
    _politeness_flags(p)
    _metrics_flag(p)
    _set_flag(p)

    p = sub.add_parser("renderer", help="run a renderer: pages rendered in headless Chromium")
    p.set_defaults(func=commands.cmd_renderer)
    _connection_flags(p)
    p.add_argument("--id", dest="worker_id", help="renderer id (default: host-pid-random)")
    p.add_argument("--chromium", dest="chromium_path", help="the Chromium binary")
    p.add_argument(
        "--concurrency", dest="render_concurrency", type=positive, help="pages at once (default 2)"
    )
    _crawl_limits(p)
    _set_flag(p)

    p = sub.add_parser("status", help="show workers, shards, backlogs, results and rates")
    p.set_defaults(func=commands.cmd_status)
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
    p.set_defaults(func=commands.cmd_crawl)
    p.add_argument(
        "seeds", nargs="+", metavar="SEED", help='start URL(s), or {"url": ..., "priority": 0}'
    )
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
    _politeness_flags(p)
    _set_flag(p)
    _results_parser(sub)
    _dlq_parser(sub)
    _job_parser(sub)
    _sink_parser(sub)
    return parser


def _job_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "job", help="put, get, list or diff job specs; pause, resume or cancel a job"
    )
    p.set_defaults(func=commands.cmd_job)
    actions = p.add_subparsers(dest="job_action", required=True, metavar="ACTION")
    put = actions.add_parser("put", help="check a JSON or YAML spec and store its next version")
    put.add_argument("file", type=Path, metavar="FILE")
    get = actions.add_parser("get", help="print a job's spec (YAML)")
    get.add_argument("name", metavar="NAME")
    get.add_argument("--version", type=positive, help="this version (default: the latest)")
    actions.add_parser("list", help="every job with its latest version")
    diff = actions.add_parser("diff", help="unified diff of two versions (default: the last two)")
    diff.add_argument("name", metavar="NAME")
    diff.add_argument("versions", nargs="*", type=positive, metavar="VERSION", help="A B")
    for action, text in (
        ("pause", "stop fetching a job's tasks, mesh-wide; they stay queued"),
        ("resume", "fetch a paused job's tasks again"),
        ("cancel", "end a job for good: its queued tasks are removed"),
    ):
        actions.add_parser(action, help=text).add_argument("name", metavar="NAME")
    for a in actions.choices.values():
        a.add_argument("--nats", dest="nats_url", help="NATS server URL(s), comma-separated")
        _timeout_flag(a)


def _sink_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from jetcrawl.sinks.plugins import find_sinks

    p = sub.add_parser("sink", help="store items and results: postgres, files, or a plugin's")
    sinks = p.add_subparsers(dest="sink_name", required=True, metavar="SINK")
    for name, plugin in sorted(find_sinks().items()):
        summary = getattr(plugin, "summary", f"unusable: {getattr(plugin, 'problem', '')}")
        s = sinks.add_parser(name, help=summary)
        s.set_defaults(func=commands.cmd_sink, sink_plugin=plugin)
        _connection_flags(s)
        s.add_argument("--job", help="only this job's items and results (default: every job)")
        s.add_argument(
            "--consumer", help="the durable consumer's name (default: sink-<SINK>-<job or all>)"
        )
        _metrics_flag(s)
        _set_flag(s)
        add_arguments = getattr(plugin, "add_arguments", None)
        if add_arguments is not None:
            add_arguments(s)


def _dlq_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("dlq", help="list or replay dead letters (CRAWL_DEAD)")
    p.set_defaults(func=commands.cmd_dlq)
    actions = p.add_subparsers(dest="dlq_action", required=True, metavar="ACTION")
    for name, text in [("list", "show dead letters"), ("replay", "send them back, then drop them")]:
        a = actions.add_parser(name, help=text)
        a.add_argument("--nats", dest="nats_url", help="NATS server URL(s), comma-separated")
        _tls_flags(a, "nats")
        _timeout_flag(a)
        a.add_argument("--stage", help="only this stage: seeds, discovered, task, fetch, poison")
        a.add_argument("--reason", help="only this reason (max_deliveries, retries_exhausted, ...)")
        if name == "list":
            a.add_argument("--json", action="store_true", help="one JSON object per line")


def _results_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("results", help="export results (JSON lines, WARC) or items")
    p.set_defaults(func=commands.cmd_results)
    _connection_flags(p)
    p.add_argument("--job", help="only this job's results")
    p.add_argument(
        "--items",
        action="store_true",
        help="export the items (CRAWL_ITEMS) instead, the latest of each key: jsonl, csv, parquet",
    )
    p.add_argument("--since", help="from this time on: ISO 8601, or a duration back (15m, 2h)")
    p.add_argument("--follow", action="store_true", help="keep writing results as they arrive")
    p.add_argument(
        "--format", choices=["jsonl", "warc", "csv", "parquet"], help="default: from the file name"
    )
    p.add_argument("-o", "--output", type=Path, help="write here (default: standard output)")


def _tls_flags(p: argparse.ArgumentParser, server: str) -> None:
    name = server.upper() if server == "nats" else server
    p.add_argument(
        f"--{server}-ca",
        dest=f"{server}_tls_ca_file",
        metavar="FILE",
        help=f"verify {name} servers against this CA (PEM); turns TLS on",
    )
    p.add_argument(
        f"--{server}-cert",
        dest=f"{server}_tls_cert_file",
        metavar="FILE",
        help=f"client certificate (PEM) for a {name} server that requires one",
    )
    p.add_argument(
        f"--{server}-key", dest=f"{server}_tls_key_file", metavar="FILE", help="its private key"
    )


def _timeout_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--connect-timeout",
        dest="command_timeout_s",
        type=positive_seconds,
        metavar="SECONDS",
        help="a command gives up reaching NATS or etcd after this long (default 10)",
    )


def positive_seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return value


def _metrics_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--metrics-port",
        dest="metrics_port",
        type=int,
        metavar="PORT",
        help="serve /metrics, /healthz and /readyz on this port (default 0: off)",
    )


def _politeness_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--host-delay",
        dest="host_delay_s",
        type=float,
        metavar="SECONDS",
        help="at least this long between requests to one host (default 1; robots.txt may ask more)",
    )
    p.add_argument(
        "--host-concurrency",
        dest="host_concurrency",
        type=positive,
        metavar="N",
        help="requests in flight to one host at most (default 1)",
    )
    p.add_argument(
        "--user-agent", dest="user_agent", help="the User-Agent header (robots.txt is read for it)"
    )
    p.add_argument(
        "--render",
        choices=["never", "auto", "always"],
        help="render pages in headless Chromium: auto renders script shells (default never)",
    )
    p.add_argument(
        "--proxy",
        dest="proxies",
        action="append",
        metavar="URL",
        help="fetch through this proxy; repeat for a pool (password as ${VARIABLE})",
    )


def _set_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--set",
        dest="assignments",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="any setting (see jetcrawl/contract/settings.py), e.g. --set max_deferrals=4",
    )


def _crawl_limits(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--allow-net",
        dest="allow_nets",
        action="append",
        metavar="CIDR",
        help="let the crawl reach this private or loopback network (repeatable)",
    )
