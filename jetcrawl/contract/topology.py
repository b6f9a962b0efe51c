"""The JetStream topology as code: subjects, streams, consumers and buckets, declared; no I/O.

:class:`Topology` holds every stream and consumer for one set of settings; the shard count is
recorded in the ``CRAWL_TASKS`` stream's metadata. :func:`as_cli_json` renders the same definitions
as the JSON that ``nats stream add --config`` and ``nats consumer add --config`` accept.
Every service applies them at start with :func:`jetcrawl.plumbing.topology.ensure`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)

from jetcrawl.contract import PROTOCOL_VERSION
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


def as_cli_json(settings: Settings) -> dict[str, Any]:
    """The definitions as the ``nats`` CLI's ``--config`` files take them (durations in ns)."""
    topology = Topology.from_settings(settings)
    return {
        "streams": {s.name: declared(s.as_dict()) for s in topology.streams},
        "consumers": {
            f"{stream}/{c.durable_name}": {"stream": stream, "config": declared(c.as_dict())}
            for stream, c in topology.consumers
        },
    }


def declared(d: dict[str, Any]) -> dict[str, Any]:
    """The fields of a config's ``as_dict()`` that it sets (nats-py renders unset ones as None)."""
    return {k: v for k, v in d.items() if v is not None}
