"""The JetStream topology as code: subjects, streams, consumers and buckets, declared; no I/O.

:class:`Topology` holds every stream and consumer for one set of settings. With ``partitions``
K > 1, the tasks and the seen set are each K streams by shard range (K Raft groups, whose leaders
can sit on different servers): partition ``p`` holds the tasks of its shards in ``CRAWL_TASKS_<p>``
and their URLs' marks in ``crawl_seen_<p>``. The shard count is recorded in the task streams'
metadata, the partition count in the partitions' streams'. :func:`as_cli_json` renders
the same definitions as the JSON that ``nats stream add --config`` and ``nats consumer add
--config`` accept.
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
    Placement,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)

from jetcrawl.contract import PROTOCOL_VERSION
from jetcrawl.contract.messages import DEFAULT_JOB, DEFAULT_PRIORITY
from jetcrawl.contract.settings import Settings

# --- subjects
SEEDS = "crawl.seeds"
DISCOVERED = "crawl.discovered"
TASKS_PREFIX = "crawl.tasks."
RESULTS_PREFIX = "crawl.results."
ITEMS_PREFIX = "crawl.items."
DEAD_PREFIX = "crawl.dead."
# What nats-server publishes when a consumer gives up on a message (MaxDeliver reached): a task
# consumer (a poison task: max_deliveries_advisories), or the dispatchers' intake (a frontier
# message it could not admit).
MAX_DELIVERIES_ADVISORY_PREFIX = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES."

# --- streams, consumers, buckets
FRONTIER_STREAM = "CRAWL_FRONTIER"
TASKS_STREAM = "CRAWL_TASKS"  # the tasks when there is one partition (partitions=1)
RESULTS_STREAM = "CRAWL_RESULTS"
ITEMS_STREAM = "CRAWL_ITEMS"
DEAD_STREAM = "CRAWL_DEAD"
ADVISORIES_STREAM = "CRAWL_ADVISORIES"
DISPATCH_CONSUMER = "dispatch"
POISON_CONSUMER = "poison"
ADVISORIES_MAX_AGE_S = 7 * 24 * 3600.0
SEEN_BUCKET = "crawl_seen"  # the seen set when there is one partition (partitions=1)
SEEN_STREAM = f"KV_{SEEN_BUCKET}"
SEEN_SUBJECT_PREFIX = f"$KV.{SEEN_BUCKET}."
JOBS_BUCKET = "crawl_jobs"
JOBS_STREAM = f"KV_{JOBS_BUCKET}"
VALIDATORS_BUCKET = "crawl_validators"
VALIDATORS_STREAM = f"KV_{VALIDATORS_BUCKET}"
BODIES_BUCKET = "crawl_bodies"
WORKERS_BUCKET = "crawl_workers"
SPECS_BUCKET = "crawl_specs"
CONTROL_BUCKET = "crawl_control"  # job name -> its run state (contract/control.py)
CONTROL_STREAM = f"KV_{CONTROL_BUCKET}"
SPECS_STREAM = f"KV_{SPECS_BUCKET}"
SPEC_VERSIONS_KEPT = 64  # versions of one job spec kept in KV, for `jetcrawl job diff`
WORKERS_STREAM = f"KV_{WORKERS_BUCKET}"
WORKER_REPORTS_MAX_AGE_S = 60.0  # a stopped worker's last report is gone after this
BODIES_STREAM = f"OBJ_{BODIES_BUCKET}"

SHARDS_METADATA_KEY = "jetcrawl_shards"
PROTOCOL_METADATA_KEY = "jetcrawl_protocol"
PARTITIONS_METADATA_KEY = "jetcrawl_partitions"


def task_subject(shard: int, level: int = DEFAULT_PRIORITY, job: str = DEFAULT_JOB) -> str:
    """A task's subject: its host's shard, its priority level and its job (a *lane*)."""
    return f"{TASKS_PREFIX}{shard}.{level}.{job}"


def shard_tasks(shard: int) -> str:
    """The subjects of every lane of ``shard``."""
    return f"{TASKS_PREFIX}{shard}.>"


def job_tasks(job: str) -> str:
    """The subjects of every lane of ``job``, on every shard and level."""
    return f"{TASKS_PREFIX}*.*.{job}"


def lane_of(subject: str) -> tuple[int, int, str]:
    """(shard, level, job) of a task subject; ValueError for another subject."""
    parts = subject.split(".")
    if len(parts) != 5 or f"{parts[0]}.{parts[1]}." != TASKS_PREFIX:
        raise ValueError(f"not a task subject: {subject!r}")
    return int(parts[2]), int(parts[3]), parts[4]


def result_subject(shard: int) -> str:
    return f"{RESULTS_PREFIX}{shard}"


def item_subject(job: str) -> str:
    return f"{ITEMS_PREFIX}{job}"


def dead_subject(stage: str) -> str:
    return f"{DEAD_PREFIX}{stage}"


def lane_consumer(shard: int, level: int, job: str) -> str:
    """The durable pull consumer of one lane; its shard's owner makes it when it finds tasks."""
    return f"tasks-{shard}-{level}-{job}"


def lane_config(settings: Settings, shard: int, level: int, job: str) -> ConsumerConfig:
    """The consumer of one lane. Lanes come and go with jobs and levels, so their consumers are
    made on demand (worker/lanes.py) and removed by the server once idle ``lane_idle_s``: the
    tasks stay in the work-queue stream, and a consumer made again delivers them."""
    return ConsumerConfig(
        durable_name=lane_consumer(shard, level, job),
        description=f"tasks of shard {shard}, priority {level}, job {job}",
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL,
        ack_wait=settings.ack_wait_s,
        # One lane may fill its owner's whole holding (a shard of one busy job), and a waiting
        # room that one lane cannot fill leaves the slow hosts' tasks unseen behind it.
        max_ack_pending=max(settings.max_ack_pending, settings.holding),
        # Room for the politeness and pause hand-backs, which are no attempts (the worker
        # subtracts them); a task crashing its worker every time still ends here.
        max_deliver=settings.task_max_deliver + settings.max_deferrals,
        filter_subject=task_subject(shard, level, job),
        inactive_threshold=settings.lane_idle_s,
    )


def tasks_stream(partition: int, partitions: int) -> str:
    """The stream of one partition's tasks: ``CRAWL_TASKS`` alone, else ``CRAWL_TASKS_<p>``."""
    return TASKS_STREAM if partitions == 1 else f"{TASKS_STREAM}_{partition}"


def tasks_streams(partitions: int) -> list[str]:
    """Every stream of tasks, partition 0 first."""
    return [tasks_stream(p, partitions) for p in range(partitions)]


def shard_tasks_stream(shard: int, settings: Settings) -> str:
    """The stream holding ``shard``'s tasks: where its lanes' consumers are made."""
    return tasks_stream(
        shard_partition(shard, settings.shards, settings.partitions), settings.partitions
    )


def partition_shards(partition: int, partitions: int, shards: int) -> range:
    """The shards of one partition: a contiguous range (see :func:`shard_partition`)."""
    return range(-(-partition * shards // partitions), -(-(partition + 1) * shards // partitions))


def max_deliveries_advisories(partitions: int) -> list[str]:
    """The advisories kept for the poison collector: any lane's consumer of any task stream,
    and the dispatchers' intake."""
    return [
        *(f"{MAX_DELIVERIES_ADVISORY_PREFIX}{name}.*" for name in tasks_streams(partitions)),
        f"{MAX_DELIVERIES_ADVISORY_PREFIX}{FRONTIER_STREAM}.{DISPATCH_CONSUMER}",
    ]


def seen_bucket(partition: int, partitions: int) -> str:
    """The KV bucket of one seen-set partition: ``crawl_seen`` alone, else ``crawl_seen_<p>``."""
    return SEEN_BUCKET if partitions == 1 else f"{SEEN_BUCKET}_{partition}"


def seen_stream(partition: int, partitions: int) -> str:
    return f"KV_{seen_bucket(partition, partitions)}"


def seen_subject_prefix(partition: int, partitions: int) -> str:
    return f"$KV.{seen_bucket(partition, partitions)}."


def seen_streams(partitions: int) -> list[str]:
    """Every stream of the seen set, partition 0 first."""
    return [seen_stream(p, partitions) for p in range(partitions)]


def shard_partition(shard: int, shards: int, partitions: int) -> int:
    """The partition holding a shard's tasks and its URLs' marks: contiguous shard ranges, so a
    partition's URLs are those of a fixed set of hosts."""
    return shard * partitions // shards


# StreamConfig fields every KV bucket's stream has (history 1), as nats-py's create_key_value
# makes them; and those of the object store, as its create_object_store does.
_KV = {
    "allow_direct": True,
    "allow_rollup_hdrs": True,
    "deny_delete": True,
    "discard": DiscardPolicy.NEW,
    "max_msgs_per_subject": 1,
    "max_consumers": -1,
    "max_msgs": -1,
}
_OBJECT_STORE = {
    "allow_direct": True,
    "allow_rollup_hdrs": True,
    "discard": DiscardPolicy.NEW,
    "max_msgs": -1,
}
_KV_DUPLICATE_WINDOW_S = 120.0

# One stream: its name, subjects, retention, description, and any further StreamConfig fields.
_Stream = tuple[str, list[str], RetentionPolicy, str, dict[str, Any]]


def _streams(settings: Settings) -> tuple[_Stream, ...]:
    """Every stream, in the order they are made."""
    work, limits = RetentionPolicy.WORK_QUEUE, RetentionPolicy.LIMITS
    dedupe = {"duplicate_window": settings.duplicate_window_s}
    return (
        (FRONTIER_STREAM, [SEEDS, DISCOVERED], work,
         "seeds and discovered links waiting for the dispatcher",
         {**dedupe, "discard": DiscardPolicy.OLD}),
        *_tasks(settings),
        (RESULTS_STREAM, [f"{RESULTS_PREFIX}*"], limits,
         "one result record per crawled task",
         dedupe),
        (ITEMS_STREAM, [f"{ITEMS_PREFIX}*"], limits,
         "items extracted from pages, per job on crawl.items.<job>",
         dedupe),
        (DEAD_STREAM, [f"{DEAD_PREFIX}>"], limits,
         "dead letters: rejected input and exhausted retries, with reasons",
         dedupe),
        # Advisories are plain messages: kept here until the dispatchers' poison consumer has
        # turned each into a dead letter (dispatcher/poison.py).
        (ADVISORIES_STREAM, max_deliveries_advisories(settings.partitions), work,
         "max-deliveries advisories: poison tasks, unadmitted frontier input",
         {"max_age": ADVISORIES_MAX_AGE_S}),
        # A mark may expire: re-crawl (recrawl_after_s). One bucket per partition.
        *_seen(settings),
        _kv(VALIDATORS_BUCKET, "ETag and Last-Modified for re-crawls"),
        # Page bodies, when kept (gzip-compressed by jetcrawl.plumbing.bodies).
        (BODIES_STREAM, [f"$O.{BODIES_BUCKET}.C.>", f"$O.{BODIES_BUCKET}.M.>"], limits,
         f"object store {BODIES_BUCKET}: page bodies by fingerprint and digest",
         _OBJECT_STORE),
        _kv(JOBS_BUCKET, "per-job and per-host admission counters"),
        _kv(SPECS_BUCKET, "job name -> its spec, versions kept",
            max_msgs_per_subject=SPEC_VERSIONS_KEPT),
        _kv(CONTROL_BUCKET, "job name -> running, paused or cancelled"),
        _kv(WORKERS_BUCKET, "worker id -> its latest report (waiting room, hand-backs)",
            max_age=WORKER_REPORTS_MAX_AGE_S),
    )  # fmt: skip


def _tasks(settings: Settings) -> list[_Stream]:
    """The task streams: the one stream of every shard, or K by shard range recording K."""
    k, shards = settings.partitions, settings.shards
    holds = "admitted URLs, by host's shard, level and job: crawl.tasks.<shard>.<level>.<job>"
    metadata = {SHARDS_METADATA_KEY: str(shards), PROTOCOL_METADATA_KEY: str(PROTOCOL_VERSION)}
    dedupe = {"duplicate_window": settings.duplicate_window_s}
    if k == 1:
        return [
            (
                TASKS_STREAM,
                [f"{TASKS_PREFIX}>"],
                RetentionPolicy.WORK_QUEUE,
                holds,
                {**dedupe, "metadata": metadata, **_placed(0, settings)},
            )
        ]
    return [
        (tasks_stream(p, k), [shard_tasks(s) for s in partition_shards(p, k, shards)],
         RetentionPolicy.WORK_QUEUE, f"{holds}, of shards {_shard_range(p, k, shards)}",
         {**dedupe, "metadata": {**metadata, PARTITIONS_METADATA_KEY: str(k)},
          **_placed(p, settings)})
        for p in range(k)
    ]  # fmt: skip


def _seen(settings: Settings) -> list[_Stream]:
    """The seen set's streams: the one bucket as ever, or K recording their count."""
    k = settings.partitions
    holds = "URL fingerprint -> admitting frontier sequence"
    if k == 1:
        return [_kv(SEEN_BUCKET, holds, allow_msg_ttl=True, **_placed(0, settings))]
    return [
        _kv(seen_bucket(p, k), f"{holds}, of shards {_shard_range(p, k, settings.shards)}",
            allow_msg_ttl=True, metadata={PARTITIONS_METADATA_KEY: str(k)},
            **_placed(p, settings))
        for p in range(k)
    ]  # fmt: skip


def _placed(partition: int, settings: Settings) -> dict[str, Any]:
    """The placement of a partition's streams: on the servers of its tag, if tags are set."""
    tags = settings.partition_tags
    return {"placement": Placement(tags=[tags[partition % len(tags)]])} if tags else {}


def _shard_range(partition: int, partitions: int, shards: int) -> str:
    mine = partition_shards(partition, partitions, shards)
    return f"{mine[0]}-{mine[-1]}"


def _kv(bucket: str, holds: str, *, max_age: float | None = None, **extras: Any) -> _Stream:
    """The stream behind KV bucket ``bucket``."""
    window = _KV_DUPLICATE_WINDOW_S if max_age is None else min(_KV_DUPLICATE_WINDOW_S, max_age)
    return (
        f"KV_{bucket}",
        [f"$KV.{bucket}.>"],
        RetentionPolicy.LIMITS,
        f"KV bucket {bucket}: {holds}",
        {**_KV, "duplicate_window": window, "max_age": max_age, **extras},
    )


@dataclass(frozen=True, slots=True)
class Topology:
    """Every stream and consumer definition for one shard count and set of timings."""

    streams: tuple[StreamConfig, ...]
    consumers: tuple[tuple[str, ConsumerConfig], ...]  # (stream name, config)

    @classmethod
    def from_settings(cls, settings: Settings) -> Topology:
        streams = tuple(
            StreamConfig(
                name=name,
                description=description,
                subjects=subjects,
                retention=retention,
                storage=StorageType.FILE,
                num_replicas=settings.replicas,
                **extras,
            )
            for name, subjects, retention, description, extras in _streams(settings)
        )

        def pull(
            stream: str, durable: str, description: str, max_deliver: int, **extras: Any
        ) -> tuple[str, ConsumerConfig]:
            return stream, ConsumerConfig(
                durable_name=durable,
                description=description,
                ack_policy=AckPolicy.EXPLICIT,
                deliver_policy=DeliverPolicy.ALL,
                ack_wait=settings.ack_wait_s,
                max_ack_pending=settings.max_ack_pending,
                max_deliver=max_deliver,
                **extras,
            )

        consumers = (
            pull(
                FRONTIER_STREAM,
                DISPATCH_CONSUMER,
                "the dispatchers' shared intake",
                settings.frontier_max_deliver,
            ),
            pull(
                ADVISORIES_STREAM,
                POISON_CONSUMER,
                "the dispatchers' shared poison-task collector",
                settings.frontier_max_deliver,
            ),
        )  # the task consumers are per lane, made on demand: lane_config
        return cls(streams=streams, consumers=consumers)


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
