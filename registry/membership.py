"""Who is in the cluster: the live workers, read straight from etcd (for ``jetcrawl status``)."""

from __future__ import annotations

from jetcrawl.contract.settings import Settings
from jetcrawl.registry.errors import RecordError
from jetcrawl.registry.etcd import Etcd
from jetcrawl.registry.keys import Keys
from jetcrawl.registry.records import WorkerInfo

__all__ = ["read_members"]


async def read_members(settings: Settings) -> dict[str, WorkerInfo]:
    """Live workers of ``settings.cluster`` by id, sorted; raises ``RegistryError`` subclasses."""
    keys = Keys(settings.cluster)
    async with Etcd.from_settings(settings) as etcd:
        listing = await etcd.get_prefix(keys.workers)
    members: dict[str, WorkerInfo] = {}
    for entry in sorted(listing.entries, key=lambda e: e.key):
        info = WorkerInfo.from_wire(entry.key, entry.value)
        if keys.worker_of(entry.key) != info.id:
            raise RecordError(entry.key, f"holds the record of worker {info.id!r}")
        members[info.id] = info
    return members
