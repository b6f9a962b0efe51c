"""What a task's steps end in: an outcome the worker carries out (:mod:`jetcrawl.worker.crawl`).

Each step (robots, politeness, fetch, page) returns what the next one needs, or an outcome:
``Done`` (a result to store, with the page's links and maybe a dead letter, then the ack),
``Again`` (the task handed back to JetStream: at once, as a politeness hand-back, or for
another attempt) or ``Settled`` (acked unfetched: its job was cancelled). The I/O of an
outcome is in one place, ``TaskProcessor._carry_out``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from nats.aio.msg import Msg

from jetcrawl.contract.deadletters import DeadLetter
from jetcrawl.contract.messages import Discovered, Result, Task
from jetcrawl.plumbing.bus import Outgoing

__all__ = [
    "AGAIN_AT_ONCE",
    "AGAIN_HANDED_BACK",
    "AGAIN_RETRY",
    "Again",
    "Attempt",
    "Done",
    "Settled",
]

AGAIN_AT_ONCE: Final = "at_once"  # the lease is lost: the next owner takes it now (no attempt)
AGAIN_HANDED_BACK: Final = "handed_back"  # its host is busy beyond AckWait: a deferral (no attempt)
AGAIN_RETRY: Final = "retry"  # a failure worth another attempt
AgainKind = Literal["at_once", "handed_back", "retry"]


@dataclass(frozen=True, slots=True)
class Ownership:
    """Which shard a task came from, and the fencing token of our ownership of it."""

    shard: int
    fence: int


# A task's identity in this worker's memories: its stream and its sequence there (sequences are
# per stream, and there is a task stream per partition).
TaskRef = tuple[str, int]


def task_ref(msg: Msg) -> TaskRef:
    return msg.metadata.stream, msg.metadata.sequence.stream


@dataclass(frozen=True, slots=True)
class Attempt:
    """One delivery of a task, as its steps see it."""

    msg: Msg
    task: Task
    owner: Ownership
    ref: TaskRef  # its identity for this worker's memories
    attempt: int  # 1 for the first; JetStream's deliveries less the politeness hand-backs
    deferrals: int  # politeness hand-backs so far
    started: float  # unix time this delivery's processing began


@dataclass(frozen=True, slots=True)
class Done:
    result: Result
    links: Discovered | None = None
    letter: DeadLetter | None = None  # with a failure whose budget ran out: kept for replay
    # the page's items, its job's dead letters and links to other jobs: stored before the ack
    outputs: tuple[Outgoing, ...] = ()


@dataclass(frozen=True, slots=True)
class Again:
    delay_s: float
    why: str  # what the task waits for meanwhile (the progress's tail)
    kind: AgainKind


@dataclass(frozen=True, slots=True)
class Settled:
    """Acked with no fetch and no record: the task's job was cancelled."""

    job: str
