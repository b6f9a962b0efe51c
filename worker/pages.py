"""A task's page fetched as its job's fetch policy says (:mod:`jetcrawl.contract.fetchpolicy`).

``PageFetcher.get`` is the fetch step with the policy applied, in this order:

1. the request goes out with the job's User-Agent (robots.txt was read for the same one), through
   a proxy of the job's pool when it has one (:mod:`jetcrawl.worker.proxies`; the SSRF guard
   checks the target's addresses first, since the proxy connects to them, not us);
2. the response is checked for a soft block (:mod:`jetcrawl.worker.softblock`); with
   ``on_block: proxy`` the proxy that drew it is benched and the page fetched once more through
   the next one;
3. the page is rendered (:mod:`jetcrawl.worker.render`) when the policy says ``always``, when it
   says ``auto`` and the HTML is a script shell (:mod:`jetcrawl.worker.shell`), or when a soft
   block escalates to ``render``. Links and extraction read the rendered DOM (``Got.html``)
   exactly as they read served HTML; the served body stays the record's (digest, WARC). A
   rendered page is checked for a soft block again.

``on_block: retry`` is the crawl's to carry out (a hand-back): here a soft block is only named.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass

from jetcrawl.contract.fetchpolicy import RENDER_ALWAYS, RENDER_AUTO, FetchPolicy
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.urls import host_of
from jetcrawl.worker.errors import FetchError
from jetcrawl.worker.fetcher import HTML_TYPES, Fetched, Fetcher
from jetcrawl.worker.proxies import PROXY_FAILURE_STATUSES, Proxy, ProxyPool
from jetcrawl.worker.render import RenderClient
from jetcrawl.worker.shell import script_shell
from jetcrawl.worker.softblock import soft_block

__all__ = ["Got", "PageFetcher"]

# Fetch errors that are the proxy's fault as much as the site's: they bench the proxy.
_PROXY_FAULTS = frozenset({"proxy", "timeout", "connect", "refused"})


@dataclass(frozen=True, slots=True)
class Got:
    fetched: Fetched  # the response as served (its body is what a WARC record keeps)
    rendered: bool = False
    blocked: str | None = None  # the soft-block signal, or None
    proxy: str | None = None  # the label of the proxy that carried it
    dom: bytes | None = None  # the rendered DOM as UTF-8, when rendered

    def html(self) -> tuple[bytes, str | None]:
        """What links and extraction read, and its charset: the DOM, else the served body."""
        if self.dom is not None:
            return self.dom, "utf-8"
        return self.fetched.body, self.fetched.charset


class PageFetcher:
    def __init__(
        self,
        settings: Settings,
        fetcher: Fetcher,
        renderer: RenderClient | None,
        env: Mapping[str, str] | None = None,
        job_policy: Callable[[str], FetchPolicy | None] | None = None,
    ) -> None:
        self._settings = settings
        self._fetcher = fetcher
        self._renderer = renderer
        self._env = os.environ if env is None else env
        self._default = FetchPolicy.from_settings(settings)
        self._job_policy = job_policy  # a job spec's own fetch section, if it has one
        self._pools: dict[tuple[tuple[str, ...], str], ProxyPool] = {}
        self.renders = 0

    def policy(self, job: str) -> FetchPolicy:
        """The fetch policy of ``job``: its spec's ``fetch`` section, else the settings'."""
        own = self._job_policy(job) if self._job_policy is not None else None
        return own or self._default

    def user_agent(self, job: str) -> str:
        return self.policy(job).user_agent or self._settings.user_agent

    def pool(self, policy: FetchPolicy) -> ProxyPool | None:
        if not policy.proxies:
            return None
        key = (policy.proxies, policy.proxy_rotation)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = ProxyPool(
                policy.proxies, policy.proxy_rotation, self._settings.proxy_bench_s, self._env
            )
        return pool

    async def get(
        self,
        url: str,
        job: str,
        *,
        delay_s: float,
        follow_redirects: bool,
        headers: Mapping[str, str] | None = None,
        reads: Container[str] = HTML_TYPES,
    ) -> Got:
        """The page; a 2xx body is read only when its media type is in ``reads`` (the job's
        content types), else released unread (``Fetched.skipped``)."""
        policy = self.policy(job)
        sent = dict(headers or {})
        if policy.user_agent is not None:
            sent["User-Agent"] = policy.user_agent
        pool = self.pool(policy)
        fetched, proxy = await self._fetch(url, sent or None, follow_redirects, pool, reads)
        blocked = _blocked(fetched)
        if blocked is not None and policy.on_block == "proxy" and pool and proxy:
            pool.failed(proxy, f"soft block ({blocked}) on {host_of(url)}")
            fetched, proxy = await self._fetch(url, sent or None, follow_redirects, pool, reads)
            blocked = _blocked(fetched)
        html_page = fetched.is_html and 200 <= fetched.status < 300 and bool(fetched.body)
        render = html_page and (
            policy.render == RENDER_ALWAYS
            or (blocked is not None and policy.on_block == "render")
            or (blocked is None and policy.render == RENDER_AUTO and script_shell(fetched.body))
        )
        label = proxy.label if proxy else None
        if not render:
            return Got(fetched, False, blocked, label)
        dom = await self._render(fetched, policy, delay_s, proxy)
        return Got(fetched, True, soft_block(200, dom, None), label, dom)

    async def _fetch(
        self,
        url: str,
        headers: Mapping[str, str] | None,
        follow_redirects: bool,
        pool: ProxyPool | None,
        reads: Container[str],
    ) -> tuple[Fetched, Proxy | None]:
        if pool is None:
            return await self._fetcher.fetch(
                url, follow_redirects=follow_redirects, headers=headers, reads=reads
            ), None
        proxy = pool.pick(host_of(url))
        if proxy is None:
            back_s = pool.soonest_back_s()
            raise FetchError(
                "proxy", f"every proxy is benched (one is back in {back_s:.0f} s)", url
            )
        await self._fetcher.guard_name(url)
        try:
            fetched = await self._fetcher.fetch(
                url,
                follow_redirects=follow_redirects,
                headers=headers,
                proxy=proxy.url,
                reads=reads,
            )
        except FetchError as e:
            if e.kind in _PROXY_FAULTS:
                pool.failed(proxy, f"{e.kind}: {e.message}")
            raise
        if fetched.status in PROXY_FAILURE_STATUSES:
            pool.failed(proxy, f"HTTP {fetched.status}")
            raise FetchError("proxy", f"{proxy.label} answered HTTP {fetched.status}", url)
        pool.succeeded(proxy)
        return fetched, proxy

    async def _render(
        self, fetched: Fetched, policy: FetchPolicy, delay_s: float, proxy: Proxy | None
    ) -> bytes:
        if self._renderer is None:
            raise FetchError("render_unavailable", "this worker has no renderer", fetched.url)
        html = _decoded(fetched.body, fetched.charset)
        self.renders += 1
        reply = await self._renderer.render(
            fetched.final_url,
            html,
            policy.user_agent or self._settings.user_agent,
            delay_s,
            proxy.source if proxy else None,
        )
        return (reply.dom or "").encode()


def _decoded(body: bytes, charset: str | None) -> str:
    """The served HTML as text for the browser: its charset when Python knows it, else UTF-8."""
    try:
        return body.decode(charset or "utf-8", "replace")
    except LookupError:  # a charset label Python has no codec for
        return body.decode("utf-8", "replace")


def _blocked(fetched: Fetched) -> str | None:
    redirected = fetched.location or (fetched.final_url if fetched.redirects else None)
    # a body read for a job that reads other types (an image, a PDF) is no page to judge
    return soft_block(fetched.status, fetched.body if fetched.is_html else b"", redirected)
