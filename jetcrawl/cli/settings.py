"""The settings of a command: flags over ``JETCRAWL_*`` variables over the defaults."""

from __future__ import annotations

import argparse
from typing import Any

from jetcrawl.contract.settings import Settings, parse_assignments

FLAG_SETTINGS = (
    "nats_url",
    "etcd_url",
    "cluster",
    "shards",
    "worker_id",
    "concurrency",
    "max_pages",
    "metrics_port",
    "command_timeout_s",
    "host_delay_s",
    "host_concurrency",
    "user_agent",
    "render",
    "render_concurrency",
    "chromium_path",
)


def settings_from(args: argparse.Namespace, **extra: Any) -> Settings:
    flags = parse_assignments(getattr(args, "assignments", None) or [])  # --set, then flags
    flags |= {n: getattr(args, n) for n in FLAG_SETTINGS if getattr(args, n, None) is not None}
    if getattr(args, "allow_nets", None):
        flags["allow_nets"] = tuple(args.allow_nets)
    if getattr(args, "proxies", None):
        flags["proxies"] = tuple(args.proxies)
    return Settings.from_env(**flags, **extra)
