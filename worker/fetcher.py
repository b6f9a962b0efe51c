"""HTTP for the worker: one pooled aiohttp session, redirects by hand, bodies read within limits.

``Fetcher.fetch(url)`` returns a ``Fetched`` for any HTTP response (a 404 or a 503 is an outcome,
not an error) and raises ``FetchError`` when there is no response to record. The rules:

- Redirects (301, 302, 303, 307, 308 with a Location) are followed by hand up to
  ``max_redirects``: each Location is resolved against the URL that answered and canonicalized by
  the URL rules, so the chain we record is the chain of URLs the frontier would know. A Location
  that is not an http(s) URL we accept is ``bad_redirect``; a loop or too long a chain is
  ``too_many_redirects``. One deadline, ``total_timeout_s``, covers the whole chain and the body.
- The Content-Type is looked at before the body: only the body of a 2xx response of a type the
  caller reads (``reads``: HTML by default, a job's ``content_types``) is read. Anything else is
  released unread, which closes the connection unless the body had already arrived whole (then
  it goes back to the pool); a 2xx body left so is ``Fetched.skipped``.
- A body is read as it streams, counted after decompression, and abandoned as soon as it
  passes ``max_body_bytes`` (``too_large``). aiohttp (3.13+) inflates at most about one read
  buffer ahead of the reader, so a compression bomb costs a buffer, not its inflated size.
- aiohttp, asyncio and socket exceptions are translated once, in ``_fetch_error``.

- The SSRF guard (:mod:`jetcrawl.worker.ssrf`) is enforced in ``_open_socket``, which aiohttp calls
with
  the address of every TCP connection it makes, whether the host was a name that resolved or an
  IP literal, after DNS and before connect: a refused address is ``blocked`` (not transient).
"""

from __future__ import annotations

import asyncio
import contextvars
import errno
import socket
import ssl
import time
from collections.abc import Container, Mapping
from dataclasses import dataclass
from types import TracebackType

import aiohttp
from aiohappyeyeballs import AddrInfoType
from aiohttp.compression_utils import HAS_BROTLI, HAS_ZSTD
from aiohttp.http_exceptions import ContentEncodingError
from yarl import URL

from jetcrawl.contract.errors import UrlError
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.urls import UrlRules
from jetcrawl.worker.errors import FetchError
from jetcrawl.worker.socks import SocksConnector, SocksProxyError
from jetcrawl.worker.ssrf import AddressGuard, Blocked

__all__ = ["HTML_TYPES", "KEPT_HEADERS", "TEXT_MAX_REDIRECTS", "Fetched", "Fetcher"]

HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
# The response headers a Fetched keeps (lowercase names).
KEPT_HEADERS = (
    "content-type",
    "content-length",
    "last-modified",
    "etag",
    "server",
    "location",
    "retry-after",
    "content-encoding",
)
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
# RFC 9309 section 2.3.1.2: crawlers follow at least five consecutive redirects for robots.txt.
TEXT_MAX_REDIRECTS = 5

ACCEPT = "text/html,application/xhtml+xml;q=0.9,*/*;q=0.8"
# Only what aiohttp can decode in this environment (br needs Brotli, zstd backports.zstd).
ACCEPT_ENCODING = ", ".join(
    ["gzip", "deflate"] + (["br"] if HAS_BROTLI else []) + (["zstd"] if HAS_ZSTD else [])
)
# How long an idle pooled connection is kept for the next request to the same host.
KEEPALIVE_S = 15.0
DNS_CACHE_TTL_S = 300
# The addresses the SSRF guard refused while one request was connecting ("ip:port (reason)").
_REFUSED: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "jetcrawl_refused", default=None
)


@dataclass(frozen=True, slots=True)
class Fetched:
    """One HTTP response, as the worker records it."""

    url: str  # the URL asked for (canonical)
    final_url: str  # the URL that answered, after redirects (canonical)
    redirects: tuple[str, ...]  # each hop's URL before the final one, in order; () if none
    status: int
    content_type: str  # the media type only, lowercase ("text/html"); "" if absent
    charset: str | None  # the Content-Type's charset parameter, lowercase
    headers: Mapping[str, str]  # the KEPT_HEADERS the response had, lowercase names
    body: bytes  # the decompressed body of a 2xx response of a type read; b"" otherwise
    length: int  # len(body) when read; 0 when skipped; else the Content-Length if given, else 0
    fetched_at: float  # epoch seconds when the first request started
    elapsed_ms: float  # from the first request to the end of the body
    location: str | None = None  # canonical redirect target, when redirects are not followed
    skipped: bool = False  # a 2xx response of a type not read: its body was released unread

    @property
    def is_html(self) -> bool:
        return self.content_type in HTML_TYPES


class Fetcher:
    """Fetches URLs through one pooled ``aiohttp.ClientSession``; an async context manager.

    The session is opened by ``__aenter__`` (or the first fetch) and closed by ``close()``, which
    may be called more than once. A closed Fetcher does not reopen.
    """

    def __init__(self, settings: Settings) -> None:
        # --- configuration
        self._rules = UrlRules.from_settings(settings)
        self._max_body_bytes = settings.max_body_bytes
        self._max_redirects = settings.max_redirects
        self._concurrency = settings.concurrency
        self._total_timeout_s = settings.total_timeout_s
        self._connect_timeout_s = settings.connect_timeout_s
        self._read_timeout_s = settings.read_timeout_s
        self._settings = settings
        self._guard = AddressGuard(settings.allow_nets)
        self._guarding_endpoints = False  # the mesh's endpoints resolved into the guard
        self._headers = {
            "User-Agent": settings.user_agent,
            "Accept": ACCEPT,
            "Accept-Encoding": ACCEPT_ENCODING,
        }
        # --- the connection pool, for the Fetcher's life
        self._session: aiohttp.ClientSession | None = None
        self._socks: dict[str, aiohttp.ClientSession] = {}  # per SOCKS5 proxy URL
        self._closed = False

    async def __aenter__(self) -> Fetcher:
        self._open()
        await self._guard_endpoints()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            await session.close()
        socks, self._socks = self._socks, {}
        for proxied in socks.values():
            await proxied.close()

    def _open(self) -> aiohttp.ClientSession:
        if self._closed:
            raise RuntimeError("the Fetcher is closed")
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._concurrency,
                ttl_dns_cache=DNS_CACHE_TTL_S,
                keepalive_timeout=KEEPALIVE_S,
                socket_factory=self._open_socket,
            )
            self._session = self._new_session(connector)
        return self._session

    def _socks_session(self, proxy: str) -> aiohttp.ClientSession:
        """The session whose connections go through the SOCKS5 proxy ``proxy``."""
        if self._closed:
            raise RuntimeError("the Fetcher is closed")
        session = self._socks.get(proxy)
        if session is None:
            connector = SocksConnector(
                proxy, self._check_address, limit=self._concurrency, keepalive_timeout=KEEPALIVE_S
            )
            session = self._socks[proxy] = self._new_session(connector)
        return session

    def _new_session(self, connector: aiohttp.BaseConnector) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=connector,
            headers=self._headers,
            timeout=self._timeout(self._total_timeout_s),
            cookie_jar=aiohttp.DummyCookieJar(),  # no state shared between hosts or tasks
            auto_decompress=True,  # bounded by aiohttp, counted by _read_body
            raise_for_status=False,
        )

    async def _guard_endpoints(self) -> None:
        if not self._guarding_endpoints:
            self._guarding_endpoints = True
            await self._guard.add_endpoints(self._settings)

    def _open_socket(self, addr_info: AddrInfoType) -> socket.socket:
        """The socket for one TCP connection to ``addr_info``'s address: the SSRF check.

        Every connection passes here with its numeric address, so neither an IP-literal URL nor
        a name that resolves (now, at connect time) to a refused address gets around it.
        Raising ``OSError`` here fails the connection attempt.
        """
        family, type_, proto, _canonname, address = addr_info
        self._check_address(str(address[0]), int(address[1]))
        return socket.socket(family=family, type=type_, proto=proto)

    def _check_address(self, host: str, port: int) -> None:
        """Raise ``Blocked`` for an address the SSRF guard refuses, noting it for the error."""
        reason = self._guard.check(host, port)
        if reason is not None:
            refused = _REFUSED.get()
            if refused is not None:
                refused.append(f"{host}:{port} ({reason})")
            raise Blocked()

    def _timeout(self, total_s: float) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(
            total=total_s, sock_connect=self._connect_timeout_s, sock_read=self._read_timeout_s
        )

    async def fetch(
        self,
        url: str,
        *,
        follow_redirects: bool = True,
        headers: Mapping[str, str] | None = None,
        proxy: str | None = None,
        reads: Container[str] = HTML_TYPES,
    ) -> Fetched:
        """GET ``url`` (canonical); the body is read only for a 2xx response whose media type is
        in ``reads``.

        With ``follow_redirects=False`` a redirect is the answer: its canonical target is
        ``location`` (a Location that is no acceptable URL is ``bad_redirect``). ``proxy``: an
        http(s) or socks5 proxy URL (credentials resolved) the request goes through.
        """
        fetched_at = time.time()
        started = time.perf_counter()
        max_redirects = self._max_redirects if follow_redirects else None
        response, final_url, redirects = await self._follow(url, max_redirects, headers, proxy)
        try:
            location = None
            if response.status in REDIRECT_STATUSES and "Location" in response.headers:
                location = self._redirect_target(final_url, response.headers["Location"])
            content_type, charset = media_type(response.headers.get("Content-Type", ""))
            declared = content_length(response.headers)
            body = b""
            success = 200 <= response.status < 300
            skipped = success and content_type not in reads
            if success and not skipped:
                body = await self._read_body(response, final_url, declared)
                length = len(body)
            else:
                length = 0 if skipped else declared or 0
            headers = {
                name: response.headers[name] for name in KEPT_HEADERS if name in response.headers
            }
            status = response.status
        finally:
            response.release()
        return Fetched(
            url=url,
            final_url=final_url,
            redirects=redirects,
            status=status,
            content_type=content_type,
            charset=charset,
            headers=headers,
            body=body,
            length=length,
            fetched_at=fetched_at,
            elapsed_ms=(time.perf_counter() - started) * 1000.0,
            location=location,
            skipped=skipped,
        )

    async def get_text(self, url: str, max_bytes: int) -> tuple[int, str, tuple[str, ...]]:
        """``(status, text, redirects)`` of a small text resource such as robots.txt.

        Up to ``TEXT_MAX_REDIRECTS`` redirects are followed. The body of a 2xx response, whatever
        its Content-Type, is read up to ``max_bytes`` (the rest is left unread) and decoded as
        UTF-8 with replacement characters; any other status comes with "".
        """
        response, final_url, redirects = await self._follow(url, TEXT_MAX_REDIRECTS)
        try:
            status = response.status
            raw = await self._read_up_to(response, final_url, max_bytes) if status < 300 else b""
        finally:
            response.release()
        return status, raw.decode("utf-8", "replace"), redirects

    async def get_resource(
        self,
        url: str,
        max_bytes: int,
        headers: Mapping[str, str] | None = None,
        proxy: str | None = None,
    ) -> tuple[int, Mapping[str, str], bytes]:
        """``(status, headers, body)`` of one request a rendered page makes: no redirect
        followed (the browser asks for the target itself), any type, the body up to
        ``max_bytes`` (a longer one is ``too_large``)."""
        response, final_url, _ = await self._follow(url, None, headers, proxy)
        try:
            body = await self._read_up_to(response, final_url, max_bytes + 1)
            if len(body) > max_bytes:
                raise FetchError("too_large", f"body over {max_bytes} bytes", url)
            kept = {n: response.headers[n] for n in KEPT_HEADERS if n in response.headers}
            kept.pop("content-encoding", None)  # aiohttp has decoded it
            kept.pop("content-length", None)
            return response.status, kept, body
        finally:
            response.release()

    async def guard_name(self, url: str) -> None:
        """Refuse ``url`` (``blocked``) when its host resolves to an address the SSRF guard
        refuses. For requests through a proxy, which connects to the host itself: the
        proxy may resolve the name again, so a proxy should refuse private ranges too."""
        host, port = URL(url, encoded=True).host or "", URL(url, encoded=True).port or 80
        loop = asyncio.get_running_loop()
        await self._guard_endpoints()
        with _Translated(url):
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        for *_, address in infos:
            reason = self._guard.check(str(address[0]), port)
            if reason is not None:
                where = f"{address[0]}:{port} ({reason})"
                raise FetchError("blocked", f"SSRF guard refused {where}", url, transient=False)

    async def _read_up_to(
        self, response: aiohttp.ClientResponse, url: str, max_bytes: int
    ) -> bytes:
        raw = bytearray()
        with _Translated(url):
            while len(raw) < max_bytes:
                chunk = await response.content.readany()
                if not chunk:
                    break
                raw += chunk
        return bytes(raw[:max_bytes])

    async def _follow(
        self,
        url: str,
        max_redirects: int | None,
        headers: Mapping[str, str] | None = None,
        proxy: str | None = None,
    ) -> tuple[aiohttp.ClientResponse, str, tuple[str, ...]]:
        """The final response of ``url``'s redirect chain, with its URL and the chain before it.

        ``max_redirects=None`` follows none: the first response is the final one. Every
        intermediate response is released at once; the caller releases the final one. (A plain
        coroutine: a generator-based context manager costs more, on every fetch.)
        """
        session = self._open()
        await self._guard_endpoints()
        deadline = asyncio.get_running_loop().time() + self._total_timeout_s
        redirects: list[str] = []
        current = url
        while True:
            response = await self._send(session, current, deadline, headers, proxy)
            location = response.headers.get("Location")
            if max_redirects is None or response.status not in REDIRECT_STATUSES or not location:
                break
            response.release()
            target = self._redirect_target(current, location)
            redirects.append(current)
            if target in redirects:
                raise FetchError("too_many_redirects", f"redirect loop back to {target}", current)
            if len(redirects) > max_redirects:
                raise FetchError(
                    "too_many_redirects", f"more than {max_redirects} redirects", current
                )
            current = target
        return response, current, tuple(redirects)

    async def _send(
        self,
        session: aiohttp.ClientSession,
        url: str,
        deadline: float,
        headers: Mapping[str, str] | None = None,
        proxy: str | None = None,
    ) -> aiohttp.ClientResponse:
        remaining_s = deadline - asyncio.get_running_loop().time()
        if remaining_s <= 0:
            raise FetchError("timeout", f"over {self._total_timeout_s} s in redirects", url)
        refused: list[str] = []
        token = _REFUSED.set(refused)
        try:
            if proxy is not None and proxy.startswith("socks5://"):
                session, proxy = self._socks_session(proxy), None
            with _Translated(url, refused):
                # The URL is canonical, so already encoded: yarl must not quote it again.
                return await session.get(
                    URL(url, encoded=True),
                    allow_redirects=False,
                    timeout=self._timeout(remaining_s),
                    headers=headers,
                    proxy=proxy,
                )
        finally:
            _REFUSED.reset(token)

    def _redirect_target(self, current: str, location: str) -> str:
        try:
            return self._rules.canonicalize(location, base=current)
        except UrlError as exc:
            raise FetchError(
                "bad_redirect", f"Location {location[:200]!r} rejected: {exc.reason}", current
            ) from None

    async def _read_body(
        self, response: aiohttp.ClientResponse, url: str, declared: int | None
    ) -> bytes:
        limit = self._max_body_bytes
        if declared is not None and declared > limit and "Content-Encoding" not in response.headers:
            raise FetchError("too_large", f"Content-Length {declared} > {limit} bytes", url)
        body = bytearray()
        with _Translated(url):
            async for chunk in response.content.iter_any():
                body += chunk
                if len(body) > limit:
                    raise FetchError("too_large", f"body over {limit} bytes", url)
        return bytes(body)


def media_type(header: str) -> tuple[str, str | None]:
    """``(media type, charset)`` of a Content-Type value, lowercase; ``("", None)`` if empty."""
    kind, _, params = header.partition(";")
    charset = None
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            charset = value.strip().strip("\"'").strip().lower() or None
            break
    return kind.strip().lower(), charset


def content_length(headers: Mapping[str, str]) -> int | None:
    value = headers.get("Content-Length", "").strip()
    return int(value) if value.isascii() and value.isdigit() else None


class _Translated:
    """aiohttp, asyncio and socket errors raised in the block, as ``FetchError``.

    A class, not a ``@contextmanager``: it wraps every request and every body read, and a
    generator-based one costs several times as much a use.
    """

    __slots__ = ("_refused", "_url")

    def __init__(self, url: str, refused: list[str] | None = None) -> None:
        self._url = url
        self._refused = refused

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # OSError includes TimeoutError; UnicodeError is the resolver's, for a host that WHATWG
        # takes but DNS cannot spell (an empty label, one over 63 characters).
        if isinstance(exc, aiohttp.ClientError | OSError | UnicodeError):
            raise _fetch_error(exc, self._url, self._refused) from exc


def _fetch_error(
    exc: aiohttp.ClientError | OSError | UnicodeError, url: str, refused: list[str] | None = None
) -> FetchError:
    """The one translation of aiohttp, asyncio and socket exceptions into ``FetchError``."""
    if isinstance(exc, UnicodeError):
        return FetchError("dns", f"a host DNS cannot look up: {exc}", url, transient=False)
    if isinstance(exc, TimeoutError):  # aiohttp's ServerTimeoutError is one too
        message = str(exc) or "total timeout"
        return FetchError("timeout", message, url)
    if refused or _caused_by(exc, Blocked):
        where = ", ".join(refused or []) or "its address"
        return FetchError("blocked", f"SSRF guard refused {where}", url, transient=False)
    message = _describe(exc)
    if isinstance(
        exc, aiohttp.ClientProxyConnectionError | aiohttp.ClientHttpProxyError | SocksProxyError
    ):
        return FetchError("proxy", message, url)
    if _caused_by(exc, ContentEncodingError):
        return FetchError("decoding", message, url)
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return FetchError("dns", message, url)
    if isinstance(exc, aiohttp.ClientConnectorCertificateError | aiohttp.ClientSSLError) or (
        _caused_by(exc, ssl.SSLError)
    ):
        return FetchError("tls", message, url)
    if _caused_by(exc, ConnectionRefusedError) or (
        isinstance(exc, OSError) and exc.errno == errno.ECONNREFUSED
    ):
        return FetchError("refused", message, url)
    if isinstance(exc, aiohttp.ClientPayloadError):
        # The connection ended before the body did (Content-Length or chunks not satisfied).
        return FetchError("connect", message, url)
    if isinstance(exc, aiohttp.ClientConnectionError | OSError):
        return FetchError("connect", message, url)
    # ClientResponseError from a response we cannot parse, InvalidURL, and the like.
    return FetchError("protocol", message, url)


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, kind):
            return True
        seen = seen.__cause__
    return False


def _describe(exc: BaseException) -> str:
    detail = exc.message if isinstance(exc, aiohttp.ClientResponseError) else str(exc)
    cause = exc.__cause__
    if cause is not None and not detail:
        detail = str(cause)
    return f"{type(exc).__name__}: {detail}"[:300]
