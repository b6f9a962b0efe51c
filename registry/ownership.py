"""Who owns which shard: the worker side the registry drives, and a read of etcd's truth."""

from __future__ import annotations

from typing import Protocol

from jetcrawl.contract.settings import Settings
from jetcrawl.registry.etcd import Etcd
from jetcrawl.registry.keys import Keys
from jetcrawl.registry.records import Claim

__all__ = ["ShardOwner", "read_ownership"]


class ShardOwner(Protocol):
    """What the registry calls on the worker. Calls for one shard never overlap.

    ``on_lease_lost`` is called only after any ``on_acquired``/``on_revoke`` in progress has been
    cancelled; after it, the worker owns nothing until the next ``on_acquired``.
    """

    async def on_acquired(self, shard: int, fence: int) -> None:
        """Start pulling ``shard``; ``fence`` is the owner key's revision (higher is newer)."""

    async def on_revoke(self, shard: int) -> None:
        """Stop pulling ``shard`` and drain its in-flight tasks; return when drained."""

    async def on_lease_lost(self) -> None:
        """Stop pulling every shard at once; others may own them already. No draining."""


async def read_ownership(settings: Settings, etcd: Etcd | None = None) -> dict[int, str]:
    """Shard -> owning worker id as etcd has it now (shards without an owner are absent).

    Through ``etcd`` if given (a caller that reads again and again), else a client of its own.
    """
    keys = Keys(settings.cluster)
    if etcd is None:
        async with Etcd.from_settings(settings) as own:
            listing = await own.get_prefix(keys.shards)
    else:
        listing = await etcd.get_prefix(keys.shards)
    owners: dict[int, str] = {}
    for entry in listing.entries:
        shard = keys.shard_of(entry.key)
        if shard is not None:
            owners[shard] = Claim.from_wire(entry.key, entry.value, fence=entry.mod_revision).worker
    return dict(sorted(owners.items()))
