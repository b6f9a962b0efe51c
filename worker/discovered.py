"""The links pages send to the frontier, several pages to a ``crawl.discovered`` message.

Pages whose links are ready within ``linger_s`` of the first send them in one message
(:class:`~jetcrawl.contract.messages.DiscoveredPages`) instead of one each: on a fast crawl most
such messages carried a few links, and each cost a stored message and its PubAck, a delivery to the
dispatcher, its ack and its deletion. A link that an earlier page of the same message carries
for an equal lineage at the same or a smaller depth is left out of the later page: the
dispatcher's answer for it cannot differ. Each page waits for the PubAck of the message that
carries it, so its task is still acked only once its links are stored.

A message's id names the pages it carries: ``links-<crawl id>`` for one page (as when each page
sent its own), ``links-<digest of the crawl ids>`` for several. Published again with the same
pages (a failed publish tried again), it is dropped by JetStream's duplicate window; a page
that comes again with other pages (its task redelivered) is carried again, never dropped with
a message that was not its own.

With ``linger_s`` 0 each page's links go alone and at once, in the caller's context: with
tracing on, a page's message carries that page's trace context to the dispatcher, so the worker
service gathers pages only with tracing off. A gathered message is published from a context of
its own, so it never carries one page's trace context for all.
"""

from __future__ import annotations

import asyncio
import contextvars
from dataclasses import dataclass, replace
from typing import Protocol

from nats.js.api import PubAck

from jetcrawl.contract.messages import Discovered, DiscoveredPages, Lineage
from jetcrawl.contract.topology import DISCOVERED
from jetcrawl.contract.urls import fingerprint
from jetcrawl.plumbing.bus import MSG_ID, Outbox, Outgoing, PublishFailed

__all__ = ["MAX_MESSAGE_BYTES", "DiscoveredOutbox", "merged"]

# A gathered message is sent once its links add up to this much, well under nats-server's
# default max_payload (1 MiB); a page larger than that alone is sent alone.
MAX_MESSAGE_BYTES = 256 * 1024
_PAGE_BYTES = 160  # a page's own fields and lineage, about
_LINK_BYTES = 3  # a link's quotes and comma

Ack = PubAck | PublishFailed


class Counts(Protocol):
    links_messages: int  # crawl.discovered messages JetStream stored
    links_published: int  # links those messages carried
    links_sent_before: int  # links left out: an earlier page of the message carried them


@dataclass(slots=True)
class _Waiting:
    page: Discovered
    crawl_id: str
    stored: asyncio.Future[Ack]


class DiscoveredOutbox:
    def __init__(
        self, outbox: Outbox, linger_s: float, stats: Counts, max_bytes: int = MAX_MESSAGE_BYTES
    ) -> None:
        self._outbox = outbox
        self._stats = stats
        self._linger_s = linger_s
        self._max_bytes = max_bytes
        # the pages gathered for the next message, their size, and when it goes
        self._gathered: list[_Waiting] = []
        self._bytes = 0
        self._timer: asyncio.TimerHandle | None = None
        self._sending: set[asyncio.Task[None]] = set()  # each message's publish, until acked

    def add(self, page: Discovered, crawl_id: str) -> asyncio.Future[Ack]:
        """Send ``page``'s links (of the task ``crawl_id``); the future is the PubAck of the
        message that carries them, or the PublishFailed of its publish."""
        loop = asyncio.get_running_loop()
        waiting = _Waiting(page, crawl_id, loop.create_future())
        if self._linger_s <= 0:
            self._publish([waiting], contextvars.copy_context())
            return waiting.stored
        size = _PAGE_BYTES + sum(len(link) + _LINK_BYTES for link in page.links)
        if self._gathered and self._bytes + size > self._max_bytes:
            self._send_gathered()
        self._gathered.append(waiting)
        self._bytes += size
        if self._bytes >= self._max_bytes:
            self._send_gathered()
        elif self._timer is None:
            self._timer = loop.call_later(self._linger_s, self._send_gathered)
        return waiting.stored

    def _send_gathered(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        gathered, self._gathered, self._bytes = self._gathered, [], 0
        if gathered:
            self._publish(gathered, contextvars.Context())

    def _publish(self, pages: list[_Waiting], context: contextvars.Context) -> None:
        task = asyncio.get_running_loop().create_task(self._send(pages), context=context)
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, pages: list[_Waiting]) -> None:
        message = merged(*(waiting.page for waiting in pages))
        msg_id = _msg_id([waiting.crawl_id for waiting in pages])
        ack: Ack
        try:
            (ack,) = await self._outbox.send(
                [Outgoing(DISCOVERED, message.to_wire(), {MSG_ID: msg_id})]
            )
        except asyncio.CancelledError as e:  # the loop is closing: the pages are not stored
            _settle(pages, PublishFailed(DISCOVERED, e))
            raise
        except BaseException as e:  # a bug: every page waiting for it fails loudly
            for waiting in pages:
                if not waiting.stored.done():
                    waiting.stored.set_exception(e)
            raise
        if not isinstance(ack, PublishFailed):
            carried = sum(len(page.links) for page in message.pages)
            self._stats.links_messages += 1
            self._stats.links_published += carried
            self._stats.links_sent_before += sum(len(w.page.links) for w in pages) - carried
        _settle(pages, ack)


def _settle(pages: list[_Waiting], ack: Ack) -> None:
    for waiting in pages:
        if not waiting.stored.done():
            waiting.stored.set_result(ack)


def merged(*pages: Discovered) -> DiscoveredPages:
    """One message of ``pages``, in order, each without the links an earlier one carries for an
    equal lineage at the same or a smaller depth (and without pages left with none)."""
    if len(pages) == 1:
        return DiscoveredPages(pages)
    carried: dict[str, tuple[Lineage, int]] = {}
    out: list[Discovered] = []
    for page in pages:
        lineage, depth = page.lineage, page.depth
        links: list[str] = []
        for link in page.links:
            earlier = carried.get(link)
            if earlier is not None and earlier[1] <= depth and earlier[0] == lineage:
                continue
            carried[link] = (lineage, depth)
            links.append(link)
        if len(links) == len(page.links):
            out.append(page)
        elif links:
            out.append(replace(page, links=tuple(links)))
    return DiscoveredPages(tuple(out))


def _msg_id(crawl_ids: list[str]) -> str:
    """The message id of the pages of these tasks (fingerprint: the 128-bit digest URLs get)."""
    if len(crawl_ids) == 1:
        return f"links-{crawl_ids[0]}"
    return "links-" + fingerprint("\n".join(sorted(crawl_ids)))
