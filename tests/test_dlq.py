"""Dead letters: a poison task through max-deliveries to CRAWL_DEAD and back with ``dlq replay``.

The poison test runs real worker processes with the ``worker.exit_on_url`` fault: the process
dies whenever it is about to fetch the poison URL, so the task is never acked.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
from nats.js import JetStreamContext

from jetcrawl.contract.deadletters import REPLAY_HEADER, DeadLetter
from jetcrawl.contract.messages import Lineage, Task
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import (
    ADVISORIES_STREAM,
    DEAD_STREAM,
    SEEDS,
    TASKS_STREAM,
    dead_subject,
)
from jetcrawl.contract.urls import fingerprint
from jetcrawl.local.embedded import EtcdServer, NatsServer
from jetcrawl.ops.dlq import read_letters, replay
from jetcrawl.plumbing.topology import ensure
from tests.support.badsite import BadSite
from tests.support.mesh import Mesh
from tests.support.streams import eventually, stored

POISON = "/poison"


async def jetcrawl(settings: Settings, *args: str) -> tuple[int, str, str]:
    """Run the jetcrawl command; (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "jetcrawl",
        *args,
        "--nats",
        settings.nats_url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(30):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.fixture
async def mesh(
    nats_server: NatsServer, etcd_server: EtcdServer, tmp_path: Path
) -> AsyncIterator[Mesh]:
    # Two deliveries and no politeness hand-backs: the second crash is the last.
    async with Mesh(
        nats_server.url, etcd_server.url, tmp_path, task_max_deliver=2, max_deferrals=0
    ) as started:
        yield started


async def test_a_poison_task_ends_in_crawl_dead_and_dlq_replay_crawls_it(mesh: Mesh) -> None:
    async with BadSite(host="127.0.0.2") as site:
        site.add(POISON, "<title>not poison after all</title>")
        poison_url = site.url(POISON)
        crash = f"worker.exit_on_url:{POISON}"

        # Alone: a crash also costs every other task the worker holds a delivery.
        await mesh.start("dispatcher", "dispatcher")
        first = await mesh.start("worker", "w1", fault=crash)
        await mesh.seed([poison_url])
        assert await first.wait() == 137, first.log()  # delivery 1
        second = await mesh.start("worker", "w2", fault=crash)
        assert await second.wait() == 137, second.log()  # delivery 2: MaxDeliver
        await mesh.start("worker", "w3")  # pulling the shard makes JetStream give up on it

        async def dead_lettered() -> bool:
            return (await mesh.js.stream_info(DEAD_STREAM)).state.messages == 1

        await eventually(dead_lettered, within_s=30)
        [letter] = [DeadLetter.from_wire(m.data) for m in await stored(mesh.js, DEAD_STREAM)]
        assert (letter.stage, letter.reason) == ("poison", "max_deliveries")
        assert Task.from_wire(letter.original).url == poison_url
        assert site.hits[POISON] == 0, "the fault struck before every request"
        snap = await mesh.wait_drained()
        assert snap.task_backlog == 0
        stuck = await stored(mesh.js, TASKS_STREAM)
        assert stuck == [], "the poison task was deleted from the work queue"
        assert (await mesh.js.stream_info(ADVISORIES_STREAM)).state.messages == 0
        assert poison_url not in {r.url for r in await mesh.results()}

        code, out, err = await jetcrawl(mesh.settings, "dlq", "list", "--stage", "poison", "--json")
        assert code == 0, err
        [listed] = [orjson.loads(line) for line in out.splitlines()]
        assert (listed["stage"], listed["reason"]) == ("poison", "max_deliveries")
        code, out, err = await jetcrawl(mesh.settings, "dlq", "list")
        assert code == 0 and "max_deliveries" in out and POISON in out, (out, err)

        code, _, err = await jetcrawl(mesh.settings, "dlq", "replay", "--stage", "poison")
        assert code == 0 and "replayed 1 " in err, err
        await mesh.wait_drained()
        crawled = {r.url: r for r in await mesh.results()}
        assert crawled[poison_url].title == "not poison after all"
        assert crawled[poison_url].worker == "w3"
        assert site.hits[POISON] == 1
        assert (await mesh.js.stream_info(DEAD_STREAM)).state.messages == 0
        code, out, err = await jetcrawl(mesh.settings, "dlq", "replay")
        assert (code, out) == (0, "") and "replayed 0 " in err, "idempotent"


# --- listing and replaying, without a crawl


def letter(stage: str, reason: str, subject: str, original: bytes, **kw: object) -> bytes:
    return DeadLetter.of(
        stage=stage,
        reason=reason,
        detail="d",
        subject=subject,
        received_at=1.0,
        original=original,
        max_bytes=int(kw.get("max_bytes", 4096)),  # type: ignore[call-overload]
        stream_seq=7,
    ).to_wire()


async def test_replay_sends_each_letter_back_where_it_came_from_once(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    await ensure(js, Settings(nats_url=nats_server.url, shards=2))
    task = Task(
        "https://a.example/x",
        fingerprint("https://a.example/x"),
        1,
        Lineage("j", "host", "a.example", 3),
    )
    await js.publish(
        dead_subject("fetch"), letter("fetch", "retries_exhausted", "crawl.tasks.1", task.to_wire())
    )
    await js.publish(
        dead_subject("seeds"), letter("seeds", "too_long", SEEDS, b"https://b.example/")
    )
    await js.publish(
        dead_subject("seeds"), letter("seeds", "binary", SEEDS, b"x" * 100, max_bytes=10)
    )

    assert [x.stage for x in await read_letters(js)] == ["fetch", "seeds", "seeds"]
    assert [x.letter and x.letter.reason for x in await read_letters(js, stage="seeds")] == [
        "too_long",
        "binary",
    ]
    chosen = await read_letters(js, reason="retries_exhausted")
    assert [x.stage for x in chosen] == ["fetch"]

    report = await replay(js, await read_letters(js))
    assert (report.replayed, report.skipped) == (2, 1), "a truncated original is kept"
    [back] = await stored(js, TASKS_STREAM)
    # a task dead-lettered before lanes goes back to its lane on its shard
    assert (back.subject, Task.from_wire(back.data)) == ("crawl.tasks.1.2.j", task)
    assert back.headers[REPLAY_HEADER] == str(chosen[0].seq)
    frontier = await js.get_last_msg("CRAWL_FRONTIER", SEEDS)
    assert frontier.data == b"https://b.example/"
    assert [x.letter and x.letter.reason for x in await read_letters(js)] == ["binary"]

    again = await replay(js, await read_letters(js))
    assert (again.replayed, again.skipped) == (0, 1)
    assert len(await stored(js, TASKS_STREAM)) == 1
