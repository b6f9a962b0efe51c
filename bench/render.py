"""Rendering's cost (``python -m bench render``): pages/s per core and RSS per browser.

A script-shell page (tests/support/jssite.py, whose script fetches its links) is served by a
process of its own; a ``jetcrawl renderer`` process renders it ``--pages`` times, ``--concurrency``
at once, asked over NATS as a worker asks. CPU is the renderer's whole tree (Python, the
Playwright driver, every Chromium process) from /proc; memory (PSS) is sampled during the run. The
baseline in the same run is what the worker spends on the same page unrendered: a Fetcher GET
and the link extraction, in this process (the site is not in it).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.procs import child_env, descendants, read_stat, self_cpu_s
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.urls import LinkCanonicalizer, UrlRules
from jetcrawl.local.embedded import NatsServer
from jetcrawl.worker.fetcher import Fetcher
from jetcrawl.worker.parse import extract
from jetcrawl.worker.render import RenderClient

__all__ = ["RenderReading", "measure_render", "render_markdown"]

SITE_HOST = "127.0.0.40"
ROOT = str(Path(__file__).resolve().parent.parent)
SAMPLE_EVERY_S = 0.2
READY_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class RenderReading:
    pages: int
    concurrency: int
    rendered_per_s: float  # wall-clock pages/s
    renderer_cpu_s: float  # the renderer's tree: Python, driver, Chromium
    rendered_per_cpu_s: float  # pages per CPU-second: pages/s per busy core
    served_per_cpu_s: float  # the baseline: GET + link extraction of the served page
    browser_pss_mb: float  # peak PSS, summed over the Chromium processes of the one browser
    renderer_pss_mb: float  # peak PSS, the renderer's whole tree

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


SITE_SCRIPT = """
import asyncio, sys
from tests.support.badsite import BadSite
from tests.support.jssite import js_site

async def main() -> None:
    async with BadSite(host=sys.argv[1]) as site:
        js_site(site, "http://127.0.0.41/elsewhere.js")
        print(site.url("/"), flush=True)
        await asyncio.Event().wait()

asyncio.run(main())
"""


async def measure_render(pages: int, concurrency: int) -> RenderReading:
    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("bench render: chromium not found (apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="jetcrawl-bench-render-") as tmp:
        async with NatsServer(Path(tmp) / "nats") as nats:
            site = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                SITE_SCRIPT,
                SITE_HOST,
                stdout=asyncio.subprocess.PIPE,
                env=child_env(),
                cwd=ROOT,
            )
            renderer = None
            try:
                assert site.stdout is not None
                url = (await site.stdout.readline()).decode().strip()
                env = child_env(
                    {
                        "JETCRAWL_RENDER_PAGES_PER_BROWSER": str(pages + 1),
                        "JETCRAWL_RENDER_CONCURRENCY": str(concurrency),
                    }
                )
                renderer = await asyncio.create_subprocess_exec(
                    sys.executable,
                    *("-m", "jetcrawl", "--log-level", "WARNING", "renderer"),
                    *("--nats", nats.url, "--allow-net", "127.0.0.0/8"),
                    env=env,
                    cwd=tmp,
                )
                return await _measure(nats.url, url, renderer.pid, pages, concurrency)
            finally:
                for proc in (renderer, site):
                    if proc is not None:
                        proc.terminate()
                        await proc.wait()


async def _measure(
    nats_url: str, url: str, renderer_pid: int, pages: int, concurrency: int
) -> RenderReading:
    import nats

    settings = Settings(nats_url=nats_url, allow_nets=("127.0.0.0/8",))
    nc = await nats.connect(nats_url)
    try:
        client = RenderClient(nc, 30.0)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not await client.answers():
            if time.monotonic() > deadline:
                raise SystemExit("bench render: the renderer did not answer")
        async with Fetcher(settings) as fetcher:
            html = (await fetcher.fetch(url)).body.decode()
            served_per_cpu_s = await _served(fetcher, url, pages)
            peak = {"browser": 0, "tree": 0}
            cpu_before = _tree_cpu_s(renderer_pid)
            started = time.perf_counter()
            sampling = asyncio.create_task(_sample(renderer_pid, peak))
            queue: asyncio.Queue[int] = asyncio.Queue()
            for n in range(pages):
                queue.put_nowait(n)

            async def render_some() -> None:
                while not queue.empty():
                    queue.get_nowait()
                    await client.render(url, html, settings.user_agent, 0.0, None)

            await asyncio.gather(*(render_some() for _ in range(concurrency)))
            wall_s = time.perf_counter() - started
            cpu_s = _tree_cpu_s(renderer_pid) - cpu_before
            sampling.cancel()
    finally:
        await nc.close()
    return RenderReading(
        pages=pages,
        concurrency=concurrency,
        rendered_per_s=pages / wall_s,
        renderer_cpu_s=cpu_s,
        rendered_per_cpu_s=pages / cpu_s,
        served_per_cpu_s=served_per_cpu_s,
        browser_pss_mb=peak["browser"] / 2**20,
        renderer_pss_mb=peak["tree"] / 2**20,
    )


async def _served(fetcher: Fetcher, url: str, pages: int) -> float:
    """Pages per CPU-second of this process for the served page: GET and link extraction."""
    links = LinkCanonicalizer(UrlRules())
    before = self_cpu_s()
    for _ in range(pages):
        fetched = await fetcher.fetch(url)
        extract(fetched.body, fetched.final_url, fetched.charset, links)
    return pages / max(self_cpu_s() - before, 1e-6)


def _tree_cpu_s(root: int) -> float:
    return sum(s.cpu_s for pid in (root, *descendants(root)) if (s := read_stat(pid)) is not None)


async def _sample(root: int, peak: dict[str, int]) -> None:
    """Peak memory: PSS (shared pages split among their sharers), since Chromium's processes
    share most of theirs and a sum of RSS would count them many times."""
    while True:
        pids = [root, *descendants(root)]
        browser = sum(_pss(pid) for pid in pids if _is_chromium(pid))
        peak["browser"] = max(peak["browser"], browser)
        peak["tree"] = max(peak["tree"], sum(_pss(pid) for pid in pids))
        await asyncio.sleep(SAMPLE_EVERY_S)


def _is_chromium(pid: int) -> bool:
    stat = read_stat(pid)
    return stat is not None and "chrom" in stat.name.lower()


def _pss(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return 0


def render_markdown(r: RenderReading) -> str:
    ratio = r.rendered_per_cpu_s / r.served_per_cpu_s
    return (
        f"| pages | at once | rendered/s | rendered per CPU-s | served per CPU-s | ratio | "
        f"memory per browser (PSS) | renderer (PSS) |\n|---|---|---|---|---|---|---|---|\n"
        f"| {r.pages} | {r.concurrency} | {r.rendered_per_s:.1f} | {r.rendered_per_cpu_s:.1f} | "
        f"{r.served_per_cpu_s:.0f} | {ratio:.4f} | {r.browser_pss_mb:.0f} MB | "
        f"{r.renderer_pss_mb:.0f} MB |\n\n(on {os.cpu_count()} cores)\n"
    )
