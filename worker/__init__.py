"""Shard owner: pull tasks of owned shards, robots, fetch, parse, publish results and links.

A fetched result is held until it is stored (``unpublished.py``): a page is never fetched again
because NATS did not answer.
"""

from jetcrawl.worker.crawl import CrawlStats, TaskProcessor
from jetcrawl.worker.outcome import Ownership
from jetcrawl.worker.service import Worker

__all__ = ["CrawlStats", "Ownership", "TaskProcessor", "Worker"]
