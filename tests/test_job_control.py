"""jetcrawl job pause|resume|cancel against a real nats-server: states by compare-and-set, the
cancel's purge of one job's lanes only, unknown names and a dead server refused in one line."""

from __future__ import annotations

import asyncio
import getpass
import socket
import sys
import time

import pytest
from nats.js import JetStreamContext

from jetcrawl.contract.control import CANCELLED, PAUSED, RUNNING, JobControl
from jetcrawl.contract.jobs import JobSpec
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import CONTROL_BUCKET, SEEDS, TASKS_STREAM, task_subject
from jetcrawl.local.embedded import NatsServer
from jetcrawl.plumbing.control import ControlStore
from jetcrawl.plumbing.specs import SpecStore
from jetcrawl.plumbing.topology import ensure
from tests.support.streams import eventually
from tests.test_good_citizen import drained, results, settings_for
from tests.test_priorities import dispatching, seeds, site_with, working


async def jetcrawl(nats_url: str, *args: str) -> tuple[int, str, str]:
    """Run the jetcrawl command; (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "jetcrawl", *args, "--nats", nats_url, "--connect-timeout", "3"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(30):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def queue(js: JetStreamContext, lanes: dict[tuple[int, int, str], int]) -> None:
    """Tasks published by hand to lanes (shard, level, job), as a dispatcher would."""
    for (shard, level, job), count in lanes.items():
        for i in range(count):
            await js.publish(task_subject(shard, level, job), f"{job}-{shard}-{level}-{i}".encode())


async def lanes(js: JetStreamContext) -> dict[str, int]:
    info = await js.stream_info(TASKS_STREAM, subjects_filter="crawl.tasks.>")
    return dict(info.state.subjects or {})


async def record(js: JetStreamContext, job: str) -> JobControl:
    return await (await ControlStore.open(js)).get(job)


async def test_cancel_purges_only_that_jobs_tasks_and_is_recorded_once(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    await ensure(js, Settings(nats_url=nats_server.url, shards=4))
    await queue(js, {(0, 0, "big"): 3, (1, 2, "big"): 2, (3, 3, "big"): 1})
    await queue(js, {(0, 0, "small"): 2, (1, 2, "small"): 1, (2, 1, "bigger"): 1})
    others = {s: n for s, n in (await lanes(js)).items() if not s.endswith(".big")}

    code, out, err = await jetcrawl(nats_server.url, "job", "cancel", "big")
    assert (code, out, err) == (0, "job big cancelled: 6 queued tasks removed\n", "")
    after = await lanes(js)
    assert not [s for s in after if s.endswith(".big")], after
    assert after == others, "the other jobs' tasks (bigger too) are untouched"
    first = await record(js, "big")
    assert (first.state, first.purged) == (CANCELLED, 6)
    assert first.by == f"{getpass.getuser()}@{socket.gethostname()}"

    code, out, err = await jetcrawl(nats_server.url, "job", "cancel", "big")
    assert (code, err) == (0, "")
    assert out.startswith("job big: already cancelled at ") and "nothing changed" in out, out
    assert await record(js, "big") == first, "recorded once"
    assert await lanes(js) == others

    # A task a dispatcher published after the cancel: a second cancel takes it out too.
    await queue(js, {(2, 0, "big"): 1})
    code, out, _ = await jetcrawl(nats_server.url, "job", "cancel", "big")
    assert code == 0 and "already cancelled" in out and "1 queued tasks that came since" in out
    latest = await record(js, "big")
    assert (latest.state, latest.at, latest.purged) == (CANCELLED, first.at, 7)
    assert await lanes(js) == others

    code, out, err = await jetcrawl(nats_server.url, "job", "resume", "big")
    assert (code, out) == (2, "") and "cancelled at" in err and "cannot run again" in err
    assert err.count("\n") == 1, "one line"
    assert (await record(js, "big")).state == CANCELLED


async def test_pause_and_resume_change_the_state_once_and_keep_the_tasks(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    await ensure(js, Settings(nats_url=nats_server.url, shards=4))
    await queue(js, {(0, 1, "news"): 2})
    before = await lanes(js)

    assert await jetcrawl(nats_server.url, "job", "pause", "news") == (0, "job news paused\n", "")
    paused = await record(js, "news")
    assert paused.state == PAUSED and paused.at > 0
    code, out, _ = await jetcrawl(nats_server.url, "job", "pause", "news")
    assert code == 0 and out.startswith("job news: already paused at ") and "nothing changed" in out
    assert await record(js, "news") == paused

    code, out, _ = await jetcrawl(nats_server.url, "job", "resume", "news")
    assert (code, out) == (0, "job news running again\n")
    assert (await record(js, "news")).state == RUNNING
    code, out, _ = await jetcrawl(nats_server.url, "job", "resume", "news")
    assert code == 0 and "already running" in out
    assert await lanes(js) == before, "pause and resume leave the tasks queued"

    # The default job is known without a spec, a record or a task.
    code, out, _ = await jetcrawl(nats_server.url, "job", "resume", "default")
    assert (code, out) == (0, "job default: already running; nothing changed\n")


async def test_a_job_known_only_by_its_spec_can_be_paused(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    await ensure(js, Settings(nats_url=nats_server.url, shards=4))
    await (await SpecStore.open(js)).put(JobSpec.read({"name": "shop", "max_depth": 2}))
    assert (await jetcrawl(nats_server.url, "job", "pause", "shop"))[:2] == (
        0,
        "job shop paused\n",
    )


@pytest.mark.parametrize("action", ["pause", "resume", "cancel"])
async def test_an_unknown_job_exits_2_naming_it_and_changes_nothing(
    nats_server: NatsServer, js: JetStreamContext, action: str
) -> None:
    await ensure(js, Settings(nats_url=nats_server.url, shards=4))
    await queue(js, {(0, 2, "news"): 1})
    code, out, err = await jetcrawl(nats_server.url, "job", action, "nwes")
    assert (code, out) == (2, "")
    assert err.startswith("jetcrawl: no job 'nwes'") and "jetcrawl job list" in err, err
    assert err.count("\n") == 1
    assert await (await ControlStore.open(js)).names() == [], f"nothing in {CONTROL_BUCKET}"
    assert await lanes(js) == {task_subject(0, 2, "news"): 1}

    # A name that is no job name would widen the purge's filter: refused before connecting.
    code, _, err = await jetcrawl(nats_server.url, "job", action, ">")
    assert code == 2 and "a job name matches" in err
    assert await lanes(js) == {task_subject(0, 2, "news"): 1}


async def test_a_dead_server_is_one_line_naming_it(nats_server: NatsServer) -> None:
    dead = "nats://127.0.0.1:1"
    code, out, err = await jetcrawl(dead, "job", "cancel", "news")
    assert code != 0 and out == ""
    assert err.startswith(f"jetcrawl: cannot connect to NATS at {dead}") and err.count("\n") == 1
    # and the negative: the same command against a live server with no topology yet
    code, _, err = await jetcrawl(nats_server.url, "job", "cancel", "news")
    assert code == 2 and f"KV {CONTROL_BUCKET} is missing" in err


async def test_pause_then_cancel_from_the_command_line_on_a_crawling_mesh(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    """The commands against the lead's worker and dispatcher: a paused job is no longer fetched
    while the other goes on; its cancel purges what it has queued, and nothing of it remains."""
    settings = settings_for(nats_server, host_delay_s=0.1)
    async with (
        site_with("127.0.0.2", ("gone", 60)) as gone,
        site_with("127.0.0.3", ("kept", 40)) as kept,
        dispatching(settings),
    ):
        await js.publish(SEEDS, seeds(gone, "gone", 60, job="gone"))
        async with working(settings):

            async def started() -> bool:
                return len(gone.paths()) >= 3

            await eventually(started)
            await js.publish(SEEDS, seeds(kept, "kept", 40, job="kept"))
            code, out, err = await jetcrawl(nats_server.url, "job", "pause", "gone")
            assert (code, out, err) == (0, "job gone paused\n", "")
            paused_at = time.monotonic()

            async def kept_moves_on() -> bool:  # 40 pages 0.1 s apart: about 4 s
                return len(kept.paths()) >= 30

            await eventually(kept_moves_on)
            late = [t for t, path in gone.log if t > paused_at + 2.0 and path != "/robots.txt"]
            assert not late, "fetched more than 2 s after the pause"
            assert len(gone.paths()) < 60

            code, out, err = await jetcrawl(nats_server.url, "job", "cancel", "gone")
            assert code == 0 and not err, err
            purged = int(out.removeprefix("job gone cancelled: ").split()[0])
            assert out == f"job gone cancelled: {purged} queued tasks removed\n"
            await drained(js)
    assert not [s for s in await lanes(js) if s.endswith(".gone")]
    assert (await stream_count(js)) == 0
    cancelled = await record(js, "gone")
    assert (cancelled.state, cancelled.purged) == (CANCELLED, purged)
    assert purged > 0, "a paused job's tasks were still queued: the cancel took them"
    crawled = await results(js)
    assert {u for u in crawled if u.startswith(kept.origin)} == {
        kept.url(f"/kept{n}") for n in range(40)
    }


async def stream_count(js: JetStreamContext) -> int:
    return (await js.stream_info(TASKS_STREAM)).state.messages
