"""The links a worker has handed to the frontier, so a link on many pages is sent once.

Pages repeat their links (navigation, footers, the same page linked from everywhere): on a typical
site most of a page's links were on pages the worker fetched before. Once JetStream has stored a
discovered-links message, the dispatcher will read it, so sending the same link again only costs a
stored message, a PubAck, a delivery and a seen-set lookup to learn it is a duplicate.

``SentLinks`` remembers, bounded (the oldest entry goes first), each link of an acknowledged
message with its lineage and depth. A link is left out of a later message only when it was sent
with an equal lineage (job, scope, root, depth limit) at the same or a smaller depth — the
dispatcher's answer for it cannot differ — and, with re-crawls on, less than ``recrawl_after_s``
ago (the seen mark it made has not expired). Anything the memory lost is just sent again: the
dispatcher's seen set stays the one that decides.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from itertools import islice

from jetcrawl.contract.messages import Lineage

__all__ = ["SentLinks"]


class SentLinks:
    def __init__(
        self,
        size: int,
        recrawl_after_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._size = size  # 0: remember nothing
        self._expire_s = recrawl_after_s  # 0: a sent link stays sent
        self._clock = clock
        self._sent: dict[str, tuple[Lineage, int, float]] = {}  # url -> (lineage, depth, when)
        # One object per lineage, so a link's lineage is compared by identity: each task
        # decodes its own copy.
        self._lineages: dict[Lineage, Lineage] = {}

    def __len__(self) -> int:
        return len(self._sent)

    def unsent(self, lineage: Lineage, depth: int, links: tuple[str, ...]) -> tuple[str, ...]:
        """``links`` without those sent before for ``lineage`` at ``depth`` or less."""
        if not self._sent:
            return links
        lineage = self._lineages.get(lineage, lineage)
        get = self._sent.get
        oldest = self._clock() - self._expire_s if self._expire_s > 0 else None
        out = []
        for link in links:
            sent = get(link)
            if (
                sent is None
                or sent[1] > depth
                or sent[0] is not lineage
                or (oldest is not None and sent[2] < oldest)
            ):
                out.append(link)
        return links if len(out) == len(links) else tuple(out)

    def sent(self, lineage: Lineage, depth: int, links: Iterable[str]) -> None:
        """Remember ``links``, which JetStream has stored for ``lineage`` at ``depth``."""
        if self._size <= 0:
            return
        lineage = self._lineages.setdefault(lineage, lineage)
        if len(self._lineages) > self._size:  # each remembered link holds its lineage anyway
            self._lineages.clear()
            self._lineages[lineage] = lineage
        entry = (lineage, depth, self._clock())
        remembered = self._sent
        for link in links:
            remembered.pop(link, None)  # a newer entry goes to the young end
            remembered[link] = entry
        excess = len(remembered) - self._size
        if excess > 0:
            for link in list(islice(remembered, excess)):
                del remembered[link]
