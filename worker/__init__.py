"""Shard owner: pull tasks of owned shards, robots, fetch, parse, publish results and links."""

from jetcrawl.worker.crawl import CrawlStats, Ownership, TaskProcessor
from jetcrawl.worker.service import Worker

__all__ = ["CrawlStats", "Ownership", "TaskProcessor", "Worker"]
