"""Exceptions of the jetcrawl contract package.

JetcrawlError
├── SettingsError          a setting is unknown or has a bad value
├── TopologyError          the JetStream topology on the server disagrees with ours
│   ├── ShardCountMismatch the server was set up with another shard count
│   ├── PartitionCountMismatch ... or another partition count
│   └── TopologyUnavailable JetStream cannot apply it yet (no leader, too few peers): retry
├── MessageError           a message cannot be decoded (carries the reason for the dead letter)
├── UrlError               a URL is rejected by the URL rules (carries the reason)
├── SpecError              a job spec is invalid at one place (carries the field's path)
└── UsageError             a command's input is wrong: said in one line before anything starts
"""

from __future__ import annotations


class JetcrawlError(Exception):
    """Base of every error jetcrawl raises on purpose."""


class SettingsError(JetcrawlError):
    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"setting {name}: {problem}")
        self.name = name
        self.problem = problem


class TopologyError(JetcrawlError):
    """The streams, consumers or buckets on the server cannot be made to match ours."""


class ShardCountMismatch(TopologyError):
    def __init__(self, existing: int, wanted: int) -> None:
        super().__init__(
            f"the JetStream topology was created with {existing} shards but this service was "
            f"started with {wanted}; the shard count is fixed at creation (start with "
            f"--shards {existing}, or delete the CRAWL_* streams to start over)"
        )
        self.existing = existing
        self.wanted = wanted


class PartitionCountMismatch(TopologyError):
    def __init__(self, existing: int, wanted: int, stream: str) -> None:
        super().__init__(
            f"stream {stream} was created with {existing} partition(s) but this service was "
            f"started with partitions={wanted}; a shard's tasks and its URLs' seen marks would "
            f"be looked for in the wrong streams (start with JETCRAWL_PARTITIONS={existing}, or "
            "delete the CRAWL_TASKS* and KV_crawl_seen* streams to start over)"
        )
        self.existing = existing
        self.wanted = wanted
        self.stream = stream


class TopologyUnavailable(TopologyError):
    """JetStream refused a change for now: no leader, or too few peers online to place the
    replicas (a cluster still forming, a node restarting). Retrying can succeed; nothing was
    created or changed by the refused request."""


class MessageError(JetcrawlError):
    """A message is not valid; ``reason`` is a short machine-friendly code, ``detail`` prose."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class UrlError(JetcrawlError):
    """A URL is rejected; ``reason`` is a short code such as ``unsupported_scheme``."""

    def __init__(self, reason: str, url: str) -> None:
        super().__init__(f"{reason}: {url[:200]!r}")
        self.reason = reason
        self.url = url


class UsageError(JetcrawlError):
    """A command's flag or argument ``what`` is wrong; ``problem`` says how."""

    def __init__(self, what: str, problem: str) -> None:
        super().__init__(f"{what}: {problem}")
        self.what = what
        self.problem = problem


class SpecError(JetcrawlError):
    """A job spec is refused: ``path`` names the field (``extract.rules[2].fields.price.css``),
    ``problem`` says what is wrong with it."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}" if path else problem)
        self.path = path
        self.problem = problem
