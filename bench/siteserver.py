"""The benchmark site served by separate processes, so its CPU is counted for no system.

``SiteServer`` (the harness side) binds one listening socket per host (``127.0.0.{10+h}``, port
chosen by the OS), then starts ``processes`` copies of ``python -m bench.siteserver``. Every copy
inherits every socket and accepts on all of them, so the kernel spreads connections over the
copies. Each copy builds the same site from the same ``SiteSpec``, pre-renders every response, and
answers a request with one dictionary lookup (an asyncio protocol of its own, uvloop). A copy prints
``READY <control port>`` once it serves; the control port answers ``/reset`` (before a run) and
``/stats`` (after it): request counts per URL, the bytes answered, how many answers were HTML pages
and how many binaries, and the first and last request's time (the site's and each host's), from
which the harness takes each system's crawl span, checks what was fetched, and how often, and
shows the work it did. A host the site gives a delay (the realistic shape's slow host) answers
each request that much later; /stats names it, so the harness can say how busy a system kept it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import selectors
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from types import TracebackType
from typing import Self, cast

import orjson
from aiohttp import web

from bench.loop import run
from bench.procs import DIE_WITH_PARENT, child_env
from tests.support.site import realistic
from tests.support.site.model import DISALLOWED_PREFIX
from tests.support.site.shapes import BenchSpec, from_wire, generate, to_wire
from tests.support.site.tree import address

__all__ = ["SiteServer", "SiteStats"]

READY_TIMEOUT_S = 120.0
BACKLOG = 4096
_TRACKING_PREFIXES = ("utm_", "fbclid=", "gclid=", *(f"{p}=" for p in realistic.TRACKING_PARAMS))


@dataclass(slots=True)
class SiteStats:
    """What the site was asked since the last reset, merged over its processes."""

    requests: int = 0  # robots.txt excluded
    robots: int = 0
    bytes: int = 0  # of every answer, headers included (robots.txt excluded)
    html: int = 0  # answers that were HTML pages (200 text/html)
    binaries: int = 0  # answers that were 200 and not HTML
    first: float = 0.0  # epoch seconds of the first and last request (robots.txt included)
    last: float = 0.0
    counts: Counter[str] = field(default_factory=Counter)  # URL as requested -> requests
    # authority -> epoch seconds of its last request (robots.txt included)
    hosts: dict[str, float] = field(default_factory=dict)
    host_first: dict[str, float] = field(default_factory=dict)  # ... and of its first
    host_requests: Counter[str] = field(default_factory=Counter)  # ... and how many (robots too)
    delays_s: dict[str, float] = field(default_factory=dict)  # the hosts that answer late: how late

    @property
    def span_s(self) -> float:
        return max(0.0, self.last - self.first)

    @property
    def refetches(self) -> int:
        return sum(n - 1 for n in self.counts.values() if n > 1)

    @property
    def disallowed_hits(self) -> int:
        return sum(1 for url in self.counts if DISALLOWED_PREFIX in url)


class SiteServer:
    """The site's server processes; a context manager (``start()`` / ``stop()``)."""

    def __init__(self, spec: BenchSpec, processes: int, log_dir: Path) -> None:
        self.spec = spec
        self.processes = processes
        self.log_dir = log_dir
        self.authorities: list[str] = []
        self._procs: list[subprocess.Popen[bytes]] = []
        self._control: list[str] = []

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self._procs]

    def start(self) -> None:
        sockets = []
        try:
            for host in range(self.spec.hosts):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((address(host), 0))
                sock.listen(BACKLOG)
            self.authorities = [f"{address(h)}:{s.getsockname()[1]}" for h, s in enumerate(sockets)]
            fds = [sock.fileno() for sock in sockets]
            self.log_dir.mkdir(parents=True, exist_ok=True)
            for n in range(self.processes):
                with (self.log_dir / f"site-{n + 1}.log").open("wb") as log:
                    self._procs.append(
                        subprocess.Popen(
                            [
                                sys.executable,
                                "-m",
                                "bench.siteserver",
                                to_wire(self.spec),
                                ",".join(map(str, fds)),
                                ",".join(self.authorities),
                            ],
                            stdout=subprocess.PIPE,
                            stderr=log,
                            pass_fds=fds,
                            env=child_env(),
                            preexec_fn=DIE_WITH_PARENT,
                        )
                    )
            self._control = [_read_ready(proc) for proc in self._procs]
        except BaseException:
            self.stop()
            raise
        finally:
            for sock in sockets:
                sock.close()  # the server processes hold their own copies

    def stop(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self._procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        self._procs.clear()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def reset(self) -> None:
        for control in self._control:
            _get(f"{control}/reset")

    def stats(self) -> SiteStats:
        merged = SiteStats()
        firsts, lasts = [], []
        for control in self._control:
            part = orjson.loads(_get(f"{control}/stats"))
            for name in ("requests", "robots", "bytes", "html", "binaries"):
                setattr(merged, name, getattr(merged, name) + part[name])
            if part["first"]:
                firsts.append(part["first"])
                lasts.append(part["last"])
            for host, target, count in part["counts"]:
                merged.counts[f"http://{self.authorities[host]}{target}"] += count
            for host, first, last, requests in part["hosts"]:
                name = self.authorities[host]
                merged.hosts[name] = max(merged.hosts.get(name, last), last)
                merged.host_first[name] = min(merged.host_first.get(name, first), first)
                merged.host_requests[name] += requests
            for host, delay_s in part["delays"]:
                merged.delays_s[self.authorities[host]] = delay_s
        merged.first = min(firsts, default=0.0)
        merged.last = max(lasts, default=0.0)
        return merged


def _read_ready(proc: subprocess.Popen[bytes]) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(READY_TIMEOUT_S):
            raise RuntimeError(f"site process {proc.pid} not ready in {READY_TIMEOUT_S:g} s")
    line = proc.stdout.readline().decode().split()
    if len(line) != 2 or line[0] != "READY":
        raise RuntimeError(f"site process {proc.pid} failed to start (see its log)")
    return f"http://127.0.0.1:{line[1]}"


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as response:
        body: bytes = response.read()
        return body


# ---------------------------------------------------------------------- the server process


class _Counters:
    def __init__(self, delays_s: dict[int, float]) -> None:
        self.requests = 0
        self.robots = 0
        self.bytes = 0
        self.html = 0
        self.binaries = 0
        self.first = 0.0
        self.last = 0.0
        self.counts: Counter[tuple[int, str]] = Counter()
        self.hosts: dict[int, list[float]] = {}  # host -> [first, last request's time, requests]
        self.delays_s = delays_s  # the site's, for the harness to know

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "requests": self.requests,
                "robots": self.robots,
                "bytes": self.bytes,
                "html": self.html,
                "binaries": self.binaries,
                "first": self.first,
                "last": self.last,
                "counts": [[h, t, n] for (h, t), n in self.counts.items()],
                "hosts": [[host, *seen] for host, seen in self.hosts.items()],
                "delays": list(self.delays_s.items()),
            }
        )


def _normalize(target: str) -> str:
    """The model's key for a request target a crawler did not canonicalize."""
    path, _, query = target.partition("?")
    pairs = sorted(p for p in query.split("&") if p and not p.startswith(_TRACKING_PREFIXES))
    return f"{path}?{'&'.join(pairs)}" if pairs else path


class _HostProtocol(asyncio.Protocol):
    """HTTP/1.1 for one host: each request answered with bytes rendered before the first one.

    The site is the harness, not a system: it must cost the machine as little as it can, since
    every core it uses is one the system under test does not get, and aiohttp's server cost far
    more CPU a request. This one reads the request line of each request, skips the
    headers (a GET has no body), counts it and writes the prepared response: keep-alive unless
    the client asks to close, pipelined requests answered in order.
    """

    def __init__(
        self,
        host: int,
        answer: Callable[[int, str], bytes],
        count: Callable[..., None],
        delay_s: float = 0.0,
    ):
        self._host = host
        self._answer = answer
        self._count = count
        self._delay_s = delay_s
        self._transport: asyncio.Transport | None = None
        self._buffer = b""
        # With a delay, answers wait here in request order; each timer sends the oldest one
        # (None: close), so pipelined answers keep their order whatever order timers fire in.
        self._delayed: deque[bytes | None] = deque()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it

    def data_received(self, data: bytes) -> None:
        transport = self._transport
        assert transport is not None
        buffer = self._buffer + data if self._buffer else data
        start = 0
        while True:
            end = buffer.find(b"\r\n\r\n", start)
            if end < 0:
                break
            head = buffer[start:end]
            start = end + 4
            line_end = head.find(b"\r\n")
            request_line = head if line_end < 0 else head[:line_end]
            parts = request_line.split(b" ")
            if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
                transport.write(_BAD_REQUEST)
                transport.close()
                return
            target = parts[1].decode("latin-1")
            self._count(self._host, target)
            self._send(self._answer(self._host, target))
            if b"\r\nconnection: close" in head.lower() or parts[2] == b"HTTP/1.0":
                self._send(None)
                return
        self._buffer = buffer[start:]
        if len(self._buffer) > _MAX_HEAD_BYTES:
            transport.write(_BAD_REQUEST)
            transport.close()

    def _send(self, response: bytes | None) -> None:
        """Write ``response`` (None: close), now or after this host's delay."""
        if not self._delay_s:
            self._write(response)
            return
        self._delayed.append(response)
        asyncio.get_running_loop().call_later(self._delay_s, self._send_oldest)

    def _send_oldest(self) -> None:
        self._write(self._delayed.popleft())

    def _write(self, response: bytes | None) -> None:
        transport = self._transport
        assert transport is not None
        if transport.is_closing():
            return
        if response is None:
            transport.close()
        else:
            transport.write(response)


_MAX_HEAD_BYTES = 64 * 1024
_BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


def _response(status: int, kind: str, body: bytes) -> bytes:
    """The whole HTTP/1.1 response: a redirect's ``kind`` is its Location."""
    reason = HTTPStatus(status).phrase
    if 300 <= status < 400:
        head = f"HTTP/1.1 {status} {reason}\r\nLocation: {kind}\r\nContent-Length: 0\r\n\r\n"
        return head.encode("latin-1")
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("latin-1") + body


def _kind(status: int, kind: str) -> str:
    """What an answer counts as: "html" (a page), "binary" (any other 200) or "other"."""
    if status != 200:
        return "other"
    return "html" if kind.startswith("text/html") else "binary"


async def _serve(spec: BenchSpec, fds: list[int], authorities: list[str]) -> None:
    site = generate(spec)
    delays = site.delays_s
    # One rendered answer per body: the realistic shape's binaries share their bodies.
    rendered: dict[tuple[int, str, int], bytes] = {}
    table: dict[tuple[int, str], tuple[bytes, str]] = {}
    for key, (status, kind, body) in site.responses(authorities).items():
        shared = (status, kind, id(body))
        if shared not in rendered:
            rendered[shared] = _response(status, kind, body)
        table[key] = (rendered[shared], _kind(status, kind))
    del site, rendered
    counters = _Counters(delays)
    not_found = (_response(404, "text/plain", b"not found"), "other")

    def count(host: int, target: str) -> None:
        now = time.time()
        if not counters.first:
            counters.first = now
        counters.last = now
        seen = counters.hosts.get(host)
        if seen is None:
            counters.hosts[host] = [now, now, 1]
        else:
            seen[1] = now
            seen[2] += 1
        if target == "/robots.txt":
            counters.robots += 1
        else:
            counters.requests += 1
            counters.counts[host, target] += 1

    def answer(host: int, target: str) -> bytes:
        response, kind = (
            table.get((host, target)) or table.get((host, _normalize(target))) or not_found
        )
        if target != "/robots.txt":
            counters.bytes += len(response)
            if kind == "html":
                counters.html += 1
            elif kind == "binary":
                counters.binaries += 1
        return response

    def handler(host: int) -> Callable[[], asyncio.Protocol]:
        return lambda: _HostProtocol(host, answer, count, delays.get(host, 0.0))

    async def control(request: web.BaseRequest) -> web.StreamResponse:
        nonlocal counters
        if request.path == "/reset":
            counters = _Counters(delays)
            return web.Response(text="ok")
        if request.path == "/stats":
            return web.Response(body=counters.to_json(), content_type="application/json")
        return web.Response(status=404)

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    servers = []
    for host, fd in enumerate(fds):
        sock = socket.socket(fileno=fd)
        sock.setblocking(False)
        servers.append(await loop.create_server(handler(host), sock=sock, backlog=BACKLOG))
    control_server = await loop.create_server(web.Server(control, access_log=None), "127.0.0.1", 0)
    servers.append(control_server)
    port = control_server.sockets[0].getsockname()[1]
    sys.stdout.write(f"READY {port}\n")
    sys.stdout.flush()
    await stop.wait()
    for server in servers:
        server.close()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(2):
            for server in servers:
                await server.wait_closed()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.siteserver")
    parser.add_argument("spec", help="the site's spec as JSON (shapes.to_wire)")
    parser.add_argument("fds", help="listening socket descriptors, one per host, comma-separated")
    parser.add_argument("authorities", help="127.0.0.N:PORT per host, comma-separated")
    args = parser.parse_args(argv)
    spec = from_wire(args.spec)
    fds = [int(fd) for fd in args.fds.split(",")]
    authorities = args.authorities.split(",")
    run(_serve(spec, fds, authorities))


if __name__ == "__main__":
    main()
