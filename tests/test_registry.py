"""The registry against a real etcd: membership, shard ownership, rebalancing, and etcd failures.

Timings are shrunk through settings (2 s lease, 2 s call deadline) and every test waits on a state
of the registries (``Registry.wait_for``), never on a bare sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path

import aetcd
import orjson
import pytest

from jetcrawl import registry
from jetcrawl.contract.errors import JetcrawlError
from jetcrawl.contract.settings import Settings
from jetcrawl.local.embedded import EtcdServer, parent_death_hook
from jetcrawl.registry import (
    EtcdTimeout,
    EtcdUnavailable,
    RecordError,
    Registry,
    WorkerInfo,
    assign,
    read_members,
    read_ownership,
)
from jetcrawl.registry.etcd import Change, Entry, Etcd, Listing
from jetcrawl.registry.keys import Keys
from jetcrawl.registry.plan import Plan, desired_shards, plan
from jetcrawl.registry.records import Claim
from jetcrawl.registry.view import ClusterView

SHARDS = 16
CONVERGE_S = 5.0
# With gRPC's fork handlers on, 2% to 4% of these children died (grpcio 1.85, four runs): all 300
# passing would be a 1-in-1,000 chance at most.
FORKS_WHILE_BUSY = 300
REPO = Path(__file__).resolve().parents[1]


# --- the worker side, recorded


class RecordingOwner:
    """A ShardOwner test double that records calls and checks they make sense."""

    def __init__(self, probe: Callable[[int], Awaitable[bool]] | None = None) -> None:
        self.pulling: dict[int, int] = {}
        self.events: list[tuple[str, int]] = []
        self.lease_lost_at: list[float] = []
        self.key_present_at_revoke: dict[int, bool] = {}
        self._probe = probe

    async def on_acquired(self, shard: int, fence: int) -> None:
        assert shard not in self.pulling, f"shard {shard} acquired twice"
        assert fence > 0
        self.pulling[shard] = fence
        self.events.append(("acquired", shard))

    async def on_revoke(self, shard: int) -> None:
        assert shard in self.pulling, f"shard {shard} revoked but not pulled"
        if self._probe is not None:
            self.key_present_at_revoke[shard] = await self._probe(shard)
        del self.pulling[shard]
        self.events.append(("revoke", shard))

    async def on_lease_lost(self) -> None:
        self.pulling.clear()
        self.lease_lost_at.append(time.monotonic())
        self.events.append(("lease_lost", -1))


# --- helpers


@pytest.fixture
def settings(etcd_server: EtcdServer) -> Settings:
    return Settings(
        etcd_url=etcd_server.url,
        cluster=f"test-{uuid.uuid4().hex[:8]}",
        lease_ttl_s=2,
        etcd_timeout_s=2,
        shards=SHARDS,
    )


@pytest.fixture
async def etcd(settings: Settings) -> AsyncIterator[Etcd]:
    """A second client, the test's own view of etcd."""
    async with Etcd.from_settings(settings) as client:
        yield client


async def join(
    stack: contextlib.AsyncExitStack,
    settings: Settings,
    worker_id: str,
    owner: RecordingOwner | None = None,
) -> tuple[Registry, RecordingOwner]:
    owner = owner or RecordingOwner()
    info = WorkerInfo.local(worker_id, capacity=settings.concurrency)
    reg = await stack.enter_async_context(Registry(settings, info, owner))
    return reg, owner


def share(owners: dict[int, str], worker_id: str) -> set[int]:
    return {shard for shard, worker in owners.items() if worker == worker_id}


async def converged(
    registries: Sequence[Registry], members: Sequence[str], timeout_s: float = CONVERGE_S
) -> dict[int, str]:
    """Wait until every registry sees ``members`` and owns exactly its assigned shards."""
    expected = assign(SHARDS, members)
    for reg in registries:
        await reg.wait_for(owns_exactly(reg, members, expected), timeout_s=timeout_s)
    return expected


def owns_exactly(
    reg: Registry, members: Sequence[str], owners: dict[int, str]
) -> Callable[[], bool]:
    mine = share(owners, reg.worker_id)
    return lambda: reg.members == tuple(sorted(members)) and set(reg.owned) == mine


def outage_over(reg: Registry, seconds: float) -> Callable[[], bool]:
    return lambda: reg.outage_s > seconds


def answering(reg: Registry) -> Callable[[], bool]:
    return lambda: reg.outage_s == 0.0


def moved(before: dict[int, str], after: dict[int, str]) -> int:
    return sum(1 for shard in after if before.get(shard) != after[shard])


# --- ownership across workers


async def test_three_workers_split_sixteen_shards(settings: Settings) -> None:
    ids = ["w1", "w2", "w3"]
    async with contextlib.AsyncExitStack() as stack:
        regs = [(await join(stack, settings, i))[0] for i in ids]
        expected = await converged(regs, ids)

        counts = sorted(len(reg.owned) for reg in regs)
        assert counts == [5, 5, 6]
        owned = [shard for reg in regs for shard in reg.owned]
        assert sorted(owned) == list(range(SHARDS))  # all 16, none twice
        assert await read_ownership(settings) == expected

        members = await read_members(settings)
        assert list(members) == ids
        assert members["w1"].pid == os.getpid()
        assert members["w1"].capacity == settings.concurrency

    assert await read_ownership(settings) == {}
    assert await read_members(settings) == {}


async def test_a_fourth_worker_takes_four_shards_moving_at_most_eight(settings: Settings) -> None:
    async with contextlib.AsyncExitStack() as stack:
        regs = [(await join(stack, settings, i))[0] for i in ("w1", "w2", "w3")]
        await converged(regs, ["w1", "w2", "w3"])
        before = await read_ownership(settings)

        fourth, _ = await join(stack, settings, "w4")
        after = await converged([*regs, fourth], ["w1", "w2", "w3", "w4"])

        assert [len(reg.owned) for reg in (*regs, fourth)] == [4, 4, 4, 4]
        assert await read_ownership(settings) == after
        assert 4 <= moved(before, after) <= 8


async def test_graceful_close_revokes_before_deleting_and_hands_shards_over(
    settings: Settings, etcd: Etcd
) -> None:
    keys = Keys(settings.cluster)

    async def key_present(shard: int) -> bool:
        listing = await etcd.get_prefix(keys.shard(shard))
        return any(entry.key == keys.shard(shard) for entry in listing.entries)

    async with contextlib.AsyncExitStack() as stack:
        leaver, leaver_owner = await join(stack, settings, "w1", RecordingOwner(key_present))
        stayers = [(await join(stack, settings, i))[0] for i in ("w2", "w3")]
        await converged([leaver, *stayers], ["w1", "w2", "w3"])
        had = set(leaver.owned)
        seen = len(leaver_owner.events)

        await leaver.close()
        await leaver.close()  # idempotent

        assert sorted(leaver_owner.events[seen:]) == [("revoke", shard) for shard in sorted(had)]
        assert all(leaver_owner.key_present_at_revoke[shard] for shard in had)
        assert leaver_owner.pulling == {}
        assert leaver.owned == {}
        after = await converged(stayers, ["w2", "w3"])
        assert await read_ownership(settings) == after
        assert "w1" not in await read_members(settings)


async def test_lost_lease_stops_everything_then_rejoins(settings: Settings, etcd: Etcd) -> None:
    async with contextlib.AsyncExitStack() as stack:
        victim, victim_owner = await join(stack, settings, "w1")
        other, _ = await join(stack, settings, "w2")
        await converged([victim, other], ["w1", "w2"])
        old_lease = victim.lease_id
        assert old_lease is not None
        seen = len(victim_owner.events)

        revoked_at = time.monotonic()
        assert await etcd.revoke_lease(old_lease)
        assert not await etcd.revoke_lease(old_lease)  # etcd no longer knows it

        await victim.wait_for(lambda: bool(victim_owner.lease_lost_at), timeout_s=CONVERGE_S)
        assert victim_owner.lease_lost_at[0] - revoked_at < 1.0
        await converged([victim, other], ["w1", "w2"])
        assert victim.lease_id not in (None, old_lease)
        assert victim_owner.pulling == victim.owned
        # nothing was revoked one by one: the lease loss stopped all at once
        assert victim_owner.events[seen] == ("lease_lost", -1)
        assert {kind for kind, _ in victim_owner.events[seen:]} == {"lease_lost", "acquired"}


async def test_a_shard_key_deleted_by_hand_is_revoked_and_taken_again_with_a_newer_fence(
    settings: Settings, etcd: Etcd
) -> None:
    keys = Keys(settings.cluster)
    async with contextlib.AsyncExitStack() as stack:
        reg, owner = await join(stack, settings, "w1")
        await converged([reg], ["w1"])
        old_fence = reg.owned[5]
        seen = len(owner.events)

        assert await etcd.delete_if(keys.shard(5), old_fence) is not None

        await reg.wait_owned(
            lambda owned: owned.get(5, old_fence) > old_fence, timeout_s=CONVERGE_S
        )
        assert owner.events[seen:] == [("revoke", 5), ("acquired", 5)]
        assert owner.pulling == reg.owned


async def test_a_worker_key_deleted_under_a_live_lease_is_put_back(
    settings: Settings, etcd: Etcd
) -> None:
    keys = Keys(settings.cluster)
    async with contextlib.AsyncExitStack() as stack:
        (first, first_owner), (second, _) = [await join(stack, settings, i) for i in ("w1", "w2")]
        await converged([first, second], ["w1", "w2"])
        listing = await etcd.get_prefix(keys.worker("w1"))
        (entry,) = listing.entries

        assert await etcd.delete_if(entry.key, entry.mod_revision) is not None

        await first.wait_for(lambda: "w1" not in first.members, timeout_s=CONVERGE_S)
        await converged([first, second], ["w1", "w2"])
        assert "w1" in await read_members(settings)
        assert first_owner.lease_lost_at == []


CHILD_WORKER = """
import asyncio, sys
from jetcrawl.contract.settings import Settings
from jetcrawl.registry import Registry, WorkerInfo

class Owner:
    async def on_acquired(self, shard, fence): pass
    async def on_revoke(self, shard): pass
    async def on_lease_lost(self):
        print("lease lost", flush=True)

async def main():
    url, cluster, worker_id, count = sys.argv[1:]
    settings = Settings(etcd_url=url, cluster=cluster, lease_ttl_s=2, etcd_timeout_s=2, shards=16)
    async with Registry(settings, WorkerInfo.local(worker_id, capacity=1), Owner()) as reg:
        while True:  # says "owned" whenever it comes to own its share
            await reg.wait_owned(int(count), timeout_s=3600)
            print("owned", flush=True)
            await reg.wait_owned(lambda owned: len(owned) != int(count), timeout_s=3600)

asyncio.run(main())
"""


@contextlib.asynccontextmanager
async def child_worker(
    settings: Settings, worker_id: str, count: int
) -> AsyncIterator[asyncio.subprocess.Process]:
    """A registry in another process; yields once it owns ``count`` shards, SIGKILLs it at exit."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHILD_WORKER,
        settings.etcd_url,
        settings.cluster,
        worker_id,
        str(count),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert await read_line(proc, timeout_s=15) == "owned"
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        await proc.wait()


async def read_line(proc: asyncio.subprocess.Process, timeout_s: float) -> str:
    assert proc.stdout is not None
    async with asyncio.timeout(timeout_s):
        return (await proc.stdout.readline()).decode().strip()


async def test_a_killed_member_s_shards_are_taken_over_within_the_lease_ttl(
    settings: Settings,
) -> None:
    ids = ["w1", "w2", "w3"]
    async with contextlib.AsyncExitStack() as stack:
        regs = [(await join(stack, settings, i))[0] for i in ids[:2]]
        count = len(share(assign(SHARDS, ids), "w3"))
        proc = await stack.enter_async_context(child_worker(settings, "w3", count))
        await converged(regs, ids)
        assert await read_ownership(settings) == assign(SHARDS, ids)

        proc.kill()  # SIGKILL: no goodbye, the lease has to expire
        await converged(regs, ids[:2], timeout_s=settings.lease_ttl_s + 2)
        assert await read_ownership(settings) == assign(SHARDS, ids[:2])


async def test_a_paused_member_stops_at_once_when_it_wakes_and_rejoins(
    settings: Settings,
) -> None:
    ids = ["w1", "w2", "w3"]
    async with contextlib.AsyncExitStack() as stack:
        regs = [(await join(stack, settings, i))[0] for i in ids[:2]]
        count = len(share(assign(SHARDS, ids), "w3"))
        proc = await stack.enter_async_context(child_worker(settings, "w3", count))
        await converged(regs, ids)

        os.kill(proc.pid, signal.SIGSTOP)  # a long GC pause, a frozen VM: its lease expires
        await converged(regs, ids[:2], timeout_s=settings.lease_ttl_s + 2)

        os.kill(proc.pid, signal.SIGCONT)
        assert await read_line(proc, timeout_s=1.0) == "lease lost"
        assert await read_line(proc, timeout_s=CONVERGE_S) == "owned"  # it registered again
        await converged(regs, ids)
        assert await read_ownership(settings) == assign(SHARDS, ids)


# --- etcd failures


async def test_calls_fail_fast_when_etcd_is_down(
    settings: Settings, etcd_server: EtcdServer
) -> None:
    await etcd_server.stop()
    started = time.monotonic()
    with pytest.raises(EtcdUnavailable):
        await read_members(settings)
    with pytest.raises(EtcdUnavailable):
        async with Registry(settings, WorkerInfo.local("w1", capacity=1), RecordingOwner()):
            pass
    assert time.monotonic() - started < 2 * settings.etcd_timeout_s + 1


async def test_close_while_etcd_is_down_still_revokes_every_shard(
    settings: Settings, etcd_server: EtcdServer
) -> None:
    owner = RecordingOwner()
    reg = Registry(settings, WorkerInfo.local("w1", capacity=1), owner)
    async with reg:
        await converged([reg], ["w1"])
        await etcd_server.stop()
        started = time.monotonic()
    assert time.monotonic() - started < 2 * settings.etcd_timeout_s + 1
    assert owner.pulling == {}
    assert reg.owned == {}


async def test_every_call_has_a_deadline_even_when_etcd_hangs(
    settings: Settings, etcd_server: EtcdServer
) -> None:
    pid = etcd_server.pid
    assert pid is not None
    raw = aetcd.Client(host="127.0.0.1", port=etcd_server.port)
    os.kill(pid, signal.SIGSTOP)  # etcd accepts connections (the kernel does) but never answers
    try:
        started = time.monotonic()
        with pytest.raises(EtcdTimeout) as caught:
            await read_ownership(settings)
        assert caught.value.timeout_s == settings.etcd_timeout_s
        assert time.monotonic() - started < settings.etcd_timeout_s + 1

        # The negative case: aetcd on its own has no deadline and is still waiting.
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(settings.etcd_timeout_s + 1):
                await raw.get(b"/jetcrawl/")
    finally:
        os.kill(pid, signal.SIGCONT)
        await raw.close()


async def test_etcd_down_fences_the_owners_before_the_ttl_and_a_renewal_resumes_them(
    settings: Settings, etcd_server: EtcdServer
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        (first, first_owner), (second, second_owner) = [
            await join(stack, settings, i) for i in ("w1", "w2")
        ]
        await converged([first, second], ["w1", "w2"])
        before = (first.owned, second.owned)
        assert first.holds_lease() and second.holds_lease()

        await etcd_server.stop()
        stopped_at = time.monotonic()
        for reg in (first, second):  # down for longer than a lease lives
            await reg.wait_for(
                outage_over(reg, settings.lease_ttl_s), timeout_s=settings.lease_ttl_s + 3
            )
        # Fenced: every pull stopped before etcd could have expired the lease (the last renewal
        # was sent before etcd went down), and the owned shards are kept.
        for reg, owner in ((first, first_owner), (second, second_owner)):
            assert reg.fenced and not reg.holds_lease()
            [fenced_at] = owner.lease_lost_at
            assert fenced_at - stopped_at < settings.lease_ttl_s
            assert owner.pulling == {}
        assert (first.owned, second.owned) == before

        await etcd_server.start()
        for reg in (first, second):
            await reg.wait_for(lambda r=reg: not r.fenced, timeout_s=CONVERGE_S)
        # etcd renewed the leases on its restart: the same shards resume, same fences.
        assert (first_owner.pulling, second_owner.pulling) == before
        assert first.holds_lease() and second.holds_lease()
        third, _ = await join(stack, settings, "w3")
        after = await converged([first, second, third], ["w1", "w2", "w3"])
        assert await read_ownership(settings) == after
        assert len(first_owner.lease_lost_at) == len(second_owner.lease_lost_at) == 1


async def test_the_watch_resumes_after_etcd_restarts(
    settings: Settings, etcd_server: EtcdServer
) -> None:
    # Keepalive and reconcile every 15 s: only a restarted watch can converge within 5 s.
    slow = settings.replace(lease_ttl_s=45, keepalive_s=15)
    async with contextlib.AsyncExitStack() as stack:
        first, _ = await join(stack, slow, "w1")
        await converged([first], ["w1"])
        await etcd_server.stop()
        await etcd_server.start()
        second, _ = await join(stack, slow, "w2")
        await converged([first, second], ["w1", "w2"], timeout_s=CONVERGE_S)


# --- children started while a client is busy


async def test_children_forked_while_a_client_is_busy_reach_their_exec(etcd: Etcd) -> None:
    """Services and servers are started through fork (a pre-exec hook rules out vfork), the hook,
    closing inherited descriptors, then exec. With gRPC's fork handlers on, the child restarts
    gRPC's poller thread, and with its descriptor closed under it the child dies (SIGSEGV,
    SIGABRT) or prints an epoll error (grpc/grpc#43055). ``registry.etcd`` turns them off before
    grpc is imported."""
    hook = parent_death_hook()
    if hook is None:
        pytest.skip("the pre-exec hook (and so a plain fork) is Linux-only")
    done = asyncio.Event()

    async def busy() -> None:
        while not done.is_set():
            await etcd.get_prefix("/busy/")

    outcomes: list[tuple[int | None, bytes]] = []
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(busy())
        try:
            for _ in range(FORKS_WHILE_BUSY):
                child = await asyncio.create_subprocess_exec(
                    "echo",
                    "ok",
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT,
                    preexec_fn=hook,
                )
                output, _ = await child.communicate()
                outcomes.append((child.returncode, output))
        finally:
            done.set()
    failed = [outcome for outcome in outcomes if outcome != (0, b"ok\n")]
    assert failed == [], f"{len(failed)} of {len(outcomes)} children failed"


# --- the parts without etcd


def test_public_surface() -> None:
    assert sorted(registry.__all__) == [
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
    assert issubclass(EtcdTimeout, EtcdUnavailable)
    assert issubclass(registry.RegistryError, JetcrawlError)


def test_records_round_trip_and_decode_strictly() -> None:
    info = WorkerInfo.local("w1", capacity=8)
    assert WorkerInfo.from_wire("k", info.to_wire()) == info
    newer = orjson.loads(info.to_wire()) | {"zone": "eu-1"}  # unknown fields are fine
    assert WorkerInfo.from_wire("k", orjson.dumps(newer)) == info
    for broken in (b"{", b"[]", orjson.dumps(orjson.loads(info.to_wire()) | {"pid": "1"})):
        with pytest.raises(RecordError):
            WorkerInfo.from_wire("k", broken)
    assert Claim.from_wire("k", Claim.to_wire("w1", 7), fence=3) == Claim("w1", 7, 3)
    with pytest.raises(RecordError):
        Claim.from_wire("k", orjson.dumps({"worker": "w1", "lease": True}), fence=3)
    with pytest.raises(ValueError):
        WorkerInfo.local("a/b", capacity=8)


def test_view_keeps_the_newest_state_of_each_key() -> None:
    keys = Keys("c")
    view = ClusterView(keys, SHARDS)
    claim = Entry(keys.shard(3), Claim.to_wire("w1", 9), mod_revision=10, lease=9)
    worker = Entry(keys.worker("w1"), b"{}", mod_revision=5, lease=9)

    assert view.apply_listing(Listing((worker, claim), revision=12))
    assert view.members == ("w1",)
    assert view.claims == {3: Claim("w1", 9, 10)}

    assert view.apply(Change.delete(claim.key, 14))  # released
    assert not view.apply(Change.put(claim))  # a late echo of the older put: ignored
    assert not view.apply_listing(Listing((worker, claim), revision=13))  # an older listing too
    assert view.claims == {}

    assert view.apply_listing(Listing((), revision=20))  # a newer listing: the worker is gone
    assert view.members == ()
    view.watched_up_to(20)
    assert view.apply(Change.put(Entry(keys.shard(3), b"not json", 21, 4)))
    assert view.claims == {3: Claim("", 4, 21)}  # held by someone we cannot name: not free
    view.apply(Change.put(Entry("/jetcrawl/c/other", b"", 22, 0)))  # neither worker nor shard
    view.apply(Change.put(Entry(keys.shard(99), b"{}", 23, 0)))  # beyond the shard count
    assert view.claims.keys() == {3}
    assert view.members == ()


def test_plan_takes_free_shards_waits_for_held_ones_and_releases_the_rest() -> None:
    claims = {
        1: Claim("w2", lease=20, fence=11),  # held by the previous owner: wait
        2: Claim("w1", lease=10, fence=12),  # owned here, still desired: keep
        3: Claim("w1", lease=10, fence=13),  # owned here, desired elsewhere: release
        4: Claim("w1", lease=10, fence=99),  # owned here at fence 14, rewritten since: lost
        6: Claim("w1", lease=10, fence=16),  # ours in etcd, unknown here, desired: take
        7: Claim("w1", lease=10, fence=17),  # ours in etcd, unknown here, not desired: delete
        8: Claim("w1", lease=9, fence=18),  # a claim of our previous lease: goes with it
    }
    step = plan(
        me="w1",
        lease=10,
        desired={0, 1, 2, 6, 8},
        owned={2: 12, 3: 13, 4: 14, 5: 15},  # 5: its key is gone: lost
        claims=claims,
    )
    assert step == Plan(
        lose=(4, 5), release=((3, 13),), take=((6, 16),), delete=((7, 17),), acquire=(0,)
    )
    assert plan(me="w1", lease=10, desired=set(), owned={}, claims={}) == Plan()


def test_desired_shards_follow_the_assignment() -> None:
    members = ["w1", "w2", "w3"]
    mine = [desired_shards(w, SHARDS, members) for w in members]
    assert sorted(len(m) for m in mine) == [5, 5, 6]
    assert set().union(*mine) == set(range(SHARDS))
    assert desired_shards("w4", SHARDS, members) == set()
