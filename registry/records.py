"""The two records the registry writes to etcd: wire shape (JSON via orjson) and code shape.

Decoding is strict about the types of the fields it knows and lenient about fields it does not
(a newer worker may add some); anything else is a ``RecordError`` naming the key.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Any

import orjson

from jetcrawl import __version__
from jetcrawl.contract import PROTOCOL_VERSION
from jetcrawl.registry.errors import RecordError

__all__ = ["Claim", "WorkerInfo"]


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """What a worker says about itself at ``/jetcrawl/<cluster>/workers/<id>``."""

    id: str
    host: str
    pid: int
    version: str
    protocol: int
    capacity: int
    started_at: float  # unix time, seconds

    def __post_init__(self) -> None:
        if not self.id or "/" in self.id:
            raise ValueError(f"worker id must be non-empty and without '/', got {self.id!r}")

    @classmethod
    def local(cls, worker_id: str, *, capacity: int) -> WorkerInfo:
        """This process as worker ``worker_id`` that runs up to ``capacity`` fetches at once."""
        return cls(
            id=worker_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            version=__version__,
            protocol=PROTOCOL_VERSION,
            capacity=capacity,
            started_at=time.time(),
        )

    def to_wire(self) -> bytes:
        return orjson.dumps(
            {
                "id": self.id,
                "host": self.host,
                "pid": self.pid,
                "version": self.version,
                "protocol": self.protocol,
                "capacity": self.capacity,
                "started_at": self.started_at,
            }
        )

    @classmethod
    def from_wire(cls, key: str, data: bytes) -> WorkerInfo:
        obj = _object(key, data)
        try:
            return cls(
                id=_str(key, obj, "id"),
                host=_str(key, obj, "host"),
                pid=_int(key, obj, "pid"),
                version=_str(key, obj, "version"),
                protocol=_int(key, obj, "protocol"),
                capacity=_int(key, obj, "capacity"),
                started_at=_number(key, obj, "started_at"),
            )
        except ValueError as exc:
            raise RecordError(key, str(exc)) from None


@dataclass(frozen=True, slots=True)
class Claim:
    """Who holds a shard: the worker, the lease the key is bound to, and the fence.

    On the wire a claim is ``{"worker": id, "lease": lease_id}``; ``fence`` is not stored in the
    value but is the key's mod revision, which etcd assigns when the key is created.
    """

    worker: str
    lease: int
    fence: int

    @staticmethod
    def to_wire(worker: str, lease: int) -> bytes:
        return orjson.dumps({"worker": worker, "lease": lease})

    @classmethod
    def from_wire(cls, key: str, data: bytes, *, fence: int) -> Claim:
        obj = _object(key, data)
        return cls(
            worker=_str(key, obj, "worker"),
            lease=_int(key, obj, "lease"),
            fence=fence,
        )


def _object(key: str, data: bytes) -> dict[str, Any]:
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise RecordError(key, f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise RecordError(key, f"expected a JSON object, got {type(obj).__name__}")
    return obj


def _str(key: str, obj: dict[str, Any], name: str) -> str:
    value = obj.get(name)
    if not isinstance(value, str):
        raise RecordError(key, _wrong(name, value, "a string"))
    return value


def _int(key: str, obj: dict[str, Any], name: str) -> int:
    value = obj.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RecordError(key, _wrong(name, value, "an integer"))
    return value


def _number(key: str, obj: dict[str, Any], name: str) -> float:
    value = obj.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RecordError(key, _wrong(name, value, "a number"))
    return float(value)


def _wrong(name: str, value: object, expected: str) -> str:
    if value is None:
        return f"field {name!r} is missing or null"
    return f"field {name!r} should be {expected}, got {type(value).__name__}"
