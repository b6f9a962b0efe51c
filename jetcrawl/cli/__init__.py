"""The ``jetcrawl`` command: the composition root of every service.

jetcrawl crawl       crawl on one machine: embedded servers, a dispatcher and workers, results
jetcrawl dispatcher  run a dispatcher (frontier -> sharded tasks)
jetcrawl worker      run a worker (tasks of its shards -> results and links)
jetcrawl renderer    run a renderer (pages -> their DOM after JavaScript, in headless Chromium)
jetcrawl topology    print the JetStream definitions for the nats CLI, or apply them
jetcrawl status      the mesh now: workers, shard owners, backlogs, hand-backs, results, rates
jetcrawl results     export results as JSON lines or WARC
jetcrawl dlq         list or replay dead letters
jetcrawl job         put, get, list and diff job specs
jetcrawl sink        store items and results: PostgreSQL, files, or a plugin's sink

bootstrap.py  main(): logging, the chosen subcommand, errors as exit statuses
parser.py     the flags of every subcommand
settings.py   flags over ``JETCRAWL_*`` variables: the one Settings object
commands.py   what each subcommand does
services.py   the dispatcher, the worker and the renderer as services (tracing, metrics, readiness)
runtime.py    the event loop, signals, the garbage collector, lazy imports
"""

from jetcrawl.cli.bootstrap import main
from jetcrawl.cli.parser import build_parser

__all__ = ["build_parser", "main"]
