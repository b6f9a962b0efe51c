"""Applying the topology: every service makes JetStream hold what :mod:`jetcrawl.contract.topology`
declares before it starts.

:func:`ensure` creates what is missing and updates what drifted, and refuses to run against a
topology made with another shard count (recorded in the task streams' metadata) or another
partition count (the task streams' and seen buckets' names and metadata); with
``create_topology`` off it only :func:`verify`-ies. While JetStream cannot take it yet (no leader,
replicas not placeable) it tries again with backoff for ``topology_wait_s``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import ConsumerInfo, StreamConfig, StreamInfo
from nats.js.errors import APIError, NotFoundError
from nats.js.kv import KeyValue

from jetcrawl.contract.errors import (
    PartitionCountMismatch,
    ShardCountMismatch,
    TopologyError,
    TopologyUnavailable,
)
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import (
    PARTITIONS_METADATA_KEY,
    SEEN_STREAM,
    SHARDS_METADATA_KEY,
    TASKS_STREAM,
    Topology,
    declared,
    seen_bucket,
    seen_stream,
    tasks_stream,
)
from jetcrawl.plumbing.backoff import backoff_s

__all__ = ["check_partitions", "check_shard_count", "ensure", "task_stream_infos", "verify"]

log = logging.getLogger(__name__)

_API_STREAM_NAME_IN_USE = 10058
_API_NO_SUITABLE_PEERS = 10005  # "no suitable peers for placement" (offline, full, untagged)
_UNAVAILABLE = 503  # JetStream has no leader to take the request

DUPLICATE_WINDOW = "duplicate_window"

T = TypeVar("T")

_RETRY_FIRST_S = 0.25  # ensure's first wait for JetStream; doubled at each try, up to:
_RETRY_MAX_S = 5.0


async def ensure(js: JetStreamContext, settings: Settings) -> KeyValue:
    """Create or update the topology; return the seen set's first bucket. Raises
    :class:`TopologyError`.

    While JetStream cannot take it yet (it has no leader, or cannot place the replicas: a
    cluster forming or electing, a node restarting; requests time out meanwhile), it tries again,
    0.25 s apart doubling to 5 s, for ``topology_wait_s``; then raises what it last got
    (:class:`TopologyUnavailable`, or the request's timeout). Every try is idempotent.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.topology_wait_s
    failed = 0
    while True:
        try:
            return await _ensure(js, settings)
        except (TopologyUnavailable, NatsTimeoutError, APIError) as e:
            if isinstance(e, APIError) and e.code != _UNAVAILABLE:
                raise
            left = deadline - loop.time()
            if left <= 0:
                raise
            failed += 1
            wait = min(backoff_s(failed, _RETRY_FIRST_S, _RETRY_MAX_S), left)
            log.warning("JetStream cannot take the topology yet, again in %.2g s: %r", wait, e)
            await asyncio.sleep(wait)


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
        await check_partitions(js, settings.partitions)
        await verify(js, topology)
        return await js.key_value(seen_bucket(0, settings.partitions))
    streams = {info.config.name: info for info in await _listed(js.streams_info)}
    await check_partitions(js, settings.partitions)
    tasks = streams.get(tasks_stream(0, settings.partitions))
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
    return await js.key_value(seen_bucket(0, settings.partitions))


async def _listed(page: Callable[[int], Awaitable[list[T]]]) -> list[T]:
    """Every entry of a JetStream list API (streams, a stream's consumers), page by page."""
    entries: list[T] = []
    while batch := await page(len(entries)):
        entries += batch
    return entries


async def task_stream_infos(
    js: JetStreamContext, subjects_filter: str | None = None
) -> list[StreamInfo]:
    """The task streams JetStream holds, partition 0 first: ``CRAWL_TASKS``, or the K of
    ``CRAWL_TASKS_<p>`` (K as the first records it), so that a reader needs neither the
    partition count nor leave to list streams. NotFoundError when there are none."""
    try:
        return [await js.stream_info(TASKS_STREAM, subjects_filter=subjects_filter)]
    except NotFoundError:
        first = await js.stream_info(tasks_stream(0, 2), subjects_filter=subjects_filter)
    k = int((first.config.metadata or {}).get(PARTITIONS_METADATA_KEY, "1"))
    rest = [await js.stream_info(tasks_stream(p, k), subjects_filter=subjects_filter)
            for p in range(1, k)]  # fmt: skip
    return [first, *rest]


async def check_shard_count(js: JetStreamContext, shards: int) -> None:
    try:
        first, *_ = await task_stream_infos(js)
    except NotFoundError:
        return
    _check_shards(first, shards)


async def check_partitions(js: JetStreamContext, partitions: int) -> None:
    """Refuse task streams or a seen set made with another partition count: a shard's lanes
    would be looked for in another stream than the one holding its tasks, a URL's mark in
    another bucket (and the URL admitted again). One partition is ``CRAWL_TASKS`` and
    ``crawl_seen``; K > 1 are ``CRAWL_TASKS_<p>`` and ``crawl_seen_<p>``, each recording K."""
    for single, first in ((TASKS_STREAM, tasks_stream(0, 2)), (SEEN_STREAM, seen_stream(0, 2))):
        for name in (single, first):
            try:
                info = await js.stream_info(name)
            except NotFoundError:
                continue
            recorded = (info.config.metadata or {}).get(PARTITIONS_METADATA_KEY)
            existing = 1 if name == single else int(recorded or 0)
            if existing != partitions:
                raise PartitionCountMismatch(existing=existing, wanted=partitions, stream=name)


def _check_shards(info: StreamInfo, shards: int) -> None:
    recorded = (info.config.metadata or {}).get(SHARDS_METADATA_KEY)
    if recorded is None:
        raise TopologyError(
            f"stream {info.config.name} exists but was not created by jetcrawl "
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
    for key, value in declared(wanted).items():
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
