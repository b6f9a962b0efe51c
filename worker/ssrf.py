"""The SSRF guard: which numeric addresses the crawler may connect to.

Refused, unless inside one of the ``allow_nets`` CIDRs: loopback, private (RFC 1918, ULA),
link-local (169.254.169.254, the cloud metadata address, among them), multicast, reserved,
unspecified and any other address that is not globally routable. An IPv6 address that carries an
IPv4 address is judged as that IPv4 address too: IPv4-mapped (``::ffff:0:0/96``),
IPv4-compatible (``::/96``), 6to4 (``2002::/16``), NAT64 (``64:ff9b::/96``; the local-use
``64:ff9b:1::/48`` is refused whole) and Teredo (``2001::/32``, server and client) — Python's
``ipaddress`` calls 6to4 global whatever it carries. The mesh's own NATS and etcd endpoints
(address and port) are refused even inside ``allow_nets``: a crawler never has a reason to talk
HTTP to them, and a test or intranet crawl that opens 127.0.0.0/8 must not open them too.

The check is made by ``Fetcher._open_socket`` on the address of every TCP connection, after DNS
and before connect, so IP literals, every address a name resolves to (DNS rebinding included) and
every redirect hop pass through it.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

from jetcrawl.contract.settings import Settings, redact_urls

__all__ = ["AddressGuard", "Blocked", "refusal"]

log = logging.getLogger(__name__)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_DEFAULT_PORTS = {"nats": 4222, "tls": 4222, "http": 80, "https": 443}
_KINDS = ("unspecified", "loopback", "link_local", "multicast", "reserved", "private")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052: the IPv4 address in the last 32 bits
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")  # RFC 8215: local use, never public


class Blocked(OSError):
    """Raised from the socket factory: the connection attempt fails with this.

    The message is the same for every refused address, so when all of a name's addresses are
    refused the happy-eyeballs connector re-raises this exception itself (it merges differing
    messages into a plain ``OSError``).
    """

    def __init__(self) -> None:
        super().__init__(errno.EACCES, "address refused by the SSRF guard")


def refusal(ip: IPAddress) -> str | None:
    """Why ``ip`` is refused by default ("loopback", "private", ...), or None if it is public."""
    for candidate in _judged(ip):
        reason = _kind(candidate)
        if reason is not None:
            return reason
    return None


def _kind(ip: IPAddress) -> str | None:
    if ip in _NAT64_LOCAL:
        return "not_global"
    for kind in _KINDS:
        if getattr(ip, f"is_{kind}"):
            return kind
    return None if ip.is_global else "not_global"


def _judged(ip: IPAddress) -> tuple[IPAddress, ...]:
    """``ip``, and the IPv4 addresses an IPv6 one carries (a connection may reach them)."""
    if isinstance(ip, ipaddress.IPv4Address):
        return (ip,)
    carried: list[IPAddress] = []
    if ip.ipv4_mapped is not None:
        carried.append(ip.ipv4_mapped)
    if ip.sixtofour is not None:
        carried.append(ip.sixtofour)
    if ip.teredo is not None:
        carried.extend(ip.teredo)
    low32 = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in _NAT64 or (int(ip) >> 32 == 0 and int(ip) > 1):  # NAT64; IPv4-compatible
        carried.append(low32)
    return (*carried, ip)


class AddressGuard:
    def __init__(self, allow_nets: Iterable[str]) -> None:
        self._allowed: tuple[IPNetwork, ...] = tuple(
            ipaddress.ip_network(cidr, strict=False) for cidr in allow_nets
        )
        self._endpoints: set[tuple[IPAddress, int]] = set()

    def check(self, host: str, port: int) -> str | None:
        """Why a connection to ``host`` (numeric) on ``port`` is refused, or None to allow it."""
        ip = ipaddress.ip_address(host.split("%", 1)[0])  # drop an IPv6 zone id
        judged = _judged(ip)
        if any((candidate, port) in self._endpoints for candidate in judged):
            return "mesh_endpoint"
        for candidate in judged:  # each one refused must be inside allow_nets
            reason = _kind(candidate)
            if reason is not None and not any(candidate in net for net in self._allowed):
                return reason
        return None

    async def add_endpoints(self, settings: Settings) -> None:
        """Refuse the NATS and etcd endpoints of ``settings`` (names resolved now)."""
        urls = [*settings.nats_url.split(","), *settings.etcd_url.split(",")]
        loop = asyncio.get_running_loop()
        for url in (u.strip() for u in urls):
            if not url:
                continue
            parts = urlsplit(url if "://" in url else f"nats://{url}")
            if parts.hostname is None:
                continue
            try:
                port = parts.port or _DEFAULT_PORTS.get(parts.scheme, 0)
                infos = await loop.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
            except (OSError, ValueError) as e:
                log.warning("cannot resolve %s to guard it: %r", redact_urls(url), e)
                continue
            for *_, address in infos:
                ip = ipaddress.ip_address(str(address[0]).split("%", 1)[0])
                if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
                    ip = ip.ipv4_mapped
                self._endpoints.add((ip, port))
