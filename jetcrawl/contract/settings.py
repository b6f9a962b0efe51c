"""One frozen settings object, built once at the entry point and passed down.

Every field can be set by a ``JETCRAWL_<FIELD>`` environment variable (``JETCRAWL_ACK_WAIT_S=5``)
or by a CLI flag; flags win over the environment, the environment over the defaults below. An
unknown ``JETCRAWL_*`` variable is an error, so a misspelt setting never goes unnoticed. Secrets
are masked in ``repr``.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, get_args, get_origin, get_type_hints

from jetcrawl.contract.errors import SettingsError
from jetcrawl.contract.fetchpolicy import FetchPolicy
from jetcrawl.contract.filetypes import EXTENSION_RE, IGNORED_EXTENSIONS

ENV_PREFIX = "JETCRAWL_"

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
DEFAULT_ETCD_URL = "http://127.0.0.1:2379"
DEFAULT_SHARDS = 64
MAX_PARTITIONS = 16  # nats/accounts.conf names each partition's streams for the services
DEFAULT_ACK_WAIT_S = 30.0
DEFAULT_TASK_MAX_DELIVER = 3  # attempts per URL, as Scrapy's and Nutch's defaults give
DEFAULT_DUPLICATE_WINDOW_S = 600.0
DEFAULT_LEASE_TTL_S = 10.0
DEFAULT_ETCD_TIMEOUT_S = 5.0
DEFAULT_USER_AGENT_TOKEN = "jetcrawl"
DEFAULT_CONTACT_URL = "https://github.com/jetcrawl/jetcrawl"
DEFAULT_TRACKING_PARAMS = (
    "utm_source",
    "utm_medium",
    "utm_campaign",
    "utm_term",
    "utm_content",
    "utm_id",
    "fbclid",
    "gclid",
    "dclid",
    "msclkid",
    "mc_cid",
    "mc_eid",
    "_ga",
    "yclid",
)
SCOPES = ("host", "domain", "any")
# Priority levels, 0 the highest: a task's level picks its subject crawl.tasks.<shard>.<level>.<job>
# (contract/topology.py) and how soon its shard's owner takes it (worker/lanes.py).
PRIORITY_LEVELS = 4
DEFAULT_HOST_DELAY_S = 1.0
DEFAULT_MAX_CRAWL_DELAY_S = 30.0
DEFAULT_MAX_RETRY_AFTER_S = 600.0
DEFAULT_MAX_DEFERRALS = 2
DEFAULT_MAX_URLS_PER_HOST = 100_000
DEFAULT_MAX_REPEATED_SEGMENTS = 3


class Secret(str):
    """A string that does not show itself in ``repr`` or logs."""

    def __repr__(self) -> str:
        return "'***'" if self else "''"


NO_SECRET = Secret("")


@dataclass(frozen=True, slots=True)
class Settings:
    # --- where the services are
    nats_url: str = DEFAULT_NATS_URL
    nats_user: str = ""
    nats_password: Secret = NO_SECRET
    etcd_url: str = DEFAULT_ETCD_URL  # one endpoint or several, comma-separated (failover)
    cluster: str = "default"

    # --- TLS (README "Security: TLS and users"): a CA file, or a tls:// (https:// for etcd)
    # URL, turns TLS on with the server's certificate verified (against the system's CAs without
    # a CA file); a client certificate and its key are for servers that require one. Paths only:
    # no key material is ever held in the settings.
    nats_tls_ca_file: str = ""
    nats_tls_cert_file: str = ""
    nats_tls_key_file: str = ""
    etcd_tls_ca_file: str = ""
    etcd_tls_cert_file: str = ""
    etcd_tls_key_file: str = ""

    # --- topology (fixed when the streams are created)
    shards: int = DEFAULT_SHARDS
    # Shard ranges the tasks and the seen set are split into: a task stream and a KV bucket each
    # (1: the one stream CRAWL_TASKS and the one bucket crawl_seen)
    partitions: int = 1
    # nats-server tags (its server_tags) that place the partitions' streams, in turn: partition p
    # on the servers tagged partition_tags[p % len]. For clusters of more servers than replicas;
    # empty: nats-server places them (all on one server, often, for one replica).
    partition_tags: tuple[str, ...] = ()
    replicas: int = 1
    ack_wait_s: float = DEFAULT_ACK_WAIT_S
    task_max_deliver: int = DEFAULT_TASK_MAX_DELIVER
    frontier_max_deliver: int = 20
    max_ack_pending: int = 1024
    duplicate_window_s: float = DEFAULT_DUPLICATE_WINDOW_S
    # Off: a service only checks the topology (its NATS user may not change streams); the admin
    # applies it with `jetcrawl topology --apply` (compose's one-shot `topology` service).
    create_topology: bool = True
    # How long a service waits for JetStream to take the topology (a cluster electing its
    # leaders, or not yet placing replicas) before it gives up; 0: it does not wait.
    topology_wait_s: float = 30.0

    # --- client behaviour
    nats_ping_interval_s: float = 5.0
    nats_max_outstanding_pings: int = 3
    nats_connect_timeout_s: float = 5.0
    # A command (status, results, dlq, topology --apply, crawl --nats/--etcd) gives up reaching
    # NATS or etcd after this long, naming the URL and the cause; services keep trying.
    command_timeout_s: float = 10.0
    etcd_timeout_s: float = DEFAULT_ETCD_TIMEOUT_S

    # --- frontier rules (defaults for seeds that do not say otherwise)
    default_scope: str = "host"
    default_max_depth: int = 16
    default_job: str = "default"
    max_url_length: int = 2048
    tracking_params: tuple[str, ...] = DEFAULT_TRACKING_PARAMS
    # Links whose path ends in "." + one of these are not followed (images, archives, media,
    # office documents: contract/filetypes.py); a job spec may add, allow or switch it off.
    # Empty: off for the whole crawl.
    ignored_extensions: tuple[str, ...] = IGNORED_EXTENSIONS
    max_pages: int = 0  # 0: no limit
    # Spider-trap guards: admissions per host per job (0: no limit), and a path that repeats one
    # segment more than this many times (/a/b/a/b/a/b/a/b) is a trap, not a page (0: no check).
    max_urls_per_host: int = DEFAULT_MAX_URLS_PER_HOST
    max_repeated_segments: int = DEFAULT_MAX_REPEATED_SEGMENTS
    recrawl_after_s: float = 0.0  # 0: a URL is crawled once; else its seen mark expires then

    # Batching for throughput: a service gathers what its tasks publish (and their acks) for this
    # long and writes it at once, so NATS sees one write for many pages; 0 writes each at once.
    publish_linger_s: float = 0.005

    # --- dispatcher
    dispatch_batch: int = 256
    # After a batch the server ended short (the frontier had no more), wait this long for it to
    # fill up: fewer, larger batches cost the dispatcher and NATS much less per link. 0: at once.
    dispatch_linger_s: float = 0.02
    dedupe_cache_size: int = 200_000
    dead_original_max_bytes: int = 4096

    # --- worker and registry
    worker_id: str = ""
    concurrency: int = 64
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S
    keepalive_s: float = 0.0  # 0: a third of lease_ttl_s
    drain_deadline_s: float = 20.0
    # "": jetcrawl/0.1 (+contact_url); robots.txt is read for the first word before "/"
    user_agent: str = ""
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 20.0
    total_timeout_s: float = 60.0
    max_body_bytes: int = 10 * 1024 * 1024
    # Outlinks kept of one page, in document order (Heritrix's default): a page of 100,000 links
    # must not flood the frontier nor the worker's memory.
    max_links_per_page: int = 6000
    max_redirects: int = 10  # when follow_redirects
    # Off: a redirect is a record of its own and its target a new URL for the frontier, fetched
    # by the target host's owner under that host's politeness, and never fetched twice.
    follow_redirects: bool = False
    # SSRF guard: loopback, private, link-local, multicast and reserved addresses (and the
    # mesh's own NATS and etcd endpoints) are refused unless inside one of these CIDRs.
    allow_nets: tuple[str, ...] = ()

    # --- politeness and retries (worker/politeness.py, worker/retry.py)
    host_delay_s: float = DEFAULT_HOST_DELAY_S  # between request starts to one host
    host_concurrency: int = 1
    max_crawl_delay_s: float = DEFAULT_MAX_CRAWL_DELAY_S  # cap for robots.txt Crawl-delay
    max_retry_after_s: float = DEFAULT_MAX_RETRY_AFTER_S  # cap for a 429/503 Retry-After pause
    # Tasks waiting for their host per worker; 0: about ack_wait_s / 6 of the worker's pace,
    # 4 to 64 x concurrency (worker/capacity.py)
    buffer_max: int = 0
    max_deferrals: int = DEFAULT_MAX_DEFERRALS  # hand-backs of a waiting task under pressure
    retry_base_delay_s: float = 1.0  # first retry's backoff; doubles per attempt
    retry_max_delay_s: float = 60.0
    # A URL's budget in time: no retry begins later than this after its first attempt (with
    # total_timeout_s per attempt, a server that drips bytes costs a few minutes, not ten).
    retry_budget_s: float = 300.0
    store_bodies: bool = False  # keep HTML bodies in the crawl_bodies object store (for WARC)
    # Links a worker remembers having sent to the frontier (worker/sent.py), so a link on many
    # pages is sent once; 0: every page's links are sent.
    link_memory: int = 100_000
    # Pages whose links are ready within this long of each other send them in one
    # crawl.discovered message (worker/discovered.py; with tracing off); 0: one message a page.
    links_linger_s: float = 0.02

    # --- priorities and job shares (worker/lanes.py): levels 0 (highest) to 3
    default_priority: int = 2  # a task's level when nothing names one
    # Each level's guaranteed share of a shard's turns while it has tasks, highest level first:
    # beyond the guarantees the highest ready level goes first. A level owed this many turns
    # of its share is served next (so short bursts of a higher level are never interleaved).
    priority_weights: tuple[int, ...] = (8, 4, 2, 1)
    priority_slack: int = 32
    # How often a worker reads which lanes (shard, level, job) hold tasks (one stream info);
    # a lane's first task waits at most this long for its owner.
    lanes_poll_s: float = 0.25
    lane_idle_s: float = 600.0  # a lane's consumer is removed by the server after this idle

    # --- rendering, proxies and soft blocks (the policy of jobs without their own:
    # contract/fetchpolicy.py; the renderer service: worker/renderer/)
    render: str = "never"  # never | auto | always
    proxies: tuple[str, ...] = ()  # http://, https://, socks5://; passwords as ${VARIABLE}
    proxy_rotation: str = "sticky"  # sticky (per host) | round_robin
    proxy_bench_s: float = 30.0  # a failing proxy is benched this long, doubling per failure
    on_block: str = "record"  # record | retry | proxy | render: what a soft block does
    # Shown in the default User-Agent, "jetcrawl/0.1 (+<contact_url>)", for site owners.
    contact_url: str = DEFAULT_CONTACT_URL
    render_timeout_s: float = 20.0  # one render, sub-requests included; then the page is killed
    render_concurrency: int = 2  # pages a renderer renders at once
    render_pages_per_browser: int = 50  # Chromium is replaced after this many pages (memory)
    render_max_dom_bytes: int = 2 * 1024 * 1024
    chromium_path: str = "/usr/bin/chromium"

    # --- sinks (jetcrawl sink NAME: jetcrawl/sinks/)
    sink_dsn: Secret = NO_SECRET  # the postgres sink's database, if no --dsn; password masked
    sink_batch: int = 500  # records per write at most
    sink_idle_s: float = 1.0  # a pull waits this long; then the sink may close what it holds
    sink_max_pending: int = 20_000  # unacked records per sink consumer (held in a file, say)
    sink_retry_first_s: float = 0.5  # a paused sink's first retry; doubles per try
    sink_retry_max_s: float = 15.0  # a paused sink tries at least this often
    sink_db_timeout_s: float = 10.0  # a database connect or statement gives up after this
    # The file sink closes a file at this many records, bytes or seconds, whichever comes first.
    sink_file_max_records: int = 10_000
    sink_file_max_bytes: int = 64 * 1024 * 1024
    sink_file_max_age_s: float = 60.0

    # --- observability
    # Log lines: "text", or "json" (one object a line, with the trace and span ids of the
    # current span: jetcrawl/plumbing/logs.py).
    log_format: str = "text"
    metrics_port: int = 0  # 0: no HTTP endpoint (/metrics, /healthz, /readyz)
    # A worker writes its waiting room and hand-backs to KV crawl_workers this often, for
    # `jetcrawl status` (a report is gone a minute after its worker stopped); 0: never.
    report_interval_s: float = 5.0
    # Tasks up to this link depth continue the trace of the page that linked them (the seed's,
    # for depth 0); deeper ones start a trace of their own with a span link to it. -1: every
    # task starts its own trace. See dispatcher/tracing.py.
    trace_continue_depth: int = 0

    # --- jetcrawl crawl
    # Its services are forked from the command, their code imported once
    # (jetcrawl/local/services.py), where the platform allows; off: each starts as a new
    # `python -m jetcrawl` interpreter.
    local_fork: bool = True
    progress_log_every_s: float = 5.0  # without a terminal, a progress log line this often

    def __post_init__(self) -> None:
        if not self.user_agent:  # the honest default names who to contact
            agent = f"{DEFAULT_USER_AGENT_TOKEN}/0.1 (+{self.contact_url})"
            object.__setattr__(self, "user_agent", agent)
        if not self.contact_url.startswith(("http://", "https://", "mailto:")):
            raise SettingsError(
                "contact_url", f"must be an http(s) or mailto: URL, got {self.contact_url!r}"
            )
        if self.render_timeout_s <= 0 or self.render_concurrency < 1:
            raise SettingsError("render_timeout_s/render_concurrency", "must be > 0")
        if self.render_pages_per_browser < 1:
            raise SettingsError("render_pages_per_browser", "must be >= 1")
        FetchPolicy.from_settings(self)  # render, proxies, proxy_rotation, on_block
        if self.shards < 1:
            raise SettingsError("shards", f"must be >= 1, got {self.shards}")
        if not 1 <= self.partitions <= min(MAX_PARTITIONS, self.shards):
            raise SettingsError(
                "partitions",
                f"must be 1 to {MAX_PARTITIONS} and at most shards ({self.shards}), "
                f"got {self.partitions}",
            )
        if any(not tag or tag != tag.strip() for tag in self.partition_tags):
            raise SettingsError("partition_tags", f"empty or padded tag in {self.partition_tags}")
        if self.default_scope not in SCOPES:
            raise SettingsError(
                "default_scope", f"must be one of {SCOPES}, got {self.default_scope!r}"
            )
        if self.concurrency < 1:
            raise SettingsError("concurrency", f"must be >= 1, got {self.concurrency}")
        if self.lease_ttl_s < 2:
            raise SettingsError(
                "lease_ttl_s", f"must be >= 2 s (etcd's minimum), got {self.lease_ttl_s}"
            )
        for name in ("ack_wait_s", "etcd_timeout_s", "nats_ping_interval_s", "command_timeout_s"):
            if getattr(self, name) <= 0:
                raise SettingsError(name, "must be > 0")
        if self.host_concurrency < 1:
            raise SettingsError("host_concurrency", f"must be >= 1, got {self.host_concurrency}")
        for name in (
            "host_delay_s",
            "max_crawl_delay_s",
            "max_retry_after_s",
            "buffer_max",
            "publish_linger_s",
            "dispatch_linger_s",
            "link_memory",
            "links_linger_s",
            "topology_wait_s",
            "report_interval_s",
            "retry_budget_s",
            "sink_retry_first_s",
            "sink_retry_max_s",
        ):
            if getattr(self, name) < 0:
                raise SettingsError(name, "must be >= 0")
        for extension in self.ignored_extensions:
            if not EXTENSION_RE.match(extension):
                raise SettingsError(
                    "ignored_extensions",
                    f"not a lowercase extension without its first dot: {extension!r}",
                )
        for cidr in self.allow_nets:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise SettingsError("allow_nets", f"not a CIDR: {cidr!r}") from None
        if not self.cluster or "/" in self.cluster:
            raise SettingsError(
                "cluster", f"must be a non-empty name without '/', got {self.cluster!r}"
            )
        if not 0 <= self.default_priority < len(self.priority_weights):
            raise SettingsError("default_priority", "must be a level of priority_weights")
        if len(self.priority_weights) != PRIORITY_LEVELS or min(self.priority_weights) < 1:
            raise SettingsError(
                "priority_weights",
                f"must be {PRIORITY_LEVELS} whole numbers >= 1, got {self.priority_weights}",
            )
        if self.priority_slack < 1 or self.lanes_poll_s <= 0 or self.lane_idle_s <= 0:
            raise SettingsError("priority_slack/lanes_poll_s/lane_idle_s", "must be > 0")
        if self.trace_continue_depth < -1:
            raise SettingsError("trace_continue_depth", "must be >= -1")
        if self.log_format not in ("text", "json"):
            raise SettingsError("log_format", f"must be text or json, got {self.log_format!r}")
        for name in ("sink_batch", "sink_max_pending", "sink_file_max_records"):
            if getattr(self, name) < 1:
                raise SettingsError(name, f"must be >= 1, got {getattr(self, name)}")
        for name in (
            "sink_idle_s",
            "sink_db_timeout_s",
            "sink_file_max_bytes",
            "sink_file_max_age_s",
        ):
            if getattr(self, name) <= 0:
                raise SettingsError(name, "must be > 0")
        if not 0 <= self.metrics_port <= 65535:
            raise SettingsError("metrics_port", f"must be a TCP port or 0, got {self.metrics_port}")
        for server in ("nats", "etcd"):
            cert, key = f"{server}_tls_cert_file", f"{server}_tls_key_file"
            if bool(getattr(self, cert)) != bool(getattr(self, key)):
                raise SettingsError(cert if not getattr(self, cert) else key, "set both or neither")

    def __repr__(self) -> str:
        # A URL's userinfo (nats://user:password@host) is a secret too: shown without it.
        shown = (
            f"{f.name}={redact_urls(value)!r}" if f.name.endswith("_url") else f"{f.name}={value!r}"
            for f in fields(self)
            for value in (getattr(self, f.name),)
        )
        return f"Settings({', '.join(shown)})"

    @property
    def waiting_max(self) -> int:
        """How many tasks a worker keeps waiting for their host at most: ``buffer_max``, else
        the most its pace may call for."""
        return self.buffer_max or 64 * self.concurrency

    @property
    def holding(self) -> int:
        """How many tasks a worker holds at most: fetching, or waiting for their host."""
        return self.concurrency + self.waiting_max

    @property
    def keepalive_interval_s(self) -> float:
        return self.keepalive_s if self.keepalive_s > 0 else self.lease_ttl_s / 3

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

    def to_env(self) -> dict[str, str]:
        """Every setting as the ``JETCRAWL_*`` variables that ``from_env`` reads back."""
        env = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, tuple):
                value = ",".join(map(str, value))
            env[f"{ENV_PREFIX}{f.name.upper()}"] = str(value)
        return env

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Defaults, then ``JETCRAWL_*`` variables from ``env``, then ``overrides`` (flags)."""
        env = os.environ if env is None else env
        hints = get_type_hints(cls)
        names = {f.name for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, raw in env.items():
            if not key.startswith(ENV_PREFIX):
                continue
            name = key[len(ENV_PREFIX) :].lower()
            if name not in names:
                raise SettingsError(key, "unknown setting (misspelt?)")
            values[name] = _parse(name, hints[name], raw)
        for name, value in overrides.items():
            if name not in names:
                raise SettingsError(name, "unknown setting")
            if value is not None:
                values[name] = value
        for name in ("nats_password", "sink_dsn"):
            if name in values:
                values[name] = Secret(values[name])
        return cls(**values)


def redact_urls(urls: str) -> str:
    """``urls`` (comma-separated) as a log may show them: a password in one becomes ``***``."""
    return ",".join(_USERINFO_PASSWORD.sub(r"\1***@", url) for url in urls.split(","))


_USERINFO_PASSWORD = re.compile(r"^([a-z][a-z0-9+.-]*://[^:/@]*:)[^@/]*@", re.IGNORECASE)


def parse_assignments(assignments: Sequence[str]) -> dict[str, Any]:
    """``NAME=VALUE`` pairs (``--set host_delay_s=0.5``) as settings, parsed as the
    ``JETCRAWL_*`` variables are; an unknown name or a bad value is a ``SettingsError``."""
    hints = get_type_hints(Settings)
    names = {f.name for f in fields(Settings)}
    values: dict[str, Any] = {}
    for assignment in assignments:
        name, sep, raw = assignment.partition("=")
        name = name.strip().lower().removeprefix(ENV_PREFIX.lower())
        if not sep:
            raise SettingsError(assignment, "expected NAME=VALUE")
        if name not in names:
            raise SettingsError(name, "unknown setting (misspelt?)")
        values[name] = _parse(name, hints[name], raw)
    return values


def _parse(name: str, hint: Any, raw: str) -> Any:
    try:
        if hint is bool:
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(raw)
        if hint is int:
            return int(raw)
        if hint is float:
            return float(raw)
        if get_origin(hint) is tuple and get_args(hint)[0] in (str, int):
            kind = get_args(hint)[0]
            return tuple(kind(part.strip()) for part in raw.split(",") if part.strip())
        return hint(raw) if hint in (str, Secret) else raw
    except ValueError:
        raise SettingsError(f"{ENV_PREFIX}{name.upper()}", f"bad value {raw!r}") from None
