"""A KV bucket kept in memory by a watch: what the services follow of ``crawl_specs`` and
``crawl_control``.

:class:`KvWatch` runs nats-py's KV watch (an ordered consumer, which starts again after the last
entry it delivered when heartbeats stop: a server restart) until its stop event, makes it again
with backoff after an error, and says when the bucket's contents are loaded. A subclass applies
each entry; a change wakes whoever waits in ``wait_for``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from jetcrawl.plumbing.backoff import backoff_s, wait_set

__all__ = ["KvWatch"]

log = logging.getLogger(__name__)

REWATCH_FIRST_S = 0.5
REWATCH_MAX_S = 10.0


class KvWatch:
    """``run()`` until the stop event; ``apply`` is each entry, a subclass's."""

    def __init__(self, js: JetStreamContext, bucket: str) -> None:
        self._js = js
        self._bucket = bucket
        self._changed = asyncio.Condition()
        self._ready = asyncio.Event()  # the first watch has delivered what the bucket held

    def apply(self, entry: KeyValue.Entry) -> None:
        raise NotImplementedError

    async def wait_ready(self) -> None:
        """Until the bucket's contents are loaded, or ``run()`` has ended (stopped first)."""
        await self._ready.wait()

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        """Until ``predicate()`` holds, looked at after each entry applied."""
        async with self._changed:
            await self._changed.wait_for(predicate)

    async def run(self, stopping: asyncio.Event) -> None:
        """Watch until ``stopping`` is set; a failed watch is made again, with backoff."""
        failures = 0
        try:
            while not stopping.is_set():
                try:
                    await self._watch(stopping)
                    return
                except (NatsError, TimeoutError) as e:
                    failures += 1
                    delay_s = backoff_s(failures, REWATCH_FIRST_S, REWATCH_MAX_S)
                    log.warning("watching %s failed, again in %.1f s: %r", self._bucket, delay_s, e)
                    await wait_set(stopping, delay_s)
        finally:
            self._ready.set()  # nobody waits on a watch that has ended

    async def _watch(self, stopping: asyncio.Event) -> None:
        kv = await self._js.key_value(self._bucket)
        watcher = await kv.watchall()
        async with asyncio.TaskGroup() as tg:
            # stop() ends the iteration below: a stop is an event, not a poll
            stopper = tg.create_task(self._stop_on(stopping, watcher))
            async for entry in watcher:
                if entry is None:  # what the bucket held is delivered
                    self._ready.set()
                else:
                    self.apply(entry)
                    async with self._changed:
                        self._changed.notify_all()
            stopper.cancel()

    async def _stop_on(self, stopping: asyncio.Event, watcher: KeyValue.KeyWatcher) -> None:
        await stopping.wait()
        try:
            await watcher.stop()
        except NatsError as e:  # the connection is gone: so is the subscription
            log.debug("stopping the watch of %s: %r", self._bucket, e)
