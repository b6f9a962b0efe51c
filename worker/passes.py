"""One page parse per pass of the event loop.

A worker's loop is saturated when the machine is: each pass runs every callback made ready in
the pass before, and a pass that parses a dozen pages delays by as much the few microseconds a
slow host's next request needs (its turn woken as the last response ends). Parses wait here, in
arrival order, and go one per pass, so the loop's I/O turns stay short and the pages are parsed
as fast as before: the loop is one thread, and the parses were serial anyway.
"""

from __future__ import annotations

import asyncio
from collections import deque

__all__ = ["OnePerPass"]


class OnePerPass:
    """Lets one waiter through per pass of the running loop, in arrival order."""

    def __init__(self) -> None:
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._open = True  # nobody went through in this pass

    async def wait(self) -> None:
        loop = asyncio.get_running_loop()
        if self._open and not self._waiting:
            self._open = False
            loop.call_soon(self._next)
            return
        future = loop.create_future()
        self._waiting.append(future)
        await future

    def _next(self) -> None:
        while self._waiting:
            future = self._waiting.popleft()
            if not future.done():  # a cancelled waiter is done
                future.set_result(None)
                asyncio.get_running_loop().call_soon(self._next)
                return
        self._open = True
