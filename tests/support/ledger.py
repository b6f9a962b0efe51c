"""The ledger oracle of the fault tests: every admitted URL ends in exactly one result.

Admitted is what ``crawl_seen`` holds (read from the KV stream's subjects, as
:func:`tests.support.streams.seen_keys` does: no watcher race). A result belongs to the key its task
was admitted under (:attr:`jetcrawl.contract.messages.Task.seen_key`: the fingerprint for the
default job). ``lost`` (admitted, no result) must be 0; ``duplicates`` (records beyond the first
for one key) are counted so a test can bound them; ``unexpected`` (a result nothing admitted) is a
bug of its own. Re-crawls (``gen`` > 0) are out of scope: the fault tests crawl once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError
from nats.js import JetStreamContext

from jetcrawl.contract.messages import DEFAULT_JOB, Result, Task
from jetcrawl.contract.topology import (
    DEAD_STREAM,
    RESULTS_PREFIX,
    RESULTS_STREAM,
    TASKS_PREFIX,
    lane_consumer,
    lane_of,
    seen_stream,
    seen_subject_prefix,
    tasks_streams,
)
from jetcrawl.contract.urls import fingerprint
from tests.support.streams import Stored, seen_keys, stored


def admitted_key(result: Result) -> str:
    """The ``crawl_seen`` key the result's task was admitted under (``Task.seen_key``)."""
    if result.job == DEFAULT_JOB:
        return result.fp
    return fingerprint(f"{result.job}\n{result.url}")


@dataclass(frozen=True, slots=True)
class Ledger:
    admitted: frozenset[str]
    records: Counter[str]  # admitted key -> result records stored for it
    outcomes: Counter[str]  # outcome -> keys (first record of each)
    dead_letters: int  # CRAWL_DEAD records (kept for replay; not a result)

    @property
    def lost(self) -> frozenset[str]:
        return self.admitted - self.records.keys()

    @property
    def unexpected(self) -> frozenset[str]:
        return frozenset(self.records.keys() - self.admitted)

    @property
    def duplicates(self) -> int:
        return sum(n - 1 for n in self.records.values())

    @property
    def ok(self) -> bool:
        return not self.lost and not self.unexpected

    def summary(self) -> str:
        outcomes = ", ".join(f"{k} {n}" for k, n in sorted(self.outcomes.items())) or "none"
        return (
            f"ledger: admitted {len(self.admitted)}, with a result {len(self.records)}, "
            f"lost {len(self.lost)}, unexpected {len(self.unexpected)}, "
            f"result records {sum(self.records.values())}, duplicates {self.duplicates}, "
            f"dead letters {self.dead_letters}; outcomes: {outcomes}"
        )


async def read_ledger(js: JetStreamContext, partitions: int = 1) -> Ledger:
    """The ledger as the streams hold it now (call it once the crawl is drained)."""
    admitted = frozenset(await seen_keys(js, partitions))
    records: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    for message in await stored(js, RESULTS_STREAM):
        result = Result.from_wire(message.data)
        key = admitted_key(result)
        if key not in records:
            outcomes[result.outcome] += 1
        records[key] += 1
    dead = (await js.stream_info(DEAD_STREAM)).state.messages
    return Ledger(admitted, records, outcomes, dead)


@dataclass(slots=True)
class Tap:
    """The tasks and results that went over the wire (core NATS), by admitted key, whether or not
    JetStream stored them: where a lost URL stopped. A subscriber misses what is published while
    its connection is down, so a 0 here says "not seen", never "never sent"."""

    tasks: Counter[str] = field(default_factory=Counter)
    results: Counter[str] = field(default_factory=Counter)
    urls: dict[str, str] = field(default_factory=dict)
    _subs: list[Subscription] = field(default_factory=list)

    async def start(self, nc: NATS) -> None:
        self._subs = [
            await nc.subscribe(f"{TASKS_PREFIX}>", cb=self._task),
            await nc.subscribe(f"{RESULTS_PREFIX}*", cb=self._result),
        ]

    async def _task(self, msg: Msg) -> None:
        task = Task.from_wire(msg.data)
        self.tasks[task.seen_key] += 1
        self.urls[task.seen_key] = task.url

    async def _result(self, msg: Msg) -> None:
        self.results[admitted_key(Result.from_wire(msg.data))] += 1

    async def explain(
        self,
        js: JetStreamContext,
        keys: Iterable[str],
        logs: dict[str, str],
        most: int = 10,
        partitions: int = 1,
    ) -> str:
        """For each of ``keys`` (lost ones): its URL, its seen mark, what the tap saw of its
        task and result, and the service log lines that name it."""
        lines = []
        left: dict[str, tuple[str, Stored]] = {}
        for name in tasks_streams(partitions):
            try:
                left |= {Task.from_wire(m.data).seen_key: (name, m) for m in await stored(js, name)}
            except NatsError as e:
                lines.append(f"{name} unread: {e!r}")
        for key in sorted(keys)[:most]:
            url = self.urls.get(key, "?")
            origin = "mark unread"
            for p in range(partitions):
                stream, prefix = (
                    seen_stream(p, partitions),
                    seen_subject_prefix(p, partitions),
                )
                try:
                    mark = await js.get_msg(stream, subject=f"{prefix}{key}")
                    origin = f"origin {(mark.data or b'').decode()} revision {mark.seq} in {stream}"
                    break
                except NatsError as e:
                    origin = f"mark unread: {e!r}"
            lines.append(
                f"{key} {url}: {origin}; task sent {self.tasks[key]}x, "
                f"result sent {self.results[key]}x"
            )
            if key in left:  # stranded: no consumer will deliver it?
                name, task = left[key]
                consumer = lane_consumer(*lane_of(task.subject))
                try:
                    info = await js.consumer_info(name, consumer)
                    state = (
                        f"delivered {info.delivered.stream_seq}, "
                        f"ack floor {info.ack_floor.stream_seq}, "
                        f"pending {info.num_pending}, ack pending {info.num_ack_pending}"
                    )
                except NatsError as e:
                    state = f"unread: {e!r}"
                lines.append(f"  still in {name} at seq {task.seq}; {consumer}: {state}")
            for name, log in logs.items():
                lines += [f"  {name}: {line}" for line in log.splitlines() if url in line][:5]
        return "\n".join(lines)
