"""One rebalancing step, decided without I/O: from what we own and what etcd shows, what to do.

``Registry`` computes a ``Plan`` on every pass and carries it out; each action is guarded by an etcd
transaction, so a plan made from a slightly stale view can fail an action but never break
ownership (the next pass, on fresher news, plans again).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from jetcrawl.registry.assignment import assign
from jetcrawl.registry.records import Claim

__all__ = ["Plan", "desired_shards", "plan"]


@dataclass(frozen=True, slots=True)
class Plan:
    lose: tuple[int, ...] = ()  # owned, but the key is gone or rewritten: stop, nothing to delete
    release: tuple[tuple[int, int], ...] = ()  # (shard, fence) owned, desired elsewhere
    take: tuple[tuple[int, int], ...] = ()  # (shard, fence) ours in etcd, not here, desired
    delete: tuple[tuple[int, int], ...] = ()  # (shard, fence) ours in etcd, not here, not desired
    acquire: tuple[int, ...] = ()  # desired here and free


def desired_shards(me: str, shards: int, members: Sequence[str]) -> set[int]:
    return {shard for shard, worker in assign(shards, members).items() if worker == me}


def plan(
    *,
    me: str,
    lease: int,
    desired: set[int],
    owned: Mapping[int, int],
    claims: Mapping[int, Claim],
) -> Plan:
    """The step from ``owned`` (shard -> fence) towards ``desired``, given etcd's ``claims``."""
    lose: list[int] = []
    release: list[tuple[int, int]] = []
    for shard, fence in sorted(owned.items()):
        held = claims.get(shard)
        if held is None or held.fence != fence:
            lose.append(shard)
        elif shard not in desired:
            release.append((shard, fence))
    # Ours in etcd (this lease) but not owned here: a create whose answer was lost, or a failed
    # delete. Keys of an older lease of ours are not ours any more: they go with that lease.
    stray = sorted(
        (shard, held.fence)
        for shard, held in claims.items()
        if shard not in owned and held.worker == me and held.lease == lease
    )
    return Plan(
        lose=tuple(lose),
        release=tuple(release),
        take=tuple((shard, fence) for shard, fence in stray if shard in desired),
        delete=tuple((shard, fence) for shard, fence in stray if shard not in desired),
        acquire=tuple(sorted(desired - owned.keys() - claims.keys())),
    )
