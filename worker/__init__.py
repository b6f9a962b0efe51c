"""Shard owner: pull tasks of owned shards, robots, fetch, parse, publish results and links."""

from worker.crawl import CrawlStats, Ownership, TaskProcessor
from worker.service import Worker

__all__ = ["CrawlStats", "Ownership", "TaskProcessor", "Worker"]
