"""etcd: worker registration under a lease, heartbeats, shard assignment and ownership, fencing.

assignment.py  assign(): quota-bounded rendezvous hashing, a pure function of the member list
registry.py    Registry: registers this worker, keeps its lease, watches and rebalances shards
plan.py        one rebalancing step, decided without I/O
ownership.py   ShardOwner (the worker side the Registry drives), read_ownership()
membership.py  read_members()
records.py     WorkerInfo and the shard claim, as stored in etcd
view.py        the cluster as last seen, merged from listings and the watch by revision
etcd.py        the aetcd wrapper: endpoints with failover, TLS, call deadlines, errors translated
keys.py        the key layout under /jetcrawl/<cluster>/
errors.py      RegistryError and its tree
"""

from jetcrawl.registry.assignment import assign
from jetcrawl.registry.errors import (
    EtcdRequestError,
    EtcdTimeout,
    EtcdUnavailable,
    RecordError,
    RegistryError,
    RevisionCompacted,
)
from jetcrawl.registry.membership import read_members
from jetcrawl.registry.ownership import ShardOwner, read_ownership
from jetcrawl.registry.records import WorkerInfo
from jetcrawl.registry.registry import Registry

__all__ = [
    "EtcdRequestError",
    "EtcdTimeout",
    "EtcdUnavailable",
    "RecordError",
    "Registry",
    "RegistryError",
    "RevisionCompacted",
    "ShardOwner",
    "WorkerInfo",
    "assign",
    "read_members",
    "read_ownership",
]
