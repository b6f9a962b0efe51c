"""The settings of a command: flags over ``JETCRAWL_*`` variables over the defaults."""

from __future__ import annotations

import argparse
from typing import Any

from jetcrawl.contract.settings import Settings, parse_assignments

FLAG_SETTINGS = (
    "nats_url",
    "nats_tls_ca_file",
    "nats_tls_cert_file",
    "nats_tls_key_file",
    "etcd_tls_ca_file",
    "etcd_tls_cert_file",
    "etcd_tls_key_file",
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
    if getattr(args, "etcd_urls", None):  # --etcd, repeated or comma-separated
        flags["etcd_url"] = ",".join(args.etcd_urls)
    if getattr(args, "allow_nets", None):
        flags["allow_nets"] = tuple(args.allow_nets)
    if getattr(args, "proxies", None):
        flags["proxies"] = tuple(args.proxies)
    return Settings.from_env(**flags, **extra)
