"""Exceptions of the worker package.

JetcrawlError                  (jetcrawl.contract.errors)
└── WorkerError                base of every error the worker raises on purpose
    ├── FetchError             a URL could not be fetched; ``kind`` says why:
            timeout              no connection, no response or no body within the timeouts
            refused              the server's address refused the connection (nothing listens)
            connect              reset, dropped mid-response, unreachable
            tls                  the TLS handshake failed (certificate, protocol): not transient
            dns                  the host name does not resolve
            too_large            the body is over ``max_body_bytes`` (counted decompressed)
            too_many_redirects   a redirect loop, or more hops than ``max_redirects``
            bad_redirect         a Location that is not an http(s) URL we accept
            protocol             the server does not speak HTTP we can read
            decoding             a Content-Encoding we cannot decode, or a corrupt one
            blocked              the SSRF guard refused the address (loopback, private, ...)
    ├── PluginRefused          a plugin cannot be used: not installed, not loading, other API
    └── PluginFailed           a plugin raised, or returned what is not a valid Output

A 404 or a 500 is not an error: it is a fetched response with that status.
"""

from __future__ import annotations

from typing import Literal, get_args

from jetcrawl.contract.errors import JetcrawlError

FetchErrorKind = Literal[
    "timeout",
    "refused",
    "connect",
    "tls",
    "dns",
    "too_large",
    "too_many_redirects",
    "bad_redirect",
    "protocol",
    "decoding",
    "blocked",
]
FETCH_ERROR_KINDS: frozenset[str] = frozenset(get_args(FetchErrorKind))
# Worth another attempt later: the same request may well succeed. The others will not.
TRANSIENT_KINDS: frozenset[str] = frozenset({"timeout", "refused", "connect", "dns"})


class WorkerError(JetcrawlError):
    """Base of every error the worker raises on purpose."""


class FetchError(WorkerError):
    """A fetch failed; ``url`` is the URL of the request (or redirect hop) that failed.

    ``transient`` follows from ``kind`` unless given.
    """

    def __init__(
        self, kind: FetchErrorKind, message: str, url: str, *, transient: bool | None = None
    ) -> None:
        if kind not in FETCH_ERROR_KINDS:
            raise ValueError(f"unknown fetch error kind {kind!r}")
        super().__init__(f"{kind}: {message} ({url[:200]})")
        self.kind: FetchErrorKind = kind
        self.message = message
        self.url = url
        self.transient = kind in TRANSIENT_KINDS if transient is None else transient


class PluginRefused(WorkerError):
    """The plugin ``plugin`` (its entry-point name) cannot be used; ``problem`` says why."""

    def __init__(self, plugin: str, problem: str) -> None:
        super().__init__(f"plugin {plugin!r} refused: {problem}")
        self.plugin = plugin
        self.problem = problem


class PluginFailed(WorkerError):
    """The plugin ``plugin`` failed on a page: ``problem`` says how; ``error`` is the exception it
    raised (None: what it returned was wrong)."""

    def __init__(self, plugin: str, problem: str, error: BaseException | None = None) -> None:
        super().__init__(f"plugin {plugin!r} failed: {problem}")
        self.plugin = plugin
        self.problem = problem
        self.error = error
