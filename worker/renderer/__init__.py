"""The renderer service (``jetcrawl renderer``): pages sent by workers, rendered in Chromium.

service.py   render requests from NATS (queue group), bounded, answered with the DOM
browser.py   one Chromium via Playwright: a context per page, deadlines, recycled browsers
rules.py     robots.txt, the host's politeness, the SSRF guard for every request a page makes

Playwright is the ``render`` extra: only a process that imports this package needs it.
"""

from jetcrawl.worker.renderer.service import RendererService, RenderStats

__all__ = ["RenderStats", "RendererService"]
