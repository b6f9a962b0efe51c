"""The ledger oracle of the fault tests: every admitted URL ends in exactly one result.

Admitted is what ``crawl_seen`` holds (read from the KV stream's subjects, as
:func:`tests.streams.seen_keys` does: no watcher race). A result belongs to the key its task
was admitted under (:attr:`jetcrawl.messages.Task.seen_key`: the fingerprint for the default
job). ``lost`` (admitted, no result) must be 0; ``duplicates`` (records beyond the first for one
key) are counted so a test can bound them; ``unexpected`` (a result nothing admitted) is a bug
of its own. Re-crawls (``gen`` > 0) are out of scope: the fault tests crawl once.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from nats.js import JetStreamContext

from jetcrawl.messages import DEFAULT_JOB, Result
from jetcrawl.topology import DEAD_STREAM, RESULTS_STREAM
from jetcrawl.urls import fingerprint
from tests.streams import seen_keys, stored


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


async def read_ledger(js: JetStreamContext) -> Ledger:
    """The ledger as the streams hold it now (call it once the crawl is drained)."""
    admitted = frozenset(await seen_keys(js))
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
