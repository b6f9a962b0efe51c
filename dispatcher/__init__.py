"""Frontier intake: decode, canonicalize, scope, dedupe, shard and publish tasks."""

from jetcrawl.dispatcher.intake import Intake, Reading, Rejection
from jetcrawl.dispatcher.service import Dispatcher, DispatchStats

__all__ = ["DispatchStats", "Dispatcher", "Intake", "Reading", "Rejection"]
