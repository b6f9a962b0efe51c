"""A local SOCKS5 proxy for the proxy tests: it records where it was asked to connect.

``SocksProxy`` is an asyncio server on a loopback address (an OS-chosen port) speaking SOCKS5
(RFC 1928) without authentication, CONNECT only, relaying bytes both ways. ``connects`` lists
each CONNECT's destination as asked, ``("ip", "127.0.0.2", 8080)`` or ``("name", "example.com",
80)``: a test reads which connections went through it and whether it was given a name to resolve.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import struct
from types import TracebackType

__all__ = ["SocksProxy"]

_VERSION, _NO_AUTH, _CONNECT = 5, 0, 1
_IPV4, _NAME, _IPV6 = 1, 3, 4


class SocksProxy:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = 0
        self.connects: list[tuple[str, str, int]] = []
        self._server: asyncio.Server | None = None
        self._relays: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"socks5://{self.host}:{self.port}"

    async def __aenter__(self) -> SocksProxy:
        self._server = await asyncio.start_server(self._serve, self.host, 0)
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
        for relay in list(self._relays):
            relay.cancel()
        if self._relays:
            await asyncio.wait(self._relays)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._relays.add(task)
        try:
            await self._session(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away
        finally:
            self._relays.discard(task)
            writer.close()

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        version, n_methods = await reader.readexactly(2)
        methods = await reader.readexactly(n_methods)
        if version != _VERSION or _NO_AUTH not in methods:
            writer.write(bytes([_VERSION, 0xFF]))  # no acceptable method
            return
        writer.write(bytes([_VERSION, _NO_AUTH]))
        version, command, _, kind = await reader.readexactly(4)
        if kind == _IPV4:
            host, asked = str(ipaddress.IPv4Address(await reader.readexactly(4))), "ip"
        elif kind == _IPV6:
            host, asked = str(ipaddress.IPv6Address(await reader.readexactly(16))), "ip"
        else:
            length = (await reader.readexactly(1))[0]
            host, asked = (await reader.readexactly(length)).decode(), "name"
        (port,) = struct.unpack("!H", await reader.readexactly(2))
        if command != _CONNECT:
            writer.write(bytes([_VERSION, 7, 0, _IPV4, 0, 0, 0, 0, 0, 0]))  # not supported
            return
        self.connects.append((asked, host, port))
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.write(bytes([_VERSION, 5, 0, _IPV4, 0, 0, 0, 0, 0, 0]))  # refused
            return
        writer.write(bytes([_VERSION, 0, 0, _IPV4, 0, 0, 0, 0, 0, 0]))
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            up_writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    with contextlib.suppress(OSError):
        writer.write_eof()
