"""The cluster as etcd last showed it, merged from listings and watched changes by revision.

A listing (a full read, at one revision) and the watch (a stream of changes) overlap in time: a
reconcile listing may return while the watch is ahead of it or behind it, and our own writes are
recorded as soon as etcd answers them, before the watch echoes them back. Each key therefore keeps
the newest state seen, by revision, and a deleted key leaves a tombstone (the deletion's revision)
so that an older put arriving late cannot bring it back. Tombstones are dropped once the watch has
passed them, as nothing older can arrive after that.
"""

from __future__ import annotations

import logging

from jetcrawl.registry.errors import RecordError
from jetcrawl.registry.etcd import Change, Entry, Listing
from jetcrawl.registry.keys import Keys
from jetcrawl.registry.records import Claim

__all__ = ["ClusterView"]

log = logging.getLogger(__name__)

UNKNOWN_WORKER = ""  # the holder of a claim whose value we cannot decode


class ClusterView:
    def __init__(self, keys: Keys, shards: int) -> None:
        self._keys = keys
        self._shards = shards
        self._entries: dict[str, Entry] = {}
        self._tombstones: dict[str, int] = {}  # key -> revision of its deletion
        self._members: dict[str, Entry] = {}
        self._claims: dict[int, Claim] = {}

    @property
    def members(self) -> tuple[str, ...]:
        """Ids of the workers whose key exists, sorted."""
        return tuple(sorted(self._members))

    @property
    def claims(self) -> dict[int, Claim]:
        """Shard -> its current claim, for shards in ``range(shards)`` that have an owner key."""
        return dict(self._claims)

    def apply(self, change: Change) -> bool:
        """Merge one change; returns whether the view changed. Older news is ignored."""
        if change.revision < self._revision_of(change.key):
            return False
        if change.entry is None:
            self._tombstones[change.key] = change.revision
            if self._entries.pop(change.key, None) is None:
                return False
            self._index(change.key, None)
            return True
        self._tombstones.pop(change.key, None)
        if self._entries.get(change.key) == change.entry:
            return False
        self._entries[change.key] = change.entry
        self._index(change.key, change.entry)
        return True

    def apply_listing(self, listing: Listing) -> bool:
        """Merge a full listing: its entries, and the deletion (as of its revision) of the rest."""
        changed = False
        listed = {entry.key for entry in listing.entries}
        for entry in listing.entries:
            changed |= self.apply(Change.put(entry))
        for key in [key for key in self._entries if key not in listed]:
            changed |= self.apply(Change.delete(key, listing.revision))
        return changed

    def watched_up_to(self, revision: int) -> None:
        """The watch has delivered everything up to ``revision``: drop the tombstones it passed."""
        self._tombstones = {k: r for k, r in self._tombstones.items() if r > revision}

    def _revision_of(self, key: str) -> int:
        entry = self._entries.get(key)
        return entry.mod_revision if entry is not None else self._tombstones.get(key, 0)

    def _index(self, key: str, entry: Entry | None) -> None:
        if (worker := self._keys.worker_of(key)) is not None:
            if entry is None:
                self._members.pop(worker, None)
            else:
                self._members[worker] = entry
        elif (shard := self._keys.shard_of(key)) is not None and shard < self._shards:
            if entry is None:
                self._claims.pop(shard, None)
            else:
                self._claims[shard] = _claim(entry)


def _claim(entry: Entry) -> Claim:
    """The claim in ``entry``; the lease is the one etcd binds the key to, not the one it names."""
    try:
        worker = Claim.from_wire(entry.key, entry.value, fence=entry.mod_revision).worker
    except RecordError as exc:
        # Still held (by its lease): not ours to take until the key goes away.
        log.warning("undecodable shard claim, treated as held by an unknown worker: %s", exc)
        worker = UNKNOWN_WORKER
    return Claim(worker, entry.lease, entry.mod_revision)
