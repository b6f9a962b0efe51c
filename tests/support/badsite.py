"""A misbehaving local website for the fetcher and robots tests (scrapy's tests/mockserver).

``BadSite`` is an aiohttp app on 127.0.0.1 with an OS-chosen port. Tests add plain routes
(``add``, ``redirect``); the streaming routes below are always there and count, server side, the
body bytes each response got written before the client went away:

    /big.pdf     STREAM_BYTES of application/pdf, with a Content-Length
    /big.png     STREAM_BYTES of image/png, chunked
    /huge.html   STREAM_BYTES of text/html, chunked
    /bomb.html   text/html, Content-Encoding: gzip, BOMB_SEGMENTS MiB of zeros once inflated
    /bomb.br     the same with Content-Encoding: br
    /drip.html   text/html, one byte every DRIP_EVERY_S (faster than any read timeout), for ever

``written[path]`` is the count; ``finished(path)`` is set when that handler has returned, so a
test reads the final count after awaiting it instead of polling.

``log`` lists every request as it arrived: ``(time.monotonic(), path)``, for tests that measure
the spacing of requests at the server. ``add(..., times=n)`` answers the next n requests of a
path that way before its usual answer (a 503 twice, then the page).

``BadSite(host=...)`` listens on another loopback address (127.0.0.2, ...: Linux routes all of
127/8 to lo), for tests that tell hosts apart by address.

``RawServer`` answers every connection with fixed bytes, then hangs up or waits for the client to
(a server that accepts and never answers, a body cut short, garbage that is no HTTP).
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import cache
from types import TracebackType

import brotli
from aiohttp import web

STREAM_BYTES = 256 * 1024 * 1024
STREAM_CHUNK = 64 * 1024
BOMB_SEGMENTS = 1_000_000  # of 1 MiB each once inflated (1 TiB), about 1 KiB each compressed
MiB = 1024 * 1024
DRIP_EVERY_S = 0.05


@cache
def bomb_segments() -> tuple[bytes, bytes]:
    """A gzip stream of zeros as (header + first MiB, every further MiB).

    A full flush resets the compressor, so every 1 MiB segment after the first compresses to the
    same bytes and the bomb is streamed without compressing anything more.
    """
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(MiB)
    first = compressor.compress(zeros) + compressor.flush(zlib.Z_FULL_FLUSH)
    repeat = compressor.compress(zeros) + compressor.flush(zlib.Z_FULL_FLUSH)
    return first, repeat


@cache
def brotli_segments() -> tuple[bytes, bytes]:
    """A brotli stream of zeros as (first MiB, every further MiB), like ``bomb_segments``.

    After a flush, every further MiB of zeros compresses to the same bytes (checked here), so the
    bomb is streamed without compressing anything more.
    """
    compressor = brotli.Compressor(quality=1)
    zeros = bytes(MiB)
    first, repeat, again = (compressor.process(zeros) + compressor.flush() for _ in range(3))
    assert repeat == again, "brotli no longer repeats itself: stream the compressor instead"
    return first, repeat


@dataclass
class Route:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    # When set, the handler waits for it before answering (to hold requests in flight).
    gate: asyncio.Event | None = None


class BadSite:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.routes: dict[str, Route] = {}
        self._ahead: dict[str, list[Route]] = {}  # answers before the usual one (add(times=n))
        self.hits: Counter[str] = Counter()  # requests per path
        self.log: list[tuple[float, str]] = []  # (monotonic arrival time, path)
        self.arrived: dict[str, asyncio.Event] = {}  # path -> set when a request comes in
        self.written: Counter[str] = Counter()
        self._finished: dict[str, asyncio.Event] = {}
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def origin(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url(self, path: str) -> str:
        return f"{self.origin}{path}"

    def add(
        self,
        path: str,
        body: bytes | str = b"",
        *,
        status: int = 200,
        content_type: str = "text/html; charset=utf-8",
        headers: dict[str, str] | None = None,
        gate: asyncio.Event | None = None,
        times: int | None = None,
    ) -> None:
        raw = body.encode() if isinstance(body, str) else body
        all_headers = {"Content-Type": content_type} if content_type else {}
        all_headers.update(headers or {})
        route = Route(status, raw, all_headers, gate)
        if times is None:
            self.routes[path] = route
        else:
            self._ahead.setdefault(path, []).extend([route] * times)

    def paths(self) -> list[str]:
        """The paths requested, in arrival order, robots.txt left out."""
        return [path for _, path in self.log if path != "/robots.txt"]

    def redirect(self, path: str, location: str, status: int = 301) -> None:
        self.add(path, status=status, content_type="", headers={"Location": location})

    def finished(self, path: str) -> asyncio.Event:
        return self._finished.setdefault(path, asyncio.Event())

    async def __aenter__(self) -> BadSite:
        app = web.Application()
        streams: dict[str, Callable[[web.Request], Awaitable[web.StreamResponse]]] = {
            "/big.pdf": self._big_pdf,
            "/big.png": self._big_png,
            "/huge.html": self._huge_html,
            "/bomb.html": self._bomb,
            "/bomb.br": self._brotli_bomb,
            "/drip.html": self._drip,
        }
        for path, handler in streams.items():
            app.router.add_get(path, self._counted(path, handler))
        app.router.add_get("/{tail:.*}", self._route)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, 0).start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _arrive(self, path: str) -> None:
        self.log.append((time.monotonic(), path))
        self.hits[path] += 1
        self.arrived.setdefault(path, asyncio.Event()).set()

    async def _route(self, request: web.Request) -> web.StreamResponse:
        self._arrive(request.path)
        ahead = self._ahead.get(request.path)
        route = ahead.pop(0) if ahead else self.routes.get(request.path)
        if route is None:
            return web.Response(status=404, text="not here", content_type="text/plain")
        if route.gate is not None:
            await route.gate.wait()
        return web.Response(status=route.status, body=route.body, headers=route.headers)

    def _counted(
        self, path: str, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def counted(request: web.Request) -> web.StreamResponse:
            self._arrive(path)
            try:
                return await handler(request)
            finally:
                self.finished(path).set()

        return counted

    async def _stream(
        self, request: web.Request, path: str, response: web.StreamResponse, chunks: list[bytes]
    ) -> web.StreamResponse:
        """Write ``chunks`` round-robin until STREAM_BYTES or the client hangs up."""
        await response.prepare(request)
        try:
            while self.written[path] < STREAM_BYTES:
                for chunk in chunks:
                    await response.write(chunk)
                    self.written[path] += len(chunk)
            await response.write_eof()
        except ConnectionError:  # the client went away: what we count is what it got
            pass
        return response

    async def _big_pdf(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/pdf"})
        response.content_length = STREAM_BYTES
        return await self._stream(request, "/big.pdf", response, [bytes(STREAM_CHUNK)])

    async def _big_png(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "image/png"})
        response.enable_chunked_encoding()
        return await self._stream(request, "/big.png", response, [bytes(STREAM_CHUNK)])

    async def _huge_html(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/html"})
        response.enable_chunked_encoding()
        chunk = b"<p>" + b"x" * (STREAM_CHUNK - 8) + b"</p>\n"
        return await self._stream(request, "/huge.html", response, [chunk])

    async def _bomb(self, request: web.Request) -> web.StreamResponse:
        return await self._send_bomb(request, "/bomb.html", "gzip", *bomb_segments())

    async def _brotli_bomb(self, request: web.Request) -> web.StreamResponse:
        return await self._send_bomb(request, "/bomb.br", "br", *brotli_segments())

    async def _send_bomb(
        self, request: web.Request, path: str, encoding: str, first: bytes, repeat: bytes
    ) -> web.StreamResponse:
        """A small compressed stream that inflates far past any body limit; counts what it sent."""
        response = web.StreamResponse(
            headers={"Content-Type": "text/html", "Content-Encoding": encoding}
        )
        response.enable_chunked_encoding()
        await response.prepare(request)
        try:
            await response.write(first)
            self.written[path] += len(first)
            for _ in range(BOMB_SEGMENTS - 1):
                await response.write(repeat)
                self.written[path] += len(repeat)
        except ConnectionError:
            pass
        return response

    async def _drip(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/html"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        try:
            while True:
                await response.write(b"x")
                self.written["/drip.html"] += 1
                await asyncio.sleep(DRIP_EVERY_S)
        except ConnectionError:
            pass
        return response


class RawServer:
    """Answers each connection's first request with ``response``, then hangs up or hangs;
    ``/robots.txt`` with ``robots`` if given (a crawl's robots check then gets an answer)."""

    def __init__(
        self,
        response: bytes,
        *,
        hang: bool = False,
        delay_s: float = 0.0,
        robots: bytes | None = None,
    ) -> None:
        self._response = response
        self._robots = robots
        self._hang = hang
        self._delay_s = delay_s
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0
        self.connected = asyncio.Event()  # a client has connected

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for writer in self._writers:
            writer.close()
        await asyncio.gather(*self._handlers)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self._writers.add(writer)
        self.connected.set()
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if self._robots is not None and head.startswith(b"GET /robots.txt "):
                writer.write(self._robots)
                await writer.drain()
                return
            if self._delay_s:
                await asyncio.sleep(self._delay_s)
            writer.write(self._response)
            await writer.drain()
            if self._hang:
                while await reader.read(65536):  # until the client hangs up
                    pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self._writers.discard(writer)
