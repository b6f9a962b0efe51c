"""A job's run state (running, paused, cancelled), kept in KV ``crawl_control`` under its name.

``jetcrawl job pause|resume|cancel`` writes it by compare-and-set; workers and dispatchers watch
the bucket. Paused: the job's tasks stay queued, are not fetched and spend no delivery attempt.
Cancelled: its queued tasks are purged, what still comes is settled (acked unfetched) and its
frontier input dropped; a cancellation is final and recorded once, with what was purged. A job
with no record runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, Self

import orjson

from jetcrawl.contract.errors import MessageError
from jetcrawl.contract.wire import WIRE_VERSION, check_version, json_object, typed

__all__ = ["CANCELLED", "PAUSED", "RUNNING", "STATES", "JobControl"]

RUNNING: Final = "running"
PAUSED: Final = "paused"
CANCELLED: Final = "cancelled"
STATES = (RUNNING, PAUSED, CANCELLED)
State = Literal["running", "paused", "cancelled"]


@dataclass(frozen=True, slots=True)
class JobControl:
    job: str
    state: State
    at: float  # unix time of the change
    by: str = ""  # who asked: user@host of the command
    purged: int = 0  # tasks a cancellation removed from the task streams

    @property
    def runs(self) -> bool:
        return self.state == RUNNING

    def to_wire(self) -> bytes:
        return orjson.dumps(
            {
                "v": WIRE_VERSION,
                "job": self.job,
                "state": self.state,
                "at": self.at,
                "by": self.by,
                "purged": self.purged,
            }
        )

    @classmethod
    def from_wire(cls, data: bytes) -> Self:
        obj = json_object(data)
        check_version(obj)
        state = typed(obj, "state", str)
        if state not in STATES:
            raise MessageError("bad_state", f"state must be one of {STATES}, got {state!r}")
        return cls(
            job=typed(obj, "job", str),
            state=state,  # checked against STATES above
            at=float(typed(obj, "at", (int, float))),
            by=typed(obj, "by", str, optional=True) or "",
            purged=typed(obj, "purged", int, optional=True) or 0,
        )
