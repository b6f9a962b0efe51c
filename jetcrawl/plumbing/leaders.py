"""The partitions spread over the cluster: their streams' leaders on different servers.

K partitions are 2K Raft groups (a task stream and a seen bucket each), and admissions per
second grow with K only where their leaders sit on different servers; nats-server elects a new
stream's leader wherever it likes (often the same server for all). :func:`spread_leaders` asks
both streams of partition ``p`` to be led by the ``p``-th server of their peers (sorted by
name, in turn), by a leader step-down naming that server as preferred (nats-server 2.11+). A
stream of one replica has no peer to move to: where it lives is nats-server's placement. A
refused step-down only costs speed, so it is logged.
"""

from __future__ import annotations

import logging

import orjson
from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import StreamInfo
from nats.js.errors import ServiceUnavailableError

from jetcrawl.contract.topology import seen_streams, tasks_streams

__all__ = ["leaders", "spread_leaders"]

log = logging.getLogger(__name__)

STEPDOWN_TIMEOUT_S = 5.0


async def spread_leaders(nc: NATS, partitions: int) -> list[tuple[str, str]]:
    """Ask each partition's stream whose leader is not its partition's server to move there;
    the ``(stream, server)`` moves asked for (none with one partition, or all in place)."""
    if partitions < 2:
        return []
    js = nc.jetstream()
    named = [*seen_streams(partitions), *tasks_streams(partitions)]
    infos = [await _info(js, name) for name in named]
    servers = sorted({peer for info in infos if info for peer in _peers(info)})
    moves: list[tuple[str, str]] = []
    for i, info in enumerate(infos):
        if info is None:
            log.warning("partition stream %s: leader not moved: electing", named[i])
            continue
        p = i % partitions
        want = servers[p % len(servers)] if servers else None
        if want is None or info.cluster is None or info.cluster.leader == want:
            continue
        if want not in _peers(info):
            continue  # one replica, or not placed there
        name = info.config.name or ""
        body = orjson.dumps({"placement": {"preferred": want}})
        try:
            reply = await nc.request(
                f"$JS.API.STREAM.LEADER.STEPDOWN.{name}", body, timeout=STEPDOWN_TIMEOUT_S
            )
        except (TimeoutError, NatsError) as e:
            log.warning("partition stream %s: leader not moved to %s: %r", name, want, e)
            continue
        error = orjson.loads(reply.data).get("error")
        if error:
            log.warning("partition stream %s: leader not moved to %s: %s", name, want, error)
            continue
        log.info("partition stream %s: leader moved from %s to %s", name, info.cluster.leader, want)
        moves.append((name, want))
    return moves


async def leaders(nc: NATS, streams: list[str]) -> list[str | None]:
    """The current leader of each of ``streams`` (None: electing), in order."""
    return [await _leader(nc.jetstream(), name) for name in streams]


async def _leader(js: JetStreamContext, stream: str) -> str | None:
    info = await _info(js, stream)
    return info.cluster.leader if info is not None and info.cluster is not None else None


async def _info(js: JetStreamContext, stream: str) -> StreamInfo | None:
    """The stream's info, or None while it elects a leader (another process's step-down)."""
    try:
        return await js.stream_info(stream)
    except (NatsTimeout, ServiceUnavailableError):
        return None


def _peers(info: StreamInfo) -> list[str]:
    if info.cluster is None:
        return []
    named = [info.cluster.leader] + [r.name for r in info.cluster.replicas or []]
    return [name for name in named if name]
