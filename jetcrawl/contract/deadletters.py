"""Dead letters on the wire: the record, the stages of ``crawl.dead.<stage>``, the replay headers.

Stages: ``seeds``, ``discovered`` and ``frontier`` for frontier input the dispatcher could not
read or admit; ``task`` (unreadable), ``fetch`` (retries ran out), ``poison`` (JetStream gave
up after MaxDeliver) and ``extract`` (a job's extraction or plugin failed on the page) for
tasks. ``jetcrawl dlq replay`` (:mod:`jetcrawl.ops.dlq`) sends a
letter's original back with ``REPLAY_HEADER``, and a frontier message with ``ORIGIN_HEADER``:
the services read both.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Self

import orjson

from jetcrawl.contract.errors import MessageError
from jetcrawl.contract.wire import WIRE_VERSION, json_object, sequences, typed

__all__ = [
    "ORIGIN_HEADER",
    "REPLAY_HEADER",
    "STAGE_EXTRACT",
    "STAGE_FETCH",
    "STAGE_POISON",
    "STAGE_TASK",
    "TASK_STAGES",
    "DeadLetter",
    "origins_of",
]

REPLAY_HEADER = "Jetcrawl-Replay"
ORIGIN_HEADER = "Jetcrawl-Origin"  # a replayed frontier message's earlier sequences: "12,345"
STAGE_TASK = "task"
STAGE_FETCH = "fetch"
STAGE_POISON = "poison"
STAGE_EXTRACT = "extract"
TASK_STAGES = frozenset({STAGE_TASK, STAGE_FETCH, STAGE_POISON, STAGE_EXTRACT})


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record on ``crawl.dead.<stage>``: what was rejected, why, and (bounded) what it was."""

    stage: str
    reason: str
    detail: str
    subject: str
    received_at: float
    original: bytes
    original_size: int
    stream_seq: int | None = None
    # A frontier message's: the frontier sequences whose seen marks it may own (its own, and
    # those of the letters it was replayed from), for its replay to publish their tasks.
    origins: tuple[int, ...] = ()

    @classmethod
    def of(
        cls,
        stage: str,
        reason: str,
        detail: str,
        subject: str,
        received_at: float,
        original: bytes,
        max_bytes: int,
        stream_seq: int | None = None,
        origins: tuple[int, ...] = (),
    ) -> Self:
        return cls(
            stage,
            reason,
            detail,
            subject,
            received_at,
            original[:max_bytes],
            len(original),
            stream_seq,
            origins,
        )

    def to_wire(self) -> bytes:
        try:
            original: dict[str, Any] = {"original": self.original.decode("utf-8")}
        except UnicodeDecodeError:
            original = {"original_b64": base64.b64encode(self.original).decode("ascii")}
        return orjson.dumps(
            {
                "v": WIRE_VERSION,
                "stage": self.stage,
                "reason": self.reason,
                "detail": self.detail,
                "subject": self.subject,
                "received_at": self.received_at,
                "original_size": self.original_size,
                "truncated": self.original_size > len(self.original),
                "stream_seq": self.stream_seq,
            }
            | ({"origins": list(self.origins)} if self.origins else {})
            | original
        )

    @classmethod
    def from_wire(cls, data: bytes) -> Self:
        obj = json_object(data)
        if "original_b64" in obj:
            original = base64.b64decode(typed(obj, "original_b64", str))
        else:
            original = typed(obj, "original", str).encode("utf-8")
        return cls(
            stage=typed(obj, "stage", str),
            reason=typed(obj, "reason", str),
            detail=typed(obj, "detail", str),
            subject=typed(obj, "subject", str),
            received_at=float(typed(obj, "received_at", (int, float))),
            original=original,
            original_size=typed(obj, "original_size", int),
            stream_seq=typed(obj, "stream_seq", int, optional=True),
            origins=sequences(obj, "origins"),
        )


def origins_of(headers: dict[str, str] | None) -> tuple[int, ...]:
    """The frontier sequences a replayed frontier message came from (``ORIGIN_HEADER``); none
    for any other message. Raises :class:`MessageError` for a header that is no such list."""
    value = (headers or {}).get(ORIGIN_HEADER)
    if value is None:
        return ()
    try:
        origins = tuple(int(part) for part in value.split(","))
    except ValueError:
        origins = ()
    if not origins or min(origins) < 1:
        raise MessageError("bad_header", f"{ORIGIN_HEADER}: {value!r} is no list of sequences")
    return origins
