"""Exceptions of the sinks.

JetcrawlError
└── SinkError            a sink cannot run as configured: said in one line, exit status 2
    ├── SinkUnavailable  its storage cannot be reached now (down, restarting): retried, no ack
    └── SinkRejected     its storage refuses these records for what they hold: dead-lettered
"""

from __future__ import annotations

from jetcrawl.contract.errors import JetcrawlError

__all__ = ["SinkError", "SinkRejected", "SinkUnavailable"]


class SinkError(JetcrawlError):
    """``where`` (a server, a directory, a flag; never a password) cannot be used: ``problem``."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where = where
        self.problem = problem


class SinkUnavailable(SinkError):
    """The storage did not answer or hung up; the same write may succeed later."""


class SinkRejected(SinkError):
    """The storage refused the write because of the data in it (a value it cannot store); the
    same write always fails. Written one by one, the records it refuses are dead-lettered."""
