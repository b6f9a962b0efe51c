"""Where the registry keeps its records in etcd; nothing else in the package spells a key.

/jetcrawl/<cluster>/workers/<id>   a WorkerInfo (JSON), under the worker's lease
/jetcrawl/<cluster>/shards/<n>     a shard claim (JSON), created only if absent, under the
                                   owner's lease; the key's mod revision is the shard's fence
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Keys"]


@dataclass(frozen=True, slots=True)
class Keys:
    cluster: str

    @property
    def root(self) -> str:
        return f"/jetcrawl/{self.cluster}/"

    @property
    def workers(self) -> str:
        return f"{self.root}workers/"

    @property
    def shards(self) -> str:
        return f"{self.root}shards/"

    def worker(self, worker_id: str) -> str:
        return f"{self.workers}{worker_id}"

    def shard(self, shard: int) -> str:
        return f"{self.shards}{shard}"

    def worker_of(self, key: str) -> str | None:
        """The worker id if ``key`` is a worker key, else None."""
        worker_id = key.removeprefix(self.workers)
        return worker_id if worker_id != key and worker_id and "/" not in worker_id else None

    def shard_of(self, key: str) -> int | None:
        """The shard number if ``key`` is a shard key, else None."""
        number = key.removeprefix(self.shards)
        return int(number) if number != key and number.isascii() and number.isdigit() else None
