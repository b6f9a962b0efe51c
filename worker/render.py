"""Asking the renderer service for a page's DOM: one NATS request per page, in the task's trace.

``RenderClient.render`` sends the served HTML on ``crawl.render`` (:mod:`jetcrawl.contract.render`)
with the current trace context in the headers, and returns the reply. Failures are fetch errors,
translated here once: no renderer running or none answering in time is ``render_unavailable``
(transient: the task is retried later), a render that failed or timed out at the renderer is
``render`` (recorded).
"""

from __future__ import annotations

import asyncio

from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError

from jetcrawl.contract.errors import MessageError
from jetcrawl.contract.render import RENDER_SUBJECT, RenderReply, RenderRequest
from jetcrawl.otel import inject
from jetcrawl.plumbing.backoff import backoff_s
from jetcrawl.worker.errors import FetchError

__all__ = ["REPLY_MARGIN_S", "RenderClient"]

REPLY_MARGIN_S = 5.0  # beyond the render's own time limit, for the queue and the reply
# "No responders" is asked again a few times, NO_RESPONDERS_WAIT_S doubling: a renderer that
# has just subscribed (started, reconnected) is not always in the server's view at once.
NO_RESPONDERS_TRIES = 4
NO_RESPONDERS_WAIT_S = 0.1


class RenderClient:
    def __init__(self, nc: NATS, timeout_s: float) -> None:
        self._nc = nc
        self._timeout_s = timeout_s
        self.requests = 0

    async def answers(self, timeout_s: float = 1.0) -> bool:
        """Whether a renderer answers now (an empty request is a readiness probe)."""
        try:
            await self._nc.request(RENDER_SUBJECT, b"", timeout=timeout_s)
        except (NatsError, TimeoutError):
            return False
        return True

    async def render(
        self, url: str, html: str, user_agent: str, delay_s: float, proxy: str | None
    ) -> RenderReply:
        request = RenderRequest(url, html, user_agent, delay_s, self._timeout_s, proxy)
        data = request.to_wire()
        if len(data) > self._nc.max_payload:
            message = f"page of {len(data)} bytes is over NATS max_payload {self._nc.max_payload}"
            raise FetchError("render", message, url)
        self.requests += 1
        headers = dict(inject(None) or {}) or None
        timeout_s = self._timeout_s + REPLY_MARGIN_S
        try:
            for attempt in range(1, NO_RESPONDERS_TRIES + 1):
                try:
                    msg = await self._nc.request(
                        RENDER_SUBJECT, data, timeout=timeout_s, headers=headers
                    )
                    break
                except NoRespondersError:
                    if attempt == NO_RESPONDERS_TRIES:
                        raise
                    await asyncio.sleep(backoff_s(attempt, NO_RESPONDERS_WAIT_S))
        except NoRespondersError:
            raise FetchError("render_unavailable", "no renderer is running", url) from None
        except TimeoutError:
            message = f"no renderer answered in {timeout_s:.0f} s"
            raise FetchError("render_unavailable", message, url) from None
        except NatsError as e:
            raise FetchError("render_unavailable", f"NATS: {e!r}", url) from None
        try:
            reply = RenderReply.from_wire(msg.data)
        except MessageError as e:
            raise FetchError("render", f"unreadable reply: {e}", url) from None
        if reply.error is not None:
            raise FetchError("render", reply.error, url)
        return reply
