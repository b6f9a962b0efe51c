"""The registry: this worker's membership, the shards it owns, and the rebalancing between workers.

A ``Registry`` registers its worker under an etcd lease (``keys.py`` has the layout) and keeps the
lease alive with its own loop, every ``keepalive_interval_s`` (aetcd has none). It watches the
cluster's keys, restarting the watch from a fresh listing after any error (aetcd does not), and
re-lists every ``keepalive_interval_s`` as a safety net for anything the watch missed. Whenever the
picture changes it computes the desired owners with ``assign`` and moves towards them:

- desired here and free: the owner key is created in a transaction only if absent, bound to our
  lease; its revision is the shard's fence, handed to ``owner.on_acquired``;
- desired here but still held by the previous owner: wait until the watch shows the key gone
  (released, or deleted with its owner's lease), then create it;
- owned here but desired elsewhere: ``owner.on_revoke`` (stop and drain), then delete the key
  only if its revision is still our fence.

Failure policy, the choice this module makes:

- **Lease lost** (a keepalive answers TTL <= 0; a vanished worker key triggers that keepalive at
  once): the rebalancer is cancelled, ``owner.on_lease_lost()`` is called straight away (the worker
  stops pulling every shard: others may own them already), owned shards are forgotten, and the
  worker registers again with a new lease and rejoins; its shards come back the normal way. After
  SIGSTOP/SIGCONT the overdue keepalive runs as soon as the loop runs, so this takes well under 1 s.
- **etcd unreachable** (refused, reset, no answer within ``etcd_timeout_s``) is not yet a lost
  lease, but the worker cannot tell "etcd is down for everyone" (nobody can take our shards, and
  etcd renews every lease when it regains a leader) from "we alone are cut off" (the lease expires
  and another worker takes our shards at once). So the registry **fences on a local lease
  deadline**: the send time of the last keepalive that etcd answered, plus the TTL it granted,
  minus ``FENCE_MARGIN`` of it. etcd renewed the lease after that send, so the deadline passes
  before etcd can expire the lease. When it passes without a renewal, the rebalancer stops and
  ``owner.on_lease_lost()`` stops every pull and fetch (the shard keys stay ours in ``owned``).
  The first keepalive that gets through decides: a live lease resumes every owned shard
  (``on_acquired`` again, same fences) and rebalancing; an expired one runs the lease-lost path.
  The price: while etcd is down for everyone, crawling pauses a TTL after the outage began.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from types import TracebackType

from jetcrawl.contract.settings import Settings
from jetcrawl.plumbing.backoff import backoff_s, wait_set
from jetcrawl.registry.errors import RegistryError
from jetcrawl.registry.etcd import Change, Etcd, Listing
from jetcrawl.registry.keys import Keys
from jetcrawl.registry.ownership import ShardOwner
from jetcrawl.registry.plan import desired_shards, plan
from jetcrawl.registry.records import Claim, WorkerInfo
from jetcrawl.registry.view import ClusterView

__all__ = ["Registry"]

log = logging.getLogger(__name__)

RETRY_FIRST_S = 0.1  # first delay before retrying etcd after a failure; it doubles up to:
RETRY_MAX_S = 2.0  # (or the keepalive interval, if shorter)
# The share of the lease TTL by which the local deadline comes before etcd's expiry: it covers the
# time the worker takes to stop fetching once the deadline passes, and clock rate differences.
FENCE_MARGIN = 0.1


class Registry:
    """This worker in the cluster; an async context manager. See the module docstring."""

    def __init__(self, settings: Settings, info: WorkerInfo, owner: ShardOwner) -> None:
        # --- who we are and whom we drive
        self._settings = settings
        self._info = info
        self._owner = owner
        self._keys = Keys(settings.cluster)
        self._etcd = Etcd.from_settings(settings)

        # --- lease and registration
        self._lease: int | None = None  # None until registered, and while registering again
        self._worker_fence = 0  # revision of our worker key: we delete only our own
        self._check_lease = asyncio.Event()  # keep alive now: our worker key vanished from view
        self._outage_since: float | None = None  # monotonic time etcd stopped answering
        self._deadline = 0.0  # monotonic time after which the lease may have expired in etcd
        self._renewed = asyncio.Event()  # the deadline moved: the fence loop looks again
        self._fenced = False  # the deadline passed: the owner was stopped, owned shards kept
        self._fencing = asyncio.Lock()  # fencing and resuming, one at a time

        # --- the cluster as etcd last showed it
        self._view = ClusterView(self._keys, settings.shards)
        self._view_changed = asyncio.Event()  # wakes the rebalancer

        # --- shards owned here, and whoever waits for a state
        self._owned: dict[int, int] = {}  # shard -> fence
        self._state_changed = asyncio.Event()  # set and replaced when owned/members/outage change

        # --- tasks and lifecycle
        self._tasks = asyncio.TaskGroup()
        self._loops: list[asyncio.Task[None]] = []  # keepalive and watch, for the registry's life
        self._rebalancer: asyncio.Task[None] | None = None  # replaced when the lease is lost
        self._entered = False
        self._closing = False
        self._closed = asyncio.Event()

    # --- public surface

    @property
    def worker_id(self) -> str:
        return self._info.id

    @property
    def owned(self) -> Mapping[int, int]:
        """Shard -> fence for every shard the worker has been told to pull, now."""
        return dict(self._owned)

    @property
    def members(self) -> tuple[str, ...]:
        """Ids of the live workers as last seen, sorted."""
        return self._view.members

    @property
    def lease_id(self) -> int | None:
        return self._lease

    def holds_lease(self) -> bool:
        """Whether the local lease deadline is still ahead: the worker asks before each fetch, so
        a process that was paused past it (SIGSTOP, a long GC) starts no fetch before the fence
        loop has even run."""
        return not self._fenced and time.monotonic() < self._deadline

    @property
    def fenced(self) -> bool:
        """Whether the local lease deadline passed without a renewal (the owner is stopped)."""
        return self._fenced

    @property
    def outage_s(self) -> float:
        """For how long etcd has been failing our calls; 0.0 while it answers."""
        since = self._outage_since
        return 0.0 if since is None else time.monotonic() - since

    async def wait_for(self, predicate: Callable[[], bool], *, timeout_s: float) -> None:
        """Return once ``predicate()`` holds, re-checked whenever the registry's state (owned
        shards, members, etcd outage) changes. Raises ``TimeoutError`` after ``timeout_s``."""
        try:
            async with asyncio.timeout(timeout_s):
                while not predicate():
                    await self._state_changed.wait()
        except TimeoutError:
            raise TimeoutError(
                f"{self.worker_id}: state not reached in {timeout_s:g} s: owned="
                f"{sorted(self._owned)} members={self.members} outage_s={self.outage_s:.1f}"
            ) from None

    async def wait_owned(
        self, expected: int | Callable[[Mapping[int, int]], bool], *, timeout_s: float
    ) -> Mapping[int, int]:
        """Wait until ``expected`` shards are owned (or ``expected(owned)`` holds); return owned."""

        def reached() -> bool:
            if callable(expected):
                return expected(self._owned)
            return len(self._owned) == expected

        await self.wait_for(reached, timeout_s=timeout_s)
        return self.owned

    async def __aenter__(self) -> Registry:
        """Register (raises ``RegistryError`` if etcd cannot be reached) and start the loops."""
        if self._entered:
            raise RuntimeError("a Registry can be entered only once")
        self._entered = True
        try:
            await self._register()
            listing = await self._etcd.get_prefix(self._keys.root)
        except BaseException:
            await self._etcd.close()
            self._closing = True
            self._closed.set()
            raise
        self._merge_listing(listing)
        await self._tasks.__aenter__()
        self._loops = [
            self._tasks.create_task(self._keep_lease(), name=f"{self.worker_id}: keepalive"),
            self._tasks.create_task(self._watch(listing), name=f"{self.worker_id}: watch"),
            self._tasks.create_task(self._fence(), name=f"{self.worker_id}: fence"),
        ]
        self._start_rebalancer()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Leave the cluster in order; idempotent. Stop rebalancing, revoke (drain) and release
        every owned shard, delete the worker key, revoke the lease, close the connection."""
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        try:
            if not self._entered:
                return
            if self._rebalancer is not None:  # its last pass revokes and releases every shard
                self._view_changed.set()
                await asyncio.wait([self._rebalancer])
            for task in self._loops:
                task.cancel()
            await self._tasks.__aexit__(None, None, None)
            if self._lease is not None:
                await self._unregister(self._lease)
        finally:
            await self._etcd.close()
            self._closed.set()

    # --- registration and the lease

    async def _register(self) -> None:
        sent = time.monotonic()
        lease = await self._etcd.grant_lease(self._settings.lease_ttl_s)
        self._renew_deadline(sent, self._settings.lease_ttl_s)
        await self._put_worker_key(lease)
        self._lease = lease
        log.info("%s registered with lease %x", self.worker_id, lease)

    async def _put_worker_key(self, lease: int) -> None:
        entry = await self._etcd.put(self._keys.worker(self.worker_id), self._info.to_wire(), lease)
        self._worker_fence = entry.mod_revision
        self._merge(Change.put(entry))

    async def _unregister(self, lease: int) -> None:
        try:
            await self._etcd.delete_if(self._keys.worker(self.worker_id), self._worker_fence)
            await self._etcd.revoke_lease(lease)
        except RegistryError as exc:
            log.warning(
                "%s: leaving without cleanup, lease %x will expire: %s", self.worker_id, lease, exc
            )
        self._lease = None

    async def _keep_lease(self) -> None:
        interval = self._settings.keepalive_interval_s
        while True:
            asked = await wait_set(self._check_lease, interval)
            self._check_lease.clear()
            lease = self._lease
            assert lease is not None  # only this loop clears it, and returns if it stays None
            try:
                sent = time.monotonic()
                ttl = await self._etcd.keep_alive(lease)
                if ttl > 0 and asked and self.worker_id not in self._view.members:
                    log.warning(
                        "%s: worker key deleted under a live lease; putting it back", self.worker_id
                    )
                    await self._put_worker_key(lease)
            except RegistryError as exc:
                self._etcd_failed(exc)
                continue
            self._etcd_answered()
            if ttl <= 0:
                await self._recover_lost_lease(lease)
                if self._lease is None:
                    return  # closing: no new lease
            else:
                self._renew_deadline(sent, ttl)
                await self._resume()

    def _renew_deadline(self, sent: float, ttl_s: float) -> None:
        ttl_s = min(ttl_s, self._settings.lease_ttl_s)
        self._deadline = sent + ttl_s * (1 - FENCE_MARGIN)
        self._renewed.set()

    async def _fence(self) -> None:
        """Stop the owner when the local lease deadline passes without a renewal."""
        while True:
            self._renewed.clear()
            if await wait_set(self._renewed, self._deadline - time.monotonic()):
                continue
            async with self._fencing:
                if not (self._fenced or self._lease is None or self._closing):
                    self._fenced = True
                    log.warning(
                        "%s: no lease renewal from etcd by the deadline: fenced, every shard "
                        "stopped until etcd renews the lease",
                        self.worker_id,
                    )
                    await self._stop_rebalancer()
                    await self._owner.on_lease_lost()
                    self._notify()
            await self._renewed.wait()

    async def _resume(self) -> None:
        """After a fence, a renewed lease: the owned shards are still ours, pull them again."""
        async with self._fencing:
            if not self._fenced:
                return
            self._fenced = False
            log.info("%s: lease renewed: resuming %d shards", self.worker_id, len(self._owned))
            for shard, fence in sorted(self._owned.items()):
                await self._owner.on_acquired(shard, fence)
            self._start_rebalancer()
            self._notify()

    async def _recover_lost_lease(self, lease: int) -> None:
        log.warning(
            "%s: lease %x is gone; stopping every shard and registering again",
            self.worker_id,
            lease,
        )
        self._lease = None
        async with self._fencing:
            await self._stop_rebalancer()
            if not self._fenced:  # a fence stopped the owner already
                await self._owner.on_lease_lost()
            self._fenced = False
            self._owned.clear()
        self._notify()
        if self._closing:
            return
        failed = 0
        while True:
            try:
                await self._register()
                break
            except RegistryError as exc:
                self._etcd_failed(exc)
            failed += 1
            await asyncio.sleep(self._retry_delay_s(failed))
        self._etcd_answered()
        self._start_rebalancer()

    def _etcd_failed(self, exc: RegistryError) -> None:
        if self._outage_since is None:
            log.warning(
                "%s: etcd fails, keeping our shards until the lease deadline: %s",
                self.worker_id,
                exc,
            )
            self._outage_since = time.monotonic()
        else:
            log.debug("%s: etcd still fails: %s", self.worker_id, exc)
        self._notify()

    def _etcd_answered(self) -> None:
        if self._outage_since is not None:
            log.info("%s: etcd answers again after %.1f s", self.worker_id, self.outage_s)
            self._outage_since = None
            self._notify()

    # --- watching the cluster

    async def _watch(self, listing: Listing | None) -> None:
        """Follow every change under the cluster's prefix; after an error, list again and resume."""
        failed = 0
        while True:
            try:
                if listing is None:
                    listing = await self._etcd.get_prefix(self._keys.root)
                    self._merge_listing(listing)
                async with self._etcd.watch_prefix(
                    self._keys.root, listing.revision + 1
                ) as changes:
                    self._view.watched_up_to(listing.revision)
                    failed = 0
                    async for change in changes:
                        self._merge(change)
                        self._view.watched_up_to(change.revision)
                log.warning("%s: the watch ended; watching again", self.worker_id)
            except RegistryError as exc:
                level = logging.WARNING if failed == 0 else logging.DEBUG
                log.log(level, "%s: the watch broke, will list again: %s", self.worker_id, exc)
            listing = None
            failed += 1
            await asyncio.sleep(self._retry_delay_s(failed))

    def _retry_delay_s(self, failed: int) -> float:
        """How long to wait after the ``failed``-th failure in a row before trying etcd again."""
        cap_s = min(RETRY_MAX_S, self._settings.keepalive_interval_s)
        return backoff_s(failed, min(RETRY_FIRST_S, cap_s), cap_s)

    async def _reconcile(self) -> None:
        """The safety net: a full listing merged into the view (older than the view: no effect)."""
        try:
            self._merge_listing(await self._etcd.get_prefix(self._keys.root))
        except RegistryError as exc:
            log.debug("%s: reconcile listing failed: %s", self.worker_id, exc)

    def _merge(self, change: Change) -> None:
        if self._view.apply(change):
            self._view_changed.set()
            self._notify()

    def _merge_listing(self, listing: Listing) -> None:
        if self._view.apply_listing(listing):
            self._view_changed.set()
            self._notify()

    # --- rebalancing

    def _start_rebalancer(self) -> None:
        if not self._closing:
            self._rebalancer = self._tasks.create_task(
                self._rebalance(), name=f"{self.worker_id}: rebalance"
            )

    async def _stop_rebalancer(self) -> None:
        if self._rebalancer is not None:
            self._rebalancer.cancel()
            await asyncio.wait([self._rebalancer])
            self._rebalancer = None

    async def _rebalance(self) -> None:
        """A pass whenever the view changes, and a reconcile every interval even if it does."""
        interval = self._settings.keepalive_interval_s
        reconcile_at = time.monotonic() + interval
        while True:
            self._view_changed.clear()
            closing = self._closing
            before = dict(self._owned)
            await self._rebalance_once(closing)
            if closing:
                return
            if self._owned != before:
                continue  # a shard lost or released may be one to take (again) right away
            await wait_set(self._view_changed, reconcile_at - time.monotonic())
            if time.monotonic() >= reconcile_at:
                await self._reconcile()
                reconcile_at = time.monotonic() + interval

    async def _rebalance_once(self, closing: bool) -> None:
        """One step towards the desired owners; on closing, towards owning nothing."""
        lease = self._lease
        assert lease is not None  # the rebalancer runs only while registered
        members = self._view.members
        if closing:
            desired: set[int] = set()
        elif self.worker_id not in members:
            self._check_lease.set()  # our worker key is gone: is the lease?
            return
        else:
            desired = desired_shards(self.worker_id, self._settings.shards, members)
        step = plan(
            me=self.worker_id,
            lease=lease,
            desired=desired,
            owned=self._owned,
            claims=self._view.claims,
        )
        async with asyncio.TaskGroup() as actions:
            for shard in step.lose:
                actions.create_task(self._lose(shard))
            for shard, fence in step.release:
                actions.create_task(self._release(shard, fence))
            for shard, fence in step.take:
                actions.create_task(self._take(shard, fence))
            for shard, fence in step.delete:
                actions.create_task(self._delete_claim(shard, fence))
            for shard in step.acquire:
                actions.create_task(self._acquire(shard, lease))

    async def _acquire(self, shard: int, lease: int) -> None:
        key = self._keys.shard(shard)
        try:
            created, entry = await self._etcd.create(
                key, Claim.to_wire(self.worker_id, lease), lease
            )
        except RegistryError as exc:
            log.warning("%s: claiming shard %d failed, will retry: %s", self.worker_id, shard, exc)
            return
        self._merge(Change.put(entry))  # ours, or the holder we raced with
        if created:
            await self._take(shard, entry.mod_revision)

    async def _take(self, shard: int, fence: int) -> None:
        await self._owner.on_acquired(shard, fence)
        self._owned[shard] = fence
        self._notify()
        log.info("%s: acquired shard %d (fence %d)", self.worker_id, shard, fence)

    async def _release(self, shard: int, fence: int) -> None:
        await self._owner.on_revoke(shard)
        del self._owned[shard]
        self._notify()
        await self._delete_claim(shard, fence)
        log.info("%s: released shard %d", self.worker_id, shard)

    async def _lose(self, shard: int) -> None:
        log.warning("%s: shard %d was taken from us (its key changed)", self.worker_id, shard)
        await self._owner.on_revoke(shard)
        del self._owned[shard]
        self._notify()

    async def _delete_claim(self, shard: int, fence: int) -> None:
        key = self._keys.shard(shard)
        try:
            revision = await self._etcd.delete_if(key, fence)
        except RegistryError as exc:  # the view still shows it ours: a later pass deletes it
            log.warning("%s: releasing shard %d failed, will retry: %s", self.worker_id, shard, exc)
            return
        if revision is not None:
            self._merge(Change.delete(key, revision))

    def _notify(self) -> None:
        self._state_changed.set()
        self._state_changed = asyncio.Event()
