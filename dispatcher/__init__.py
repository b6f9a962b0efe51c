"""Frontier intake: decode, canonicalize, scope, dedupe, shard and publish tasks."""

from dispatcher.intake import Intake, Reading, Rejection
from dispatcher.service import Dispatcher, DispatchStats

__all__ = ["DispatchStats", "Dispatcher", "Intake", "Reading", "Rejection"]
