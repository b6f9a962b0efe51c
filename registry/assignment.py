"""Desired shard owners: rendezvous hashing bounded by quotas (see DESIGN.md, "Ownership").

Every live worker may own ⌊S/n⌋ or ⌈S/n⌉ of the ``S`` shards; the ⌈⌉ quotas go to the first
``S mod n`` workers in sorted id order. All (shard, worker) pairs are ranked by a stable 64-bit hash
of the pair and taken in descending order while the worker still has quota and the shard has no
owner yet. The result is a pure function of the member set (not of its order), balanced to one
shard, and close to the minimum number of moves when one worker joins or leaves, because each shard
keeps preferring the same workers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

__all__ = ["assign", "quotas", "score"]


def score(shard: int, worker: str) -> int:
    """The rendezvous weight of ``worker`` for ``shard``: 64 well-mixed bits, stable everywhere."""
    digest = hashlib.blake2b(f"{shard}:{worker}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def quotas(shards: int, workers: Sequence[str]) -> dict[str, int]:
    """Shards each worker may own: ⌈S/n⌉ for the first ``S mod n`` ids, ⌊S/n⌋ for the rest."""
    members = sorted(set(workers))
    if not members:
        return {}
    base, extra = divmod(shards, len(members))
    return {worker: base + (1 if i < extra else 0) for i, worker in enumerate(members)}


def assign(shards: int, workers: Sequence[str]) -> dict[int, str]:
    """Map every shard in ``range(shards)`` to one of ``workers``; ``{}`` without workers."""
    if shards < 0:
        raise ValueError(f"shards must be >= 0, got {shards}")
    left = quotas(shards, workers)
    ranked = sorted(
        ((score(shard, worker), shard, worker) for shard in range(shards) for worker in left),
        reverse=True,
    )
    owners: dict[int, str] = {}
    for _, shard, worker in ranked:
        if shard in owners or left[worker] == 0:
            continue
        owners[shard] = worker
        left[worker] -= 1
        if len(owners) == shards:
            break
    return owners
