"""Which lane of a shard the owner takes tasks from next: priority levels, then jobs.

A shard's tasks are queued per *lane*, ``crawl.tasks.<shard>.<level>.<job>``, each with its own
consumer. :class:`LaneBoard` reads how many tasks every lane holds (a stream info per task
stream a poll, for the whole worker). A shard's :class:`Schedule` then picks, for each pull,
the lane and how many:

- **Levels**: the highest level with tasks goes first, except that each level is guaranteed a
  share of the shard's turns while it has tasks, by ``priority_weights`` (8:4:2:1: with all four
  waiting, level 3 gets one turn in 15). A level accrues its share of every turn taken; once it
  is owed ``priority_slack`` turns it goes next, for what it is owed. So a short burst of a
  higher level is never interleaved, and no level starves.
- **Jobs** of one level share it by their specs' ``priority.weight``: the job that has had the
  least per unit of weight goes next (weighted fair queueing), in small batches while another
  job of the level waits; a job that starts waiting joins at the others' mark, not behind.
- **Job states and rates**: a paused job's lanes are not taken (worker/parking.py holds what was
  taken already); a job over its ``max_pages_per_s`` waits for its tokens (:class:`JobRates`).

Turns are counted when tasks are taken into the worker: a host's politeness still decides when
each is fetched, so "first" means first in the host's line.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from nats.errors import Error as NatsError
from nats.js import JetStreamContext

from jetcrawl.contract.topology import TASKS_PREFIX, TASKS_STREAM, lane_of
from jetcrawl.plumbing.backoff import wait_set

__all__ = ["JobRates", "LaneBoard", "Schedule"]

log = logging.getLogger(__name__)

Lane = tuple[int, str]  # (level, job) within a shard

JOB_BATCH = 8  # tasks of one job per pull while another job of its level waits


class LaneBoard:
    """The tasks each lane holds, as the last poll of the task ``streams`` saw them.

    ``generation`` counts polls; a poll that sees a lane of a shard gain tasks wakes the shard's
    puller (``on_gain``). Counts include tasks delivered and not yet acked.
    """

    def __init__(
        self, js: JetStreamContext, poll_s: float, streams: Sequence[str] = (TASKS_STREAM,)
    ) -> None:
        self._js = js
        self._poll_s = poll_s
        self._streams = tuple(streams)  # one per partition
        self.generation = 0
        self._shards: dict[int, dict[Lane, int]] = {}
        self._jobs: dict[str, int] = {}  # tasks of each job, every shard
        self._wakers: dict[int, Callable[[], None]] = {}  # shard -> called when its lanes gain
        self.ready = asyncio.Event()  # the first poll answered

    def lanes(self, shard: int) -> Mapping[Lane, int]:
        return self._shards.get(shard, {})

    def job_total(self, job: str) -> int:
        return self._jobs.get(job, 0)

    def job_on(self, job: str, shards: Iterable[int]) -> int:
        """The job's tasks on ``shards``."""
        return sum(n for s in shards for (_, j), n in self._shards.get(s, {}).items() if j == job)

    def on_gain(self, shard: int, wake: Callable[[], None] | None) -> None:
        """Call ``wake`` when a poll sees a lane of ``shard`` gain tasks (None: no more)."""
        if wake is None:
            self._wakers.pop(shard, None)
        else:
            self._wakers[shard] = wake

    async def run(self, stopping: asyncio.Event) -> None:
        """Poll until ``stopping``; a failed poll is logged and tried again next time."""
        failures = 0
        while not stopping.is_set():
            try:
                subjects: dict[str, int] = {}
                for name in self._streams:
                    info = await self._js.stream_info(name, subjects_filter=f"{TASKS_PREFIX}>")
                    subjects.update(info.state.subjects or {})
                failures = 0
            except (NatsError, TimeoutError) as e:
                failures += 1
                if failures == 1 or failures % 100 == 0:
                    log.warning("reading the task lanes failed (%d in a row): %r", failures, e)
            else:
                self.update(subjects)
            await wait_set(stopping, self._poll_s)

    def update(self, subjects: Mapping[str, int]) -> None:
        shards: dict[int, dict[Lane, int]] = {}
        jobs: dict[str, int] = {}
        for subject, count in subjects.items():
            try:
                shard, level, job = lane_of(subject)
            except ValueError:
                continue  # not a lane (a task published by hand to a wrong subject)
            shards.setdefault(shard, {})[(level, job)] = count
            jobs[job] = jobs.get(job, 0) + count
        for shard, lanes in shards.items():
            before = self._shards.get(shard, {})
            wake = self._wakers.get(shard)
            if wake is not None and any(n > before.get(lane, 0) for lane, n in lanes.items()):
                wake()
        self._shards, self._jobs = shards, jobs
        self.generation += 1
        self.ready.set()


@dataclass(slots=True)
class _Level:
    owed: float = 0.0  # turns of its guaranteed share not yet had
    marks: dict[str, float] = field(default_factory=dict)  # job -> turns had / weight


class Schedule:
    """One shard's choice of lane: pure, given the lanes that can be taken now."""

    def __init__(self, weights: tuple[int, ...], slack: int) -> None:
        self._weights = weights
        self._slack = slack
        self._levels = [_Level() for _ in weights]

    def next(
        self, ready: Mapping[Lane, int], room: int, job_weight: Callable[[str], int]
    ) -> tuple[Lane, int] | None:
        """The lane to take from and how many, of ``ready`` (lane -> tasks it can give), with
        ``room`` places free; None if nothing is ready."""
        levels = sorted({level for level, _ in ready})
        if not levels or room < 1:
            return None
        owed = [lv for lv in levels[1:] if self._levels[lv].owed >= self._slack]
        if owed:
            level = max(owed, key=lambda lv: self._levels[lv].owed)
            at_most = math.ceil(self._levels[level].owed)
        else:
            level = levels[0]
            at_most = room  # an owed level goes first at the next pull
        jobs = {job: n for (lv, job), n in ready.items() if lv == level}
        job = self._job(level, jobs, job_weight)
        if len(jobs) > 1:
            at_most = min(at_most, JOB_BATCH * job_weight(job))
        return (level, job), max(1, min(at_most, room, jobs[job]))

    def took(
        self, lane: Lane, n: int, waiting: Iterable[int], job_weight: Callable[[str], int]
    ) -> None:
        """``n`` tasks were taken from ``lane`` while ``waiting`` levels had tasks."""
        if n <= 0:
            return
        level, job = lane
        waiting = set(waiting) | {level}
        total = sum(self._weights[lv] for lv in waiting)
        for lv, state in enumerate(self._levels):
            if lv in waiting:
                state.owed += n * self._weights[lv] / total
            else:
                state.owed = 0.0  # a share is guaranteed while a level waits, not banked
        taken = self._levels[level]
        taken.owed = max(0.0, taken.owed - n)
        taken.marks[job] = taken.marks.get(job, 0.0) + n / job_weight(job)

    def _job(self, level: int, jobs: Mapping[str, int], job_weight: Callable[[str], int]) -> str:
        marks = self._levels[level].marks
        # A job that starts waiting joins at the lowest mark of the others: it is served
        # fairly from now, not repaid for the time it had nothing to crawl.
        floor = min((marks[j] for j in jobs if j in marks), default=0.0)
        for job in jobs:
            if marks.get(job, floor) < floor:
                marks[job] = floor
            marks.setdefault(job, floor)
        for job in list(marks):
            if job not in jobs:
                del marks[job]  # no longer waiting: it joins afresh when it comes back
        return min(jobs, key=lambda j: (marks[j], j))


class JobRates:
    """Each capped job's tokens on this worker: its ``max_pages_per_s`` shared out among the
    workers in proportion to the job's tasks on the shards each owns (what the lane board
    shows every worker alike), so the mesh together stays within the cap. The worker keeps two:
    one paces what a shard takes in (so capped tasks do not fill the holding), one what is
    fetched (so tasks taken in together, or waiting for robots.txt, do not go out at once).

    Tokens saved up while a job waits are a burst, at most ``burst_s`` seconds' worth (and one
    token): the intake's second's worth lets a shard pull a batch; the fetches keep none, so in
    any second a worker fetches at most one page beyond its share of the cap, and the mesh at
    most one a worker beyond the cap."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, burst_s: float = 1.0) -> None:
        self._clock = clock
        self._burst_s = burst_s
        self._tokens: dict[str, tuple[float, float]] = {}  # job -> (tokens, at)

    def available(self, job: str, rate: float) -> int:
        """Whole tokens ``job`` has now at ``rate`` pages/s (``burst_s``' worth at most)."""
        now = self._clock()
        tokens, at = self._tokens.get(job, (1.0, now))
        tokens = min(max(1.0, rate * self._burst_s), tokens + (now - at) * rate)
        self._tokens[job] = (tokens, now)
        return int(tokens)

    def spend(self, job: str, n: int) -> None:
        tokens, at = self._tokens.get(job, (0.0, self._clock()))
        self._tokens[job] = (tokens - n, at)

    async def acquire(self, job: str, rate: Callable[[], float | None]) -> None:
        """Take one token of ``job``, waiting for it; ``rate()`` is read again after a wait
        (None: the cap is gone)."""
        while (pace := rate()) is not None:
            if self.available(job, pace) >= 1:
                self.spend(job, 1)
                return
            await asyncio.sleep(self.due_in(job, pace))

    def due_in(self, job: str, rate: float) -> float:
        """Seconds until ``job`` has a whole token at ``rate``."""
        tokens, _ = self._tokens.get(job, (0.0, 0.0))
        return max(0.0, (1.0 - tokens) / rate) if rate > 0 else math.inf
