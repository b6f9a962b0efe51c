"""Shard owner: pull tasks of owned shards, robots, fetch, parse, publish results and links.

A job's pages also go through ``extract/`` (the spec's declarative rules) and ``plugins.py``
(functions of other packages, by entry-point name); CONTRIBUTING.md lists every module.
A fetched result is held until it is stored (``unpublished.py``): a page is never fetched again
because NATS did not answer.

A shard's tasks come in lanes by priority level and job (``lanes.py``: the schedule, the board of
lanes, the rate caps); a paused job's held tasks wait in ``parking.py``.

The modules for rendering, proxies and soft blocks (issue 28), beside the tree in CONTRIBUTING.md:

pages.py      a task's page fetched as its job's fetch policy says: User-Agent, proxy, render
proxies.py    a job's proxies: rotation, and benching the ones that fail
render.py     asking the renderer service for a page's DOM (NATS request/reply)
shell.py      whether served HTML is a script shell (render: auto)
socks.py      SOCKS5 proxies: a connector that gives the proxy guard-checked addresses
softblock.py  bot walls, CAPTCHAs and login walls served as pages
renderer/     the renderer service (jetcrawl renderer), a package of its own
"""

from jetcrawl.worker.crawl import CrawlStats, TaskProcessor
from jetcrawl.worker.outcome import Ownership
from jetcrawl.worker.service import Worker

__all__ = ["CrawlStats", "Ownership", "TaskProcessor", "Worker"]
