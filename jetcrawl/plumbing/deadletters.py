"""Dead letters as the services write them: built from the NATS message they give up on.

The dispatcher (rejected input), the worker (unreadable tasks, exhausted retries) and the poison
collector (messages JetStream gave up on) all turn a stored message into a
:class:`~jetcrawl.contract.deadletters.DeadLetter` here, with its subject, its stream sequence
and its data (or the part of it that was rejected) cut to ``max_bytes``, and publish it with
:func:`to_outgoing`: on ``crawl.dead.<stage>``, under a message id so a redelivery adds none.
"""

from __future__ import annotations

import time

from nats.aio.msg import Msg
from nats.js.api import RawStreamMsg

from jetcrawl.contract.deadletters import DeadLetter
from jetcrawl.contract.topology import dead_subject
from jetcrawl.plumbing.bus import MSG_ID, Outgoing

__all__ = ["dead_letter", "to_outgoing"]


def dead_letter(
    msg: Msg | RawStreamMsg,
    stage: str,
    reason: str,
    detail: str,
    *,
    max_bytes: int,
    original: bytes | None = None,
    origins: tuple[int, ...] = (),
) -> DeadLetter:
    """The letter for ``msg`` (delivered by a consumer, or read by sequence), written now;
    ``original``: the part of its data that is dead, when not the whole."""
    seq = msg.seq if isinstance(msg, RawStreamMsg) else msg.metadata.sequence.stream
    return DeadLetter.of(
        stage=stage,
        reason=reason,
        detail=detail,
        subject=msg.subject or "",
        received_at=time.time(),
        original=(msg.data or b"") if original is None else original,
        max_bytes=max_bytes,
        stream_seq=seq,
        origins=origins,
    )


def to_outgoing(letter: DeadLetter, msg_id: str) -> Outgoing:
    """``letter`` as a publish on its stage's subject, deduplicated by ``msg_id``."""
    return Outgoing(dead_subject(letter.stage), letter.to_wire(), {MSG_ID: msg_id})
