"""Exceptions of the registry package; etcd's own errors are translated into these in ``etcd.py``.

JetcrawlError
└── RegistryError              base of every error the registry raises on purpose
    ├── EtcdUnavailable        etcd cannot be reached now (refused, reset, no leader): retry later
    │   └── EtcdTimeout        a call got no answer within ``settings.etcd_timeout_s``
    ├── EtcdRequestError       etcd answered with an error that retrying will not fix
    │   └── RevisionCompacted  a watch asked for history etcd has compacted away: list again
    └── RecordError            a key under ``/jetcrawl/<cluster>/`` holds a value we cannot decode
"""

from __future__ import annotations

from jetcrawl.contract.errors import JetcrawlError


class RegistryError(JetcrawlError):
    """Base of every error the registry raises on purpose."""


class EtcdUnavailable(RegistryError):
    """etcd could not be reached for ``operation``; the same call may succeed later."""

    def __init__(self, operation: str, detail: str) -> None:
        super().__init__(f"etcd {operation}: unavailable: {detail}")
        self.operation = operation
        self.detail = detail


class EtcdTimeout(EtcdUnavailable):
    """``operation`` got no answer within ``timeout_s`` (etcd stopped, paused, or partitioned)."""

    def __init__(self, operation: str, timeout_s: float) -> None:
        super().__init__(operation, f"no answer within {timeout_s:g} s")
        self.timeout_s = timeout_s


class EtcdRequestError(RegistryError):
    """etcd rejected ``operation`` (bad argument, authentication, internal error)."""

    def __init__(self, operation: str, detail: str) -> None:
        super().__init__(f"etcd {operation}: {detail}")
        self.operation = operation
        self.detail = detail


class RevisionCompacted(EtcdRequestError):
    """A watch from an old revision cannot be served: history below ``compacted`` is gone."""

    def __init__(self, operation: str, compacted: int) -> None:
        super().__init__(operation, f"revisions below {compacted} are compacted")
        self.compacted = compacted


class RecordError(RegistryError):
    """The value at ``key`` is not a record we understand; ``reason`` says why."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason
