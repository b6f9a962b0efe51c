"""Network namespaces joined by a bridge, for partition tests: real cuts between real processes.

``Network`` makes a Linux bridge in the test's own (root) namespace with a /24 of its own, and
``node(name)`` a namespace on it (a veth pair, one end in the namespace, the other on the bridge)
with its own address. A server or service runs in a node behind ``node.prefix`` (``ip netns exec
NS``); the test process reaches every node through the bridge, and ``address()`` gives the bridge
more addresses for what the test serves itself (the website). ``cut(a, b)`` partitions two nodes
with blackhole routes on both sides (packets between them are dropped, each side's connections
time out as over a broken link; every other path stays up); ``heal(a, b)`` takes them away.

Names carry this process's pid and a counter, so tests under xdist never share a namespace, an
interface or a subnet (picked under a lock among those no interface uses). ``close()`` deletes
every namespace and the bridge even when the test failed; namespaces a killed run left behind are
deleted by the next run. Needs root and ``ip`` (iproute2): ``require_netns()`` skips without them,
and fails on CI, which runs as root and installs iproute2 (``.ci/run``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import ipaddress
import itertools
import os
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import NoReturn, Self

import pytest

from tests.support.tools import require

__all__ = ["Network", "Node", "require_netns"]

NS_PREFIX = "jc-"  # jc-<pid>-<n>-<name>
ALIAS = "jetcrawl-test-"  # a bridge's alias: jetcrawl-test-<pid>
LOCK = Path("/tmp/jetcrawl-netns.lock")
SUBNETS = ipaddress.ip_network("10.0.0.0/8")
FIRST_EXTRA = 200  # addresses .200 and up on the bridge are the test's own
IP_TIMEOUT_S = 10.0
_counter = itertools.count()


class NetnsError(RuntimeError):
    """An ``ip`` command failed; the command and its error output are in the message."""


def require_netns() -> str:
    """The ``ip`` program, when this process may make namespaces; skip the test otherwise (and
    fail it on CI)."""
    ip = require("ip", "network namespaces for the partition tests; apt-get install iproute2")
    if os.geteuid() != 0:
        unavailable("network namespaces need root; CI runs as root")
    return ip


def unavailable(why: str) -> NoReturn:
    """Skip the test for ``why``; on CI, where namespaces must work, fail it."""
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


async def ip(*args: str, check: bool = True) -> str:
    """``ip ARGS``; its output, or ``NetnsError`` naming the command and the cause."""
    proc = await asyncio.create_subprocess_exec(
        "ip",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(IP_TIMEOUT_S):
        out, err = await proc.communicate()
    if check and proc.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {err.decode().strip() or proc.returncode}")
    return out.decode()


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    ns: str  # the namespace's name
    address: str  # on the bridge's /24

    @property
    def prefix(self) -> tuple[str, ...]:
        """What runs a command in this node."""
        return ("ip", "netns", "exec", self.ns)


class Network:
    """A bridge and its namespaces; ``async with Network() as net`` (see the module docstring)."""

    def __init__(self) -> None:
        self._tag = f"{os.getpid()}-{next(_counter)}"
        self._short = f"{random.getrandbits(24):06x}"  # interface names: 15 characters at most
        self.bridge = f"jcb{self._short}"
        self.subnet: ipaddress.IPv4Network | None = None
        self.nodes: dict[str, Node] = {}
        self._extra = itertools.count(FIRST_EXTRA)
        self._cuts: set[tuple[str, str]] = set()  # (namespace, blackholed address)

    async def __aenter__(self) -> Self:
        require_netns()
        await _delete_leftovers()
        try:
            with _locked():
                self.subnet = await _free_subnet()
                try:
                    await ip("link", "add", self.bridge, "type", "bridge")
                except NetnsError as e:  # root in a container without CAP_NET_ADMIN, say
                    unavailable(f"cannot make a bridge here: {e}")
                await ip("link", "set", self.bridge, "alias", f"{ALIAS}{os.getpid()}")
                await ip("addr", "add", f"{self._host(1)}/24", "dev", self.bridge)
            await ip("link", "set", self.bridge, "up")
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def _host(self, n: int) -> str:
        assert self.subnet is not None
        return str(self.subnet.network_address + n)

    @property
    def gateway(self) -> str:
        """The bridge's own address: the test process, as the nodes see it."""
        return self._host(1)

    async def node(self, name: str) -> Node:
        """A new namespace on the bridge, with the next address."""
        index = len(self.nodes) + 2
        node = Node(name, f"{NS_PREFIX}{self._tag}-{name}", self._host(index))
        outside, inside = f"jv{self._short}{index}", f"jn{self._short}{index}"
        self.nodes[name] = node
        await ip("netns", "add", node.ns)
        await ip("link", "add", outside, "type", "veth", "peer", "name", inside, "netns", node.ns)
        await ip("link", "set", outside, "master", self.bridge, "up")
        inns = ("-n", node.ns)
        await ip(*inns, "addr", "add", f"{node.address}/24", "dev", inside)
        await ip(*inns, "link", "set", inside, "up")
        await ip(*inns, "link", "set", "lo", "up")
        return node

    async def address(self) -> str:
        """One more address of the test process itself, on the bridge (a website's host)."""
        address = self._host(next(self._extra))
        await ip("addr", "add", f"{address}/24", "dev", self.bridge)
        return address

    async def cut(self, a: Node, *others: Node) -> None:
        """Drop every packet between ``a`` and each of ``others``, both ways."""
        for b in others:
            for ns, address in ((a.ns, b.address), (b.ns, a.address)):
                await ip("-n", ns, "route", "add", "blackhole", f"{address}/32")
                self._cuts.add((ns, address))

    async def heal(self, a: Node, *others: Node) -> None:
        """Undo ``cut(a, *others)``."""
        for b in others:
            for ns, address in ((a.ns, b.address), (b.ns, a.address)):
                await ip("-n", ns, "route", "del", "blackhole", f"{address}/32")
                self._cuts.discard((ns, address))

    async def close(self) -> None:
        """Delete the namespaces (and so their veth pairs) and the bridge; idempotent."""
        for node in self.nodes.values():
            await ip("netns", "delete", node.ns, check=False)
        self.nodes.clear()
        await ip("link", "delete", self.bridge, check=False)


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One subnet picked at a time on this machine (xdist workers, several runs)."""
    with LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


async def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10/8 that no interface here has an address in."""
    output = await ip("-4", "-o", "addr")
    used = [ipaddress.ip_interface(m).network for m in re.findall(r"inet (\S+)", output)]
    for _ in range(1000):
        candidate = ipaddress.IPv4Network(
            f"10.{random.randrange(100, 250)}.{random.randrange(0, 256)}.0/24"
        )
        if not any(candidate.overlaps(net) for net in used):
            return candidate
    raise NetnsError(f"no free /24 in {SUBNETS} after 1000 tries")


async def _delete_leftovers() -> None:
    """Namespaces (and bridges) of test processes that no longer run."""
    for line in (await ip("netns", "list", check=False)).splitlines():
        name = line.split()[0] if line.split() else ""
        match = re.fullmatch(rf"{NS_PREFIX}(\d+)-\d+-.+", name)
        if match and not _alive(int(match.group(1))):
            await ip("netns", "delete", name, check=False)
    for match in re.finditer(
        rf"^\d+: (\S+?):.*alias {ALIAS}(\d+)",
        await ip("-o", "link", "show", "type", "bridge"),
        re.M,
    ):
        if not _alive(int(match.group(2))):
            await ip("link", "delete", match.group(1), check=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
