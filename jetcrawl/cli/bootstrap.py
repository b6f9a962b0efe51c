"""``main``: from the command line to a subcommand's exit status.

Loads nothing a subcommand does not need (aiohttp waits until used), configures logging, runs
the subcommand the parser chose, and turns jetcrawl's errors into one line and exit status 2.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from jetcrawl.cli.parser import build_parser
from jetcrawl.cli.runtime import defer_aiohttp
from jetcrawl.contract.errors import JetcrawlError
from jetcrawl.contract.settings import Settings
from jetcrawl.plumbing.logs import configure_logging, set_service


def main(argv: Sequence[str] | None = None) -> int:
    defer_aiohttp()
    args = build_parser().parse_args(argv)
    args.entry = main  # a command that forks services has them run this
    try:
        log_format = args.log_format or Settings.from_env().log_format
        configure_logging(args.log_level, log_format)
        set_service(args.command)
        return int(args.func(args))
    except JetcrawlError as e:
        print(f"jetcrawl: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
