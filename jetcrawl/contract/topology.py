"""The JetStream topology as code: subjects, streams, consumers and the dedupe bucket.

Every service calls :func:`ensure` at start; it creates what is missing and updates what drifted,
and refuses to run against a topology made with another shard count (the shard count is recorded in
the ``CRAWL_TASKS`` stream's metadata). :func:`as_cli_json` renders the same definitions as the JSON
that ``nats stream add --config`` and ``nats consumer add --config`` accept.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    ConsumerInfo,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    StreamInfo,
)
from nats.js.errors import APIError, NotFoundError
from nats.js.kv import KeyValue

from jetcrawl.contract import PROTOCOL_VERSION
from jetcrawl.contract.errors import ShardCountMismatch, TopologyError, TopologyUnavailable
from jetcrawl.contract.settings import Settings

# --- subjects
SEEDS = "crawl.seeds"
DISCOVERED = "crawl.discovered"
TASKS_PREFIX = "crawl.tasks."
RESULTS_PREFIX = "crawl.results."
DEAD_PREFIX = "crawl.dead."
# What nats-server publishes when a consumer gives up on a message (MaxDeliver reached): a task
# consumer (a poison task), or the dispatchers' intake (a frontier message it could not admit).
MAX_DELIVERIES_ADVISORIES = (
    "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.CRAWL_TASKS.*",
    "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.CRAWL_FRONTIER.dispatch",
)

# --- streams, consumers, buckets
FRONTIER_STREAM = "CRAWL_FRONTIER"
TASKS_STREAM = "CRAWL_TASKS"
RESULTS_STREAM = "CRAWL_RESULTS"
DEAD_STREAM = "CRAWL_DEAD"
ADVISORIES_STREAM = "CRAWL_ADVISORIES"
DISPATCH_CONSUMER = "dispatch"
POISON_CONSUMER = "poison"
ADVISORIES_MAX_AGE_S = 7 * 24 * 3600.0
SEEN_BUCKET = "crawl_seen"
SEEN_STREAM = f"KV_{SEEN_BUCKET}"
SEEN_SUBJECT_PREFIX = f"$KV.{SEEN_BUCKET}."
JOBS_BUCKET = "crawl_jobs"
JOBS_STREAM = f"KV_{JOBS_BUCKET}"
VALIDATORS_BUCKET = "crawl_validators"
VALIDATORS_STREAM = f"KV_{VALIDATORS_BUCKET}"
BODIES_BUCKET = "crawl_bodies"
WORKERS_BUCKET = "crawl_workers"
WORKERS_STREAM = f"KV_{WORKERS_BUCKET}"
WORKER_REPORTS_MAX_AGE_S = 60.0  # a stopped worker's last report is gone after this
BODIES_STREAM = f"OBJ_{BODIES_BUCKET}"

SHARDS_METADATA_KEY = "jetcrawl_shards"
PROTOCOL_METADATA_KEY = "jetcrawl_protocol"

log = logging.getLogger(__name__)

_API_STREAM_NAME_IN_USE = 10058
_API_NO_SUITABLE_PEERS = 10005  # "no suitable peers for placement" (offline, full, untagged)
_UNAVAILABLE = 503  # JetStream has no leader to take the request

DUPLICATE_WINDOW = "duplicate_window"

T = TypeVar("T")


def task_subject(shard: int) -> str:
    return f"{TASKS_PREFIX}{shard}"


def result_subject(shard: int) -> str:
    return f"{RESULTS_PREFIX}{shard}"


def dead_subject(stage: str) -> str:
    return f"{DEAD_PREFIX}{stage}"


def shard_consumer(shard: int) -> str:
    return f"shard-{shard}"


@dataclass(frozen=True, slots=True)
class Topology:
    """Every stream and consumer definition for one shard count and set of timings."""

    streams: tuple[StreamConfig, ...]
    consumers: tuple[tuple[str, ConsumerConfig], ...]  # (stream name, config)

    @classmethod
    def from_settings(cls, settings: Settings) -> Topology:
        storage = StorageType.FILE
        replicas = settings.replicas
        streams = (
            StreamConfig(
                name=FRONTIER_STREAM,
                description="seeds and discovered links waiting for the dispatcher",
                subjects=[SEEDS, DISCOVERED],
                retention=RetentionPolicy.WORK_QUEUE,
                storage=storage,
                num_replicas=replicas,
                duplicate_window=settings.duplicate_window_s,
                discard=DiscardPolicy.OLD,
            ),
            StreamConfig(
                name=TASKS_STREAM,
                description="admitted URLs, partitioned by host onto crawl.tasks.<shard>",
                subjects=[f"{TASKS_PREFIX}*"],
                retention=RetentionPolicy.WORK_QUEUE,
                storage=storage,
                num_replicas=replicas,
                duplicate_window=settings.duplicate_window_s,
                metadata={
                    SHARDS_METADATA_KEY: str(settings.shards),
                    PROTOCOL_METADATA_KEY: str(PROTOCOL_VERSION),
                },
            ),
            StreamConfig(
                name=RESULTS_STREAM,
                description="one result record per crawled task",
                subjects=[f"{RESULTS_PREFIX}*"],
                retention=RetentionPolicy.LIMITS,
                storage=storage,
                num_replicas=replicas,
                duplicate_window=settings.duplicate_window_s,
            ),
            StreamConfig(
                name=DEAD_STREAM,
                description="dead letters: rejected input and exhausted retries, with reasons",
                subjects=[f"{DEAD_PREFIX}>"],
                retention=RetentionPolicy.LIMITS,
                storage=storage,
                num_replicas=replicas,
                duplicate_window=settings.duplicate_window_s,
            ),
            # Advisories are plain messages: kept here until the dispatchers' poison consumer
            # has turned each into a dead letter (dispatcher/poison.py).
            StreamConfig(
                name=ADVISORIES_STREAM,
                description="max-deliveries advisories: poison tasks, unadmitted frontier input",
                subjects=list(MAX_DELIVERIES_ADVISORIES),
                retention=RetentionPolicy.WORK_QUEUE,
                storage=storage,
                num_replicas=replicas,
                max_age=ADVISORIES_MAX_AGE_S,
            ),
            # The buckets, declared as the streams nats-py's create_key_value would make.
            _kv_stream(
                SEEN_BUCKET,
                "URL fingerprint -> admitting frontier sequence",
                storage,
                replicas,
                allow_msg_ttl=True,  # a mark may expire: re-crawl (recrawl_after_s)
            ),
            _kv_stream(
                VALIDATORS_BUCKET, "ETag and Last-Modified for re-crawls", storage, replicas
            ),
            # Page bodies, when kept (gzip-compressed by jetcrawl.plumbing.bodies): the object store
            # nats-py's create_object_store would make.
            StreamConfig(
                name=BODIES_STREAM,
                description="object store crawl_bodies: page bodies by fingerprint and digest",
                subjects=[f"$O.{BODIES_BUCKET}.C.>", f"$O.{BODIES_BUCKET}.M.>"],
                retention=RetentionPolicy.LIMITS,
                storage=storage,
                num_replicas=replicas,
                allow_direct=True,
                allow_rollup_hdrs=True,
                discard=DiscardPolicy.NEW,
                max_msgs=-1,
            ),
            _kv_stream(JOBS_BUCKET, "per-job and per-host admission counters", storage, replicas),
            _kv_stream(
                WORKERS_BUCKET,
                "worker id -> its latest report (waiting room, hand-backs)",
                storage,
                replicas,
                max_age=WORKER_REPORTS_MAX_AGE_S,
            ),
        )
        pull = {
            "ack_policy": AckPolicy.EXPLICIT,
            "deliver_policy": DeliverPolicy.ALL,
            "ack_wait": settings.ack_wait_s,
            "max_ack_pending": settings.max_ack_pending,
        }
        consumers = [
            (
                FRONTIER_STREAM,
                ConsumerConfig(
                    durable_name=DISPATCH_CONSUMER,
                    description="the dispatchers' shared intake",
                    max_deliver=settings.frontier_max_deliver,
                    **pull,  # type: ignore[arg-type]
                ),
            ),
            (
                ADVISORIES_STREAM,
                ConsumerConfig(
                    durable_name=POISON_CONSUMER,
                    description="the dispatchers' shared poison-task collector",
                    max_deliver=settings.frontier_max_deliver,
                    **pull,  # type: ignore[arg-type]
                ),
            ),
        ]
        consumers += [
            (
                TASKS_STREAM,
                ConsumerConfig(
                    durable_name=shard_consumer(shard),
                    description=f"tasks of shard {shard}",
                    filter_subject=task_subject(shard),
                    # Room for the politeness hand-backs, which are no attempts (the worker
                    # subtracts them); a task crashing its worker every time still ends here.
                    max_deliver=settings.task_max_deliver + settings.max_deferrals,
                    **pull,  # type: ignore[arg-type]
                ),
            )
            for shard in range(settings.shards)
        ]
        return cls(streams=streams, consumers=tuple(consumers))


def _kv_stream(
    bucket: str,
    holds: str,
    storage: StorageType,
    replicas: int,
    allow_msg_ttl: bool | None = None,
    max_age: float | None = None,
) -> StreamConfig:
    """The stream behind KV bucket ``bucket`` (history 1), as nats-py would create it."""
    return StreamConfig(
        name=f"KV_{bucket}",
        description=f"KV bucket {bucket}: {holds}",
        subjects=[f"$KV.{bucket}.>"],
        retention=RetentionPolicy.LIMITS,
        storage=storage,
        num_replicas=replicas,
        allow_direct=True,
        allow_rollup_hdrs=True,
        allow_msg_ttl=allow_msg_ttl,
        deny_delete=True,
        discard=DiscardPolicy.NEW,
        duplicate_window=120.0 if max_age is None else min(120.0, max_age),
        max_msgs_per_subject=1,
        max_consumers=-1,
        max_msgs=-1,
        max_age=max_age,
    )


_RETRY_FIRST_S = 0.25  # ensure's first wait for JetStream; doubled at each try, up to:
_RETRY_MAX_S = 5.0


async def ensure(js: JetStreamContext, settings: Settings) -> KeyValue:
    """Create or update the topology; return the seen bucket. Raises :class:`TopologyError`.

    While JetStream cannot take it yet (it has no leader, or cannot place the replicas: a
    cluster forming or electing, a node restarting; requests time out meanwhile), it tries again,
    0.25 s apart doubling to 5 s, for ``topology_wait_s``; then raises what it last got
    (:class:`TopologyUnavailable`, or the request's timeout). Every try is idempotent.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.topology_wait_s
    delay = _RETRY_FIRST_S
    while True:
        try:
            return await _ensure(js, settings)
        except (TopologyUnavailable, NatsTimeoutError, APIError) as e:
            if isinstance(e, APIError) and e.code != _UNAVAILABLE:
                raise
            left = deadline - loop.time()
            if left <= 0:
                raise
            wait = min(delay, left)
            log.warning("JetStream cannot take the topology yet, again in %.2g s: %r", wait, e)
            await asyncio.sleep(wait)
            delay = min(delay * 2, _RETRY_MAX_S)


async def _ensure(js: JetStreamContext, settings: Settings) -> KeyValue:
    """One try of :func:`ensure`.

    It reads first (a few list requests) and writes only what is missing or differs from the
    declaration, so a service starting against a topology in place changes nothing; creating
    every stream and consumer again cost a request for each, and nats-server's and the
    service's CPU, at each start of each service.

    With ``create_topology`` off, only :func:`verify` it: a service whose NATS user may not
    create or change streams (compose, where the admin applies it with ``jetcrawl topology
    --apply``) still refuses to run against a missing or different topology.
    """
    topology = Topology.from_settings(settings)
    if not settings.create_topology:
        await check_shard_count(js, settings.shards)
        await verify(js, topology)
        return await js.key_value(SEEN_BUCKET)
    streams = {info.config.name: info for info in await _listed(js.streams_info)}
    tasks = streams.get(TASKS_STREAM)
    if tasks is not None:
        _check_shards(tasks, settings.shards)
    for stream in topology.streams:
        have = streams.get(stream.name)
        if have is None:
            await _ensure_stream(js, stream)
        elif _differences("", stream.as_dict(), have.config.as_dict(), zeros=True):
            await _update_stream(js, stream)
    consumers: dict[str, dict[str | None, ConsumerInfo]] = {}
    for stream_name, consumer in topology.consumers:
        if stream_name not in consumers:
            listed = await _listed(partial(js.consumers_info, stream_name))
            consumers[stream_name] = {info.config.durable_name: info for info in listed}
        had = consumers[stream_name].get(consumer.durable_name)
        if had is not None and not _differences(
            "", consumer.as_dict(), had.config.as_dict(), zeros=True
        ):
            continue
        try:
            await js.add_consumer(stream_name, consumer)
        except APIError as e:
            raise _refusal(
                f"cannot create or update consumer {consumer.durable_name} on {stream_name}",
                e,
                consumer.num_replicas or settings.replicas,
            ) from e
    return await js.key_value(SEEN_BUCKET)


async def _listed(page: Callable[[int], Awaitable[list[T]]]) -> list[T]:
    """Every entry of a JetStream list API (streams, a stream's consumers), page by page."""
    entries: list[T] = []
    while batch := await page(len(entries)):
        entries += batch
    return entries


async def check_shard_count(js: JetStreamContext, shards: int) -> None:
    try:
        info = await js.stream_info(TASKS_STREAM)
    except NotFoundError:
        return
    _check_shards(info, shards)


def _check_shards(info: StreamInfo, shards: int) -> None:
    recorded = (info.config.metadata or {}).get(SHARDS_METADATA_KEY)
    if recorded is None:
        raise TopologyError(
            f"stream {TASKS_STREAM} exists but was not created by jetcrawl "
            "(no shard count recorded)"
        )
    if int(recorded) != shards:
        raise ShardCountMismatch(existing=int(recorded), wanted=shards)


async def verify(js: JetStreamContext, topology: Topology) -> None:
    """Check that every stream and consumer exists with the fields we declare; read-only."""
    problems: list[str] = []
    for stream in topology.streams:
        try:
            info = await js.stream_info(stream.name or "")
        except NotFoundError:
            problems.append(f"stream {stream.name} is missing")
            continue
        problems += _differences(f"stream {stream.name}", stream.as_dict(), info.config.as_dict())
    for stream_name, consumer in topology.consumers:
        where = f"consumer {stream_name}/{consumer.durable_name}"
        try:
            cinfo = await js.consumer_info(stream_name, consumer.durable_name or "")
        except NotFoundError:
            problems.append(f"{where} is missing")
            continue
        problems += _differences(where, consumer.as_dict(), cinfo.config.as_dict())
    if problems:
        raise TopologyError(
            "the JetStream topology is not the one this service declares ("
            + "; ".join(problems)
            + "); apply it with `jetcrawl topology --apply` as a user that may change it"
        )


def _differences(
    where: str, wanted: dict[str, Any], actual: dict[str, Any], *, zeros: bool = False
) -> list[str]:
    """The declared fields ``actual`` does not have. A zero is nats-py's rendering of an unset
    duration, so the server's default: skipped, unless ``zeros`` (all but the duplicate window,
    the one the server fills in), which tells a limit someone set by hand from our "none"."""
    out = []
    for key, value in _clean(wanted).items():
        if value == 0 and not isinstance(value, bool) and (not zeros or key == DUPLICATE_WINDOW):
            continue
        have = actual.get(key)
        if key == "metadata":  # the server adds keys of its own (_nats.*)
            have = {k: v for k, v in (have or {}).items() if k in value}
        if have != value:
            out.append(f"{where} has {key}={have!r}, not {value!r}")
    return out


async def _ensure_stream(js: JetStreamContext, config: StreamConfig) -> None:
    try:
        await js.add_stream(config)
        return
    except APIError as e:
        if e.err_code != _API_STREAM_NAME_IN_USE:
            raise _refusal(f"cannot create stream {config.name}", e, config.num_replicas) from e
    await _update_stream(js, config)


async def _update_stream(js: JetStreamContext, config: StreamConfig) -> None:
    try:
        await js.update_stream(config)
    except APIError as e:
        raise _refusal(
            f"stream {config.name} exists with a config we cannot update", e, config.num_replicas
        ) from e


def _refusal(what: str, e: APIError, replicas: int | None) -> TopologyError:
    """The error for a refused create or update: :class:`TopologyUnavailable` when it can clear
    by itself (no leader yet; too few peers online, with room or the tags, for the replicas),
    which a young cluster answers for a while even after it placed other replicated streams."""
    if e.code == _UNAVAILABLE or e.err_code == _API_NO_SUITABLE_PEERS:
        return TopologyUnavailable(
            f"{what}: {e}; JetStream cannot place {replicas or 1} replica(s) now: it has no "
            "leader yet, or fewer peers online with room than that (a cluster still forming, "
            "a node down or full, or replicas above the cluster's size); retry when they are"
        )
    return TopologyError(f"{what}: {e}")


def as_cli_json(settings: Settings) -> dict[str, Any]:
    """The definitions as the ``nats`` CLI's ``--config`` files take them (durations in ns)."""
    topology = Topology.from_settings(settings)
    return {
        "streams": {s.name: _clean(s.as_dict()) for s in topology.streams},
        "consumers": {
            f"{stream}/{c.durable_name}": {"stream": stream, "config": _clean(c.as_dict())}
            for stream, c in topology.consumers
        },
    }


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}
