"""Dead letters: the stages of ``CRAWL_DEAD``, listing them, replaying them.

A dead letter is a :class:`~jetcrawl.contract.messages.DeadLetter` on ``crawl.dead.<stage>``:

    seeds, discovered, frontier   input the dispatcher could not read (dispatcher/intake.py)
    frontier  also (reason ``max_deliveries``) a frontier message the dispatchers could not admit
              in ``frontier_max_deliver`` deliveries: publishes failed for minutes on end
              (dispatcher/poison.py)
    task      a task message a worker could not read
    fetch     a task whose retries ran out (reason ``retries_exhausted``); its failed result is in
              CRAWL_RESULTS too
    poison    a task JetStream stopped delivering after MaxDeliver (reason ``max_deliveries``):
              it crashed or hung its worker every time (dispatcher/poison.py)
    sink      an item or result a sink could not decode, or its storage refused (reason
              ``rejected``); replayed, it goes back to its stream for every sink (jetcrawl/sinks/)

``replay`` publishes each chosen letter's original again where it came from, then deletes the
letter, so running it twice replays nothing twice:

- a task (stages task, fetch, poison) goes straight back to its lane's subject.
  Not through the frontier: its URL stays marked seen (``crawl_seen`` denies deletes, and the
  mark is what keeps every other link to it from being admitted again), and a task is exactly
  what the shard's owner takes. It carries ``Nats-Msg-Id: replay-<letter seq>`` (a replay
  interrupted before the delete and run again adds no second copy) and the ``Jetcrawl-Replay``
  header, with which the worker gives the new crawl's records identities of their own: the
  first crawl's result id would otherwise drop them as duplicates within the window.
- frontier input (seeds, discovered) goes back to its frontier subject, for the dispatcher to read
  again, after a fix or a change of settings; still bad, it is dead-lettered again. A message
  that ran out of deliveries may have left seen marks without their tasks, which would make
  its links duplicates the second time: it goes back with ``Jetcrawl-Origin``, the frontier
  sequences it came from, and the dispatcher publishes the tasks of the marks they carry.

A letter whose original was truncated (``dead_original_max_bytes``) cannot be replayed: it is
skipped and kept.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from jetcrawl.contract.deadletters import (
    ORIGIN_HEADER,
    REPLAY_HEADER,
    TASK_STAGES,
    DeadLetter,
)
from jetcrawl.contract.errors import MessageError
from jetcrawl.contract.messages import Task
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import (
    DEAD_PREFIX,
    DEAD_STREAM,
    TASKS_PREFIX,
    dead_subject,
    task_subject,
)
from jetcrawl.plumbing.bus import connect
from jetcrawl.plumbing.pull import pull

__all__ = [
    "Letter",
    "ReplayReport",
    "read_letters",
    "replay",
    "run_command",
]


_BATCH = 256
_FETCH_WAIT_S = 1.0


@dataclass(frozen=True, slots=True)
class Letter:
    seq: int  # in CRAWL_DEAD
    letter: DeadLetter | None  # None: the record itself is unreadable
    raw: bytes

    @property
    def stage(self) -> str:
        return self.letter.stage if self.letter else "?"

    def to_obj(self) -> dict[str, Any]:
        obj: dict[str, Any] = orjson.loads(self.raw) if self.letter else {"unreadable": True}
        return {"seq": self.seq, **obj}

    def line(self) -> str:
        if self.letter is None:
            return f"{self.seq:>7}  (unreadable record)"
        d = self.letter
        when = datetime.fromtimestamp(d.received_at, UTC).strftime("%Y-%m-%d %H:%M:%S")
        original = d.original[:120].decode("utf-8", "replace").replace("\n", "\\n")
        return (
            f"{self.seq:>7}  {when}  {d.stage:<10} {d.reason:<18} {d.subject:<18} "
            f"{d.detail[:100]}  | {original}"
        )


@dataclass(slots=True)
class ReplayReport:
    replayed: int = 0
    skipped: int = 0  # truncated or unreadable: kept


async def read_letters(
    js: JetStreamContext, stage: str | None = None, reason: str | None = None
) -> list[Letter]:
    """Every dead letter stored now (of ``stage`` and ``reason`` if given), oldest first."""
    try:
        info = await js.stream_info(DEAD_STREAM)
    except NotFoundError:  # no crawl ran against this server yet
        return []
    if info.state.messages == 0:
        return []
    subject = dead_subject(stage) if stage else f"{DEAD_PREFIX}>"
    sub = await js.pull_subscribe(
        subject,
        stream=DEAD_STREAM,
        config=ConsumerConfig(
            ack_policy=AckPolicy.NONE,
            deliver_policy=DeliverPolicy.ALL,
            inactive_threshold=30.0,
            mem_storage=True,
        ),
    )
    out: list[Letter] = []
    try:
        while (await sub.consumer_info()).num_pending:
            try:
                msgs = await pull(sub, _BATCH, _FETCH_WAIT_S)
            except TimeoutError:
                break
            for msg in msgs:
                letter = _decode(msg.metadata.sequence.stream, msg.data)
                if reason is None or (letter.letter and letter.letter.reason == reason):
                    out.append(letter)
    finally:
        await sub.unsubscribe()
    return out


async def replay(js: JetStreamContext, letters: Iterable[Letter]) -> ReplayReport:
    """Publish each letter's original where it came from, then delete the letter."""
    report = ReplayReport()
    for item in letters:
        d = item.letter
        if d is None or d.original_size > len(d.original):
            report.skipped += 1
            continue
        headers = {"Nats-Msg-Id": f"replay-{item.seq}"}
        if d.stage in TASK_STAGES or d.subject.startswith(TASKS_PREFIX):
            headers[REPLAY_HEADER] = str(item.seq)
        if d.origins:
            headers[ORIGIN_HEADER] = ",".join(map(str, d.origins))
        await js.publish(_lane_subject(d.subject, d.original), d.original, headers=headers)
        await js.delete_msg(DEAD_STREAM, item.seq)
        report.replayed += 1
    return report


def _lane_subject(subject: str, original: bytes) -> str:
    """Where a letter's original goes back: its own subject, but a task that left before
    lanes (``crawl.tasks.<shard>``) goes to its lane on that shard."""
    parts = subject.split(".")
    if subject.startswith(TASKS_PREFIX) and len(parts) == 3 and parts[2].isdigit():
        try:
            task = Task.from_wire(original)
        except MessageError:
            return subject
        return task_subject(int(parts[2]), task.level, task.lineage.job)
    return subject


async def run_command(
    settings: Settings, action: str, stage: str | None, reason: str | None, as_json: bool
) -> int:
    """``jetcrawl dlq list|replay``: what it prints goes to stdout, the summary to stderr."""
    nc = await connect(settings, "jetcrawl-dlq", give_up_s=settings.command_timeout_s)
    try:
        js = nc.jetstream()
        letters = await read_letters(js, stage, reason)
        if action == "list":
            for item in letters:
                line = orjson.dumps(item.to_obj()).decode() if as_json else item.line()
                print(line)
            print(f"{len(letters)} dead letters", file=sys.stderr)
            return 0
        report = await replay(js, letters)
        print(
            f"replayed {report.replayed} dead letters; {report.skipped} kept "
            "(truncated or unreadable originals)",
            file=sys.stderr,
        )
        return 0
    finally:
        await nc.close()


def _decode(seq: int, data: bytes) -> Letter:
    try:
        return Letter(seq, DeadLetter.from_wire(data), data)
    except MessageError:
        return Letter(seq, None, data)
