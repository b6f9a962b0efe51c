"""A local HTTP forward proxy for the proxy tests: it records which requests went through it.

``ForwardProxy`` is an aiohttp server on a loopback address (an OS-chosen port) that takes
absolute-form requests (``GET http://host:port/path``), as clients send plain-HTTP requests to a
proxy, fetches them with its own client and answers with the upstream response. ``log`` lists
the URLs it carried, in order. ``require_auth`` makes it answer 407 to a request without those
Basic credentials; ``wall`` makes it answer every request with that page (200), as a site does to
a proxy whose address it has flagged. ``dead_proxy_url()`` is the URL of a port nothing listens on.
"""

from __future__ import annotations

import base64
import socket
from types import TracebackType

import aiohttp
from aiohttp import web

__all__ = ["ForwardProxy", "dead_proxy_url"]


class ForwardProxy:
    def __init__(
        self,
        host: str = "127.0.0.1",
        require_auth: tuple[str, str] | None = None,
        wall: bytes | None = None,
    ):
        self.host = host
        self._wall = wall
        self.port = 0
        self.log: list[str] = []  # the URLs carried
        self.refused = 0  # requests answered 407
        self._auth = require_auth
        self._runner: web.AppRunner | None = None
        self._client: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def __aenter__(self) -> ForwardProxy:
        self._client = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
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
        if self._client is not None:
            await self._client.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        if self._auth is not None:
            user, password = self._auth
            expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
            if request.headers.get("Proxy-Authorization") != expected:
                self.refused += 1
                return web.Response(status=407, headers={"Proxy-Authenticate": "Basic"})
        target = str(request.url)  # absolute-form: the URL the client wants
        self.log.append(target)
        if self._wall is not None:
            return web.Response(body=self._wall, content_type="text/html")
        assert self._client is not None
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in ("host", "proxy-authorization")
        }
        async with self._client.get(target, headers=headers, allow_redirects=False) as upstream:
            body = await upstream.read()
            kept = {
                k: v
                for k, v in upstream.headers.items()
                if k.lower() in ("content-type", "content-encoding", "location", "retry-after")
            }
            return web.Response(status=upstream.status, body=body, headers=kept)


def dead_proxy_url(host: str = "127.0.0.1") -> str:
    """A proxy URL on a port that was free a moment ago: connecting to it is refused."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        port = sock.getsockname()[1]
    return f"http://{host}:{port}"
