"""SOCKS5 proxies for the fetcher: aiohttp-socks's connector, with the SSRF guard before the proxy.

aiohttp speaks to HTTP proxies itself (``proxy=``); a SOCKS5 proxy needs a connector of its own,
so the fetcher keeps one session per SOCKS5 proxy. The proxy connects to the site for us, where
our socket factory cannot see the address: so the site's name is resolved here, every address is
put to the guard, and the proxy is asked for the checked address itself (an IP in the SOCKS5
request, never the name), so it cannot resolve the name again to somewhere the guard refuses.
For HTTPS the TLS handshake then runs over the tunnel with the site's name (SNI, certificate).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from ssl import SSLContext
from typing import Any

import aiohttp
import python_socks
from aiohttp.client_proto import ResponseHandler
from aiohttp_socks import ProxyConnector
from python_socks.async_.asyncio.v2 import Proxy

__all__ = ["SOCKS_SCHEMES", "SocksConnector", "SocksProxyError"]

SOCKS_SCHEMES = ("socks5",)


class SocksProxyError(aiohttp.ClientConnectionError):
    """The SOCKS5 proxy could not be reached, refused us, or could not reach the site."""


class SocksConnector(ProxyConnector):
    """Connections through one SOCKS5 proxy (credentials resolved), to guarded addresses only.

    ``check(host, port)`` raises (an ``OSError``) for an address the SSRF guard refuses.
    """

    def __init__(self, url: str, check: Callable[[str, int], None], **kwargs: Any) -> None:
        proxy_type, host, port, username, password = python_socks.parse_proxy_url(url)
        super().__init__(host, port, proxy_type, username, password, rdns=False, **kwargs)
        self._check = check

    async def _connect_via_proxy(
        self,
        host: str,
        port: int,
        ssl: SSLContext | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (aiohttp-socks's signature)
    ) -> tuple[asyncio.Transport, ResponseHandler]:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        for *_, sockaddr in infos:
            self._check(str(sockaddr[0]), port)  # every address: the name must not lead there
        address = str(infos[0][4][0])
        proxy = Proxy(
            proxy_type=self._proxy_type,
            host=self._proxy_host,
            port=self._proxy_port,
            username=self._proxy_username,
            password=self._proxy_password,
            rdns=False,
        )
        try:
            stream = await proxy.connect(dest_host=address, dest_port=port, timeout=timeout)
            if ssl is not None:
                stream = await stream.start_tls(hostname=host, ssl_context=ssl)
        except (python_socks.ProxyError, python_socks.ProxyConnectionError) as e:
            where = f"{self._proxy_host}:{self._proxy_port}"
            raise SocksProxyError(f"SOCKS5 proxy {where}: {e}") from e
        except python_socks.ProxyTimeoutError as e:
            where = f"{self._proxy_host}:{self._proxy_port}"
            raise TimeoutError(f"SOCKS5 proxy {where}: {e}") from e
        transport = stream.writer.transport
        protocol = _Handler(loop, stream.writer)
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        return transport, protocol  # type: ignore[return-value]


class _Handler(ResponseHandler):
    """Holds the stream writer: its ``__del__`` would close the transport (aiohttp-socks #27)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, writer: asyncio.StreamWriter) -> None:
        super().__init__(loop)
        self._writer = writer
