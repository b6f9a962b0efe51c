"""Quota-bounded rendezvous assignment: balance, determinism, and movement on join and leave."""

from __future__ import annotations

import random
import statistics
from collections import Counter
from collections.abc import Sequence

import pytest

from jetcrawl.registry.assignment import assign, quotas, score

FOUR = ("worker-a", "worker-b", "worker-c", "worker-d")


def loads(owners: dict[int, str]) -> Counter[str]:
    return Counter(owners.values())


def moved(before: dict[int, str], after: dict[int, str]) -> int:
    return sum(1 for shard, worker in after.items() if before.get(shard) != worker)


def minimum_moves(shards: int, before: dict[int, str], members: Sequence[str]) -> int:
    """The fewest shards any balanced assignment for ``members`` must move away from ``before``."""
    held = loads(before)
    return sum(max(0, quota - held[worker]) for worker, quota in quotas(shards, members).items())


def plain_rendezvous(shards: int, workers: Sequence[str]) -> dict[int, str]:
    """Unbounded highest-random-weight hashing: every shard goes to its top-scoring worker."""
    return {shard: max(workers, key=lambda w: score(shard, w)) for shard in range(shards)}


def random_members(rng: random.Random, n: int) -> list[str]:
    return [f"w-{rng.getrandbits(48):012x}" for _ in range(n)]


@pytest.mark.parametrize("shards", [1, 2, 7, 16, 64, 100, 256])
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13, 40])
def test_every_shard_gets_one_owner_and_loads_differ_by_at_most_one(shards: int, n: int) -> None:
    workers = random_members(random.Random(shards * 1000 + n), n)
    owners = assign(shards, workers)
    assert sorted(owners) == list(range(shards))
    counts = [loads(owners)[w] for w in workers]
    assert max(counts) - min(counts) <= 1
    assert sum(counts) == shards
    # the ⌈S/n⌉ quotas go to the first S mod n workers by sorted id
    assert [loads(owners)[w] for w in sorted(workers)] == sorted(counts, reverse=True)


def test_no_workers_and_no_shards() -> None:
    assert assign(16, []) == {}
    assert assign(0, FOUR) == {}
    with pytest.raises(ValueError):
        assign(-1, FOUR)


def test_deterministic_and_independent_of_member_order_and_duplicates() -> None:
    workers = list(FOUR)
    expected = assign(64, workers)
    for seed in range(5):
        shuffled = workers[:]
        random.Random(seed).shuffle(shuffled)
        assert assign(64, shuffled) == expected
        assert assign(64, (*shuffled, *shuffled)) == expected


def test_score_is_stable_across_processes() -> None:
    # Pinned values: Python's hash() is salted per process, blake2b over "shard:worker" is not.
    assert score(3, "worker-b") == 4332915912546167666
    assert score(0, "worker-a") == 2759269561353316125
    assert score(0, "worker-a") != score(1, "worker-a")


def test_sixteen_shards_three_workers_then_a_fourth_joins() -> None:
    three = assign(16, FOUR[:3])
    assert sorted(loads(three).values()) == [5, 5, 6]
    assert loads(three)["worker-a"] == 6  # first by sorted id takes the ⌈⌉ quota

    four = assign(16, FOUR)
    assert set(loads(four).values()) == {4}
    assert moved(three, four) <= 8
    assert moved(three, four) >= minimum_moves(16, three, FOUR) == 4


def test_a_leave_moves_close_to_the_minimum() -> None:
    four = assign(16, FOUR)
    three = assign(16, FOUR[:3])
    leaver = {s for s, w in four.items() if w == "worker-d"}
    assert leaver <= {s for s in range(16) if three[s] != four[s]}  # the leaver's shards all move
    assert moved(four, three) <= minimum_moves(16, four, FOUR[:3]) + 2


def movement_ratio(shards: int, trials: int, seed: int) -> tuple[float, float]:
    """Mean of moves/minimum over joins and leaves of random member sets of 2..8 workers."""
    rng = random.Random(seed)
    ratios: list[float] = []
    total_moves = total_minimum = 0
    for _ in range(trials):
        members = random_members(rng, rng.randint(2, 8))
        before = assign(shards, members)
        joined = [*members, *random_members(rng, 1)]
        leaver = rng.choice(members)
        left = [w for w in members if w != leaver]
        for after_members in (joined, left):
            after = assign(shards, after_members)
            moves = moved(before, after)
            minimum = minimum_moves(shards, before, after_members)
            assert moves >= minimum > 0
            ratios.append(moves / minimum)
            total_moves += moves
            total_minimum += minimum
    return statistics.mean(ratios), total_moves / total_minimum


def test_movement_matches_the_design_figures() -> None:
    # DESIGN.md: at most 1.75x the minimum with 16 shards, 1.17x with 256. Measured with these
    # seeds: 16 shards 1.52 (mean of ratios) / 1.37 (ratio of sums); 256 shards 1.15 / 1.11. The
    # ratio grows with n/S: at 16 shards it passes 2x from about 8 workers on (shards >> workers).
    mean16, pooled16 = movement_ratio(16, trials=300, seed=16)
    mean256, pooled256 = movement_ratio(256, trials=60, seed=256)
    assert pooled16 <= mean16 <= 1.75
    assert pooled256 <= mean256 <= 1.17


def test_plain_rendezvous_is_unbalanced_so_the_balance_test_can_fail() -> None:
    # The negative case: without quotas the same member sets overload a worker far past one shard of
    # slack, which is what the balance test above would catch.
    rng = random.Random(4)
    worst_plain = worst_bounded = 0.0
    for _ in range(50):
        members = random_members(rng, 4)
        plain, bounded = plain_rendezvous(16, members), assign(16, members)
        worst_plain = max(worst_plain, max(loads(plain).values()) / 4)
        worst_bounded = max(worst_bounded, max(loads(bounded).values()) / 4)
    assert worst_bounded == 1.0
    assert worst_plain >= 2.0
