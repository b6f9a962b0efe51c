"""Shard owner: pull tasks of owned shards, robots, fetch, parse, publish results and links.

A job's pages also go through ``extract/`` (the spec's declarative rules) and ``plugins.py``
(functions of other packages, by entry-point name); CONTRIBUTING.md lists every module.
"""

from jetcrawl.worker.crawl import CrawlStats, TaskProcessor
from jetcrawl.worker.outcome import Ownership
from jetcrawl.worker.service import Worker

__all__ = ["CrawlStats", "Ownership", "TaskProcessor", "Worker"]
