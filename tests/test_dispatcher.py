"""The dispatcher against a real nats-server: seeds and links in, tasks and dead letters out."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import nats
import orjson
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from jetcrawl.contract.messages import Discovered, Lineage, Task
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import (
    DEAD_STREAM,
    DISCOVERED,
    DISPATCH_CONSUMER,
    FRONTIER_STREAM,
    SEEDS,
    TASKS_STREAM,
    Topology,
)
from jetcrawl.contract.urls import fingerprint, host_of, shard_of
from jetcrawl.dispatcher import Dispatcher
from jetcrawl.dispatcher.seen import SeenSet, SeenSetUnavailable
from jetcrawl.dispatcher.service import retry_delay_s
from jetcrawl.local.embedded import NatsServer
from jetcrawl.ops.dlq import read_letters, replay
from jetcrawl.plumbing.bus import Outbox
from jetcrawl.plumbing.metrics import DispatcherMetrics
from jetcrawl.plumbing.topology import ensure
from tests.support import faulty
from tests.support.streams import eventually, read_until, seen_keys, stored

SHARDS = 8


def settings_for(url: str, **changes: object) -> Settings:
    return Settings(nats_url=url, shards=SHARDS, ack_wait_s=2.0, **changes)  # type: ignore[arg-type]


@asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[Dispatcher]:
    async with Dispatcher(settings) as dispatcher, asyncio.TaskGroup() as tg:
        tg.create_task(dispatcher.run())
        try:
            yield dispatcher
        finally:
            dispatcher.stop()


async def finished(dispatcher: Dispatcher, messages: int) -> None:
    async with asyncio.timeout(20):
        await dispatcher.wait_until(lambda s: s.messages >= messages)


async def tasks_by_url(js: JetStreamContext) -> dict[str, tuple[str, Task, dict[str, str]]]:
    out = {}
    for m in await stored(js, TASKS_STREAM):
        task = Task.from_wire(m.data)
        assert task.url not in out, f"two tasks for {task.url}"
        out[task.url] = (m.subject, task, m.headers)
    return out


def expected_subject(url: str, job: str = "default") -> str:
    return f"crawl.tasks.{shard_of(host_of(url), SHARDS)}.2.{job}"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"https://Example.COM:443/a/../b#frag", ["https://example.com/b"]),
        (
            b"https://a.example/\nhttp://b.example/x?utm_source=feed&b=2&a=1\n",
            ["https://a.example/", "http://b.example/x?a=1&b=2"],
        ),
        (
            b'{"url": "https://a.example/", "max_depth": 0, "scope": "domain", "job": "j1"}',
            ["https://a.example/"],
        ),
        (
            b'[{"url": "https://a.example/"}, "https://b.example/", {"url": "https://c.example/"}]',
            ["https://a.example/", "https://b.example/", "https://c.example/"],
        ),
    ],
    ids=["one-url", "lines", "json-object", "json-list"],
)
async def test_each_seed_format_becomes_exactly_the_expected_tasks(
    nats_server: object, nc: NATS, js: JetStreamContext, body: bytes, expected: list[str]
) -> None:
    settings = settings_for(nats_server.url)  # type: ignore[attr-defined]
    async with running(settings) as dispatcher:
        await nc.publish(SEEDS, body)  # raw bytes and no headers: what `nats pub` sends
        await finished(dispatcher, 1)
    tasks = await tasks_by_url(js)
    assert sorted(tasks) == sorted(expected)
    for url, (subject, task, headers) in tasks.items():
        assert subject == expected_subject(url, task.lineage.job)
        assert task.fp == fingerprint(url)
        assert headers["Nats-Msg-Id"] == task.seen_key  # the fingerprint, within a named job
        assert (task.seen_key == task.fp) == (task.lineage.job == "default")
        assert task.depth == 0 and task.parent is None
    assert await seen_keys(js) == {task.seen_key for _, task, _ in tasks.values()}
    assert await stored(js, DEAD_STREAM) == []


async def test_seed_options_become_the_tasks_lineage(
    nats_server: object, nc: NATS, js: JetStreamContext
) -> None:
    settings = settings_for(nats_server.url)  # type: ignore[attr-defined]
    async with running(settings) as dispatcher:
        await nc.publish(
            SEEDS,
            b'{"url": "https://www.a.example.co.uk/", "scope": "domain", '
            b'"max_depth": 3, "job": "news"}',
        )
        await nc.publish(SEEDS, b"https://b.example/")
        await finished(dispatcher, 2)
    tasks = await tasks_by_url(js)
    assert tasks["https://www.a.example.co.uk/"][1].lineage == Lineage(
        job="news", scope="domain", root="example.co.uk", max_depth=3
    )
    assert tasks["https://b.example/"][1].lineage == Lineage(
        job="default", scope="host", root="b.example", max_depth=settings.default_max_depth
    )


BAD_INPUTS = [
    (b"\x00\x01\x02\x03garbage", "binary"),
    (b"\xff\xfe\xfd", "invalid_utf8"),
    (b'{"url": "https://a.example/"', "invalid_json"),
    (b'{"url": ["https://a.example/"]}', "wrong_type"),
    (b"javascript:alert(1)", "unsupported_scheme"),
    (b"mailto:someone@example.com", "unsupported_scheme"),
    (b"file:///etc/passwd", "unsupported_scheme"),
    (b"https://user:secret@a.example/", "userinfo"),
    (b"https://a.example/" + b"x" * 5000, "too_long"),
    (b'{"v": 9, "url": "https://a.example/"}', "unknown_version"),
]


async def test_every_bad_input_is_dead_lettered_and_the_consumer_keeps_going(
    nats_server: object, nc: NATS, js: JetStreamContext
) -> None:
    settings = settings_for(nats_server.url)  # type: ignore[attr-defined]
    async with running(settings) as dispatcher:
        for body, _ in BAD_INPUTS:
            await nc.publish(SEEDS, body)
        # Bad and good items in one message: the good ones still go through.
        await nc.publish(SEEDS, b"https://good.example/one\njavascript:void(0)\n")
        bad_link_page = Discovered(
            "https://good.example/",
            "0" * 32,
            1,
            Lineage("default", "any", "", 5),
            ("mailto:x@y.z", "https://good.example/two"),
        )
        await nc.publish(DISCOVERED, bad_link_page.to_wire())
        await nc.publish(DISCOVERED, b'{"v": 7, "links": []}')
        await nc.publish(DISCOVERED, b"not json")
        await nc.publish(SEEDS, b"https://good.example/three")
        await finished(dispatcher, len(BAD_INPUTS) + 5)

    letters = [m.json() for m in await stored(js, DEAD_STREAM)]
    reasons = Counter(str(letter["reason"]) for letter in letters)
    expected = Counter(reason for _, reason in BAD_INPUTS)
    expected.update(["unsupported_scheme", "unsupported_scheme", "unknown_version", "invalid_json"])
    assert reasons == expected
    for letter in letters:
        assert {"stage", "reason", "subject", "received_at"} <= set(letter)
        assert "original" in letter or "original_b64" in letter
    assert len(orjson.dumps(letters)) < 64 * 1024, "originals are bounded"
    assert sorted(await tasks_by_url(js)) == [
        "https://good.example/one",
        "https://good.example/three",
        "https://good.example/two",
    ]
    info = await js.consumer_info("CRAWL_FRONTIER", "dispatch")
    assert info.num_pending == 0 and info.num_ack_pending == 0


async def test_discovered_links_inherit_lineage_and_are_scoped_and_depth_limited(
    nats_server: object, nc: NATS, js: JetStreamContext
) -> None:
    settings = settings_for(nats_server.url)  # type: ignore[attr-defined]
    lineage = Lineage("default", "host", "a.example", 2)
    async with running(settings) as dispatcher:
        await nc.publish(
            DISCOVERED,
            Discovered(
                "https://a.example/",
                "0" * 32,
                1,
                lineage,
                ("https://a.example/x", "https://other.example/", "https://a.example/x#again"),
            ).to_wire(),
        )
        await nc.publish(
            DISCOVERED,
            Discovered(
                "https://a.example/deep", "1" * 32, 3, lineage, ("https://a.example/too-deep",)
            ).to_wire(),
        )
        await finished(dispatcher, 2)
        assert dispatcher.stats.out_of_scope == 1 and dispatcher.stats.too_deep == 1
    tasks = await tasks_by_url(js)
    assert list(tasks) == ["https://a.example/x"]
    task = tasks["https://a.example/x"][1]
    assert task.depth == 1 and task.parent == "https://a.example/" and task.lineage == lineage


async def test_a_url_seen_before_is_not_admitted_again(
    nats_server: object, nc: NATS, js: JetStreamContext
) -> None:
    settings = settings_for(nats_server.url, dedupe_cache_size=2)  # type: ignore[attr-defined]
    urls = [f"https://a.example/{i}" for i in range(10)]
    async with running(settings) as dispatcher:
        await nc.publish(SEEDS, "\n".join(urls).encode())
        await finished(dispatcher, 1)
    # A fresh dispatcher (empty cache) still knows them: the seen set is in KV.
    async with running(settings) as dispatcher:
        await nc.publish(SEEDS, "\n".join([*urls, "https://a.example/new"]).encode())
        await finished(dispatcher, 1)
        assert dispatcher.stats.admitted == 1 and dispatcher.stats.duplicates == 10
    assert len(await tasks_by_url(js)) == 11


async def test_links_the_seen_cache_knows_are_counted_in_the_intake_without_tasks(
    nats_server: object, nc: NATS, js: JetStreamContext
) -> None:
    """The common case: most discovered links were seen. They cost a cache lookup, still count as
    duplicates, and a named job's links are keyed by job and never mistaken for another's."""
    settings = settings_for(nats_server.url)  # type: ignore[attr-defined]
    default, named = Lineage("default", "any", "", 5), Lineage("other", "any", "", 5)
    links = tuple(f"https://a.example/{i}" for i in range(6))

    def page(n: int, lineage: Lineage) -> bytes:
        parent = f"https://a.example/p{n}"
        return Discovered(parent, fingerprint(parent), 1, lineage, links).to_wire()

    async with running(settings) as dispatcher:
        await js.publish(DISCOVERED, page(1, default))
        await finished(dispatcher, 1)
        assert dispatcher.stats.admitted == 6
        hits = dispatcher.seen_stats.cache_hits
        await js.publish(DISCOVERED, page(2, default))
        await js.publish(DISCOVERED, page(3, named))  # another job: its own keys, all new
        await finished(dispatcher, 3)
        assert dispatcher.stats.admitted == 12 and dispatcher.stats.duplicates == 6
        assert dispatcher._seen.stats.cache_hits - hits == 6  # type: ignore[union-attr]
    tasks = [Task.from_wire(m.data) for m in await stored(js, TASKS_STREAM)]
    assert Counter((t.url, t.lineage.job) for t in tasks) == Counter(
        {(link, job): 1 for link in links for job in ("default", "other")}
    )


async def test_two_dispatchers_fed_the_same_seeds_admit_each_url_once(
    nats_server: object, nc: NATS, js: JetStreamContext
) -> None:
    settings = settings_for(nats_server.url, dispatch_batch=2)  # type: ignore[attr-defined]
    urls = [f"https://h{i % 7}.example/p{i}" for i in range(2000)]
    bodies = ["\n".join(urls[i : i + 10]).encode() for i in range(0, len(urls), 10)]
    async with running(settings) as one, running(settings) as two:
        for body in bodies:  # every seed list twice, interleaved
            await js.publish(SEEDS, body)  # stored when acked: the consumer counts it
            await js.publish(SEEDS, body)
        await _wait_drained(js)
        assert one.stats.messages > 0 and two.stats.messages > 0, "both took part"
    tasks = await tasks_by_url(js)  # asserts one task per URL
    assert sorted(tasks) == sorted(urls)
    assert await seen_keys(js) == {fingerprint(u) for u in urls}


async def test_shard_count_is_fixed_at_creation(nats_server: object, js: JetStreamContext) -> None:
    from jetcrawl.contract.errors import ShardCountMismatch

    await ensure(js, settings_for(nats_server.url))  # type: ignore[attr-defined]
    await ensure(js, settings_for(nats_server.url))  # type: ignore[attr-defined]  # idempotent
    with pytest.raises(ShardCountMismatch) as e:
        await ensure(js, Settings(nats_url=nats_server.url, shards=SHARDS * 2))  # type: ignore[attr-defined]
    assert e.value.existing == SHARDS and "--shards 8" in str(e.value)
    cli = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "jetcrawl",
        "dispatcher",
        "--nats",
        nats_server.url,
        "--shards",
        "3",  # type: ignore[attr-defined]
        stderr=subprocess.PIPE,
    )
    _, err = await cli.communicate()
    assert cli.returncode == 2 and b"created with 8 shards" in err


# ---------------------------------------------------------------- crashes


def _spawn_dispatcher(url: str, fault: str | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            *faulty.command(fault),
            "--log-level",
            "WARNING",
            "dispatcher",
            "--nats",
            url,
            "--shards",
            str(SHARDS),
        ],
        env=faulty.environ({**os.environ, "JETCRAWL_ACK_WAIT_S": "1"}),
        stderr=subprocess.DEVNULL,
    )


async def _wait_exit(proc: subprocess.Popen[bytes]) -> int:
    async with asyncio.timeout(20):
        return await asyncio.to_thread(proc.wait)


async def _wait_drained(js: JetStreamContext) -> None:
    async def drained() -> bool:
        info = await js.consumer_info("CRAWL_FRONTIER", "dispatch")
        return info.num_pending == 0 and info.num_ack_pending == 0

    await eventually(drained)


async def test_crash_between_seen_mark_and_task_loses_nothing(
    nats_server: object, nc: NATS, js: JetStreamContext
) -> None:
    url = nats_server.url  # type: ignore[attr-defined]
    urls = [f"https://h{i % 5}.example/p{i}" for i in range(200)]
    await ensure(js, settings_for(url))
    await js.publish(SEEDS, "\n".join(urls).encode())
    crashing = _spawn_dispatcher(url, fault="dispatcher.after_seen")
    try:
        assert await _wait_exit(crashing) == 137
    finally:
        crashing.kill()  # it did not crash: a failure, not a hang on its wait thread
    assert await seen_keys(js) == {fingerprint(u) for u in urls}, "marks made, then the crash"
    assert await stored(js, TASKS_STREAM) == []

    restarted = _spawn_dispatcher(url)
    try:
        await _wait_drained(js)
    finally:
        restarted.send_signal(signal.SIGTERM)
        assert await _wait_exit(restarted) == 0
    assert sorted(await tasks_by_url(js)) == sorted(urls)


async def test_a_redelivery_that_counts_as_a_first_still_publishes_its_marks_tasks(
    nats_server: object, nc: NATS, js: JetStreamContext
) -> None:
    """A clustered consumer replicates its delivery counts after it delivers, so its next leader
    (after a quorum loss) can deliver again with a count of 1 what the last one had delivered.
    Here the consumer is made anew, which forgets its counts the same way. The dispatcher knows
    the message by its sequence: it made the marks and failed to publish their tasks."""
    settings = settings_for(nats_server.url)  # type: ignore[attr-defined]
    urls = [f"https://h{i}.example/p" for i in range(5)]
    [dispatch] = [
        consumer
        for stream, consumer in Topology.from_settings(settings).consumers
        if stream == FRONTIER_STREAM and consumer.durable_name == DISPATCH_CONSUMER
    ]
    async with running(settings) as dispatcher:
        tasks_config = (await js.stream_info(TASKS_STREAM)).config
        # No task fits in the tasks stream: every publish of the batch fails.
        await js.update_stream(dataclasses.replace(tasks_config, max_msg_size=16))
        await js.publish(SEEDS, "\n".join(urls).encode())
        async with asyncio.timeout(20):
            await dispatcher.wait_until(lambda s: s.retried >= 1)
        assert await seen_keys(js) == {fingerprint(u) for u in urls}, "marks made"
        assert await stored(js, TASKS_STREAM) == []

        await js.delete_consumer(FRONTIER_STREAM, DISPATCH_CONSUMER)
        await js.update_stream(tasks_config)
        await js.add_consumer(FRONTIER_STREAM, dispatch)
        await finished(dispatcher, 1)
        assert dispatcher.stats.republished == len(urls)
    assert sorted(await tasks_by_url(js)) == sorted(urls)


async def test_a_frontier_message_out_of_deliveries_is_a_dead_letter_whose_replay_admits_it(
    nats_server: object, nc: NATS, js: JetStreamContext
) -> None:
    """Its marks were made and their tasks never published; read again as a new message, its
    links would all be duplicates of those marks. The letter keeps the sequence it had, and the
    replay carries it."""
    settings = settings_for(
        nats_server.url,  # type: ignore[attr-defined]
        frontier_max_deliver=2,
        dead_original_max_bytes=16,  # the seeds are longer: kept whole all the same
    )
    urls = [f"https://h{i}.example/p" for i in range(5)]
    seeds = "\n".join(urls).encode()
    async with running(settings) as dispatcher:
        tasks_config = (await js.stream_info(TASKS_STREAM)).config
        await js.update_stream(dataclasses.replace(tasks_config, max_msg_size=16))
        ack = await js.publish(SEEDS, seeds)
        letters = await read_until(
            lambda: read_letters(js, stage="frontier", reason="max_deliveries"), bool
        )
        [dead] = [x.letter for x in letters]
        assert dead is not None
        assert (dead.subject, dead.original, dead.origins) == (SEEDS, seeds, (ack.seq,))
        assert (await js.stream_info(FRONTIER_STREAM)).state.messages == 0, "taken out"
        assert await seen_keys(js) == {fingerprint(u) for u in urls}, "marks made"
        assert await stored(js, TASKS_STREAM) == []
        assert dispatcher.poison is not None
        assert dispatcher.poison.stats.frontier_dead_lettered == 1
        metrics = DispatcherMetrics("dispatcher", "0", "test")
        metrics.bind(dispatcher)
        assert metrics.registry.get_sample_value("jetcrawl_dead_letters_total") == 1

        await js.update_stream(tasks_config)
        before = dataclasses.replace(dispatcher.stats)
        assert (await replay(js, letters)).replayed == 1
        await finished(dispatcher, before.messages + 1)
        assert dispatcher.stats.republished - before.republished == len(urls)
        assert dispatcher.stats.admitted == before.admitted
    assert sorted(await tasks_by_url(js)) == sorted(urls)


async def test_a_frontier_letter_too_large_to_keep_whole_is_kept_cut_and_never_replayed(
    tmp_path: Path,
) -> None:
    """Whole, the letter would not fit in a message, and its publish would fail for ever."""
    config = tmp_path / "small.conf"
    config.write_text("max_payload: 8192\n")
    urls = [f"https://h{i}.example/{'p' * 40}" for i in range(133)]
    seeds = "\n".join(urls).encode()
    assert 8000 < len(seeds) < 8192  # fits a message; as a letter (JSON, escaped), it does not
    async with NatsServer(tmp_path / "nats", config=config) as server:
        settings = settings_for(server.url, frontier_max_deliver=2, dead_original_max_bytes=100)
        nc = await nats.connect(server.url, connect_timeout=5)
        js = nc.jetstream()
        try:
            async with running(settings):
                tasks_config = (await js.stream_info(TASKS_STREAM)).config
                await js.update_stream(dataclasses.replace(tasks_config, max_msg_size=16))
                await js.publish(SEEDS, seeds)
                letters = await read_until(lambda: read_letters(js, stage="frontier"), bool)
            [dead] = [x.letter for x in letters]
            assert dead is not None
            assert (dead.original, dead.original_size) == (seeds[:100], len(seeds))
            assert dead.detail.endswith("not replayable")
            assert (await js.stream_info(FRONTIER_STREAM)).state.messages == 0
            report = await replay(js, letters)
            assert (report.replayed, report.skipped) == (0, 1)
        finally:
            await nc.close()


async def test_a_mark_is_read_as_stored_and_one_missing_after_its_rejection_decides_nothing(
    nats_server: object, nc: NATS, js: JetStreamContext
) -> None:
    """``SeenSet.read`` is asked only for a mark whose create was rejected as existing. Missing
    then (a replica's stale answer, a TTL run out), it is no proof of a duplicate: the dispatcher
    must try the batch again, not drop the URL."""
    await ensure(js, settings_for(nats_server.url))  # type: ignore[attr-defined]
    seen = SeenSet(Outbox(nc), js, cache_size=10)
    [new] = await seen.create([("fp1", 42)])
    assert new is not None and new.origin == 42
    assert await SeenSet(Outbox(nc), js, cache_size=10).read("fp1") == new  # from the bucket
    assert await seen.create([("fp1", 43)]) == [None]  # rejected: it exists
    with pytest.raises(SeenSetUnavailable, match="no mark fp2"):
        await seen.read("fp2")


def test_a_frontier_message_handed_back_waits_longer_each_time() -> None:
    assert [retry_delay_s(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    assert retry_delay_s(0) == 1 and retry_delay_s(10**6) == 30
    # The deliveries a frontier message has outlast minutes of a stream without a leader.
    assert sum(retry_delay_s(n) for n in range(1, Settings().frontier_max_deliver)) > 5 * 60


async def test_kill_9_mid_batch_then_restart_every_admitted_url_has_one_task(
    nats_server: object, nc: NATS, js: JetStreamContext
) -> None:
    url = nats_server.url  # type: ignore[attr-defined]
    await ensure(js, settings_for(url))
    urls = [f"https://h{i % 11}.example/p{i}" for i in range(6000)]
    for i in range(0, len(urls), 20):
        await js.publish(SEEDS, "\n".join(urls[i : i + 20]).encode())
    proc = _spawn_dispatcher(url)

    async def some_tasks_out() -> bool:
        return (await js.stream_info(TASKS_STREAM)).state.messages >= 500

    await eventually(some_tasks_out)
    proc.send_signal(signal.SIGKILL)
    await _wait_exit(proc)
    before = (await js.stream_info(TASKS_STREAM)).state.messages
    assert before < len(urls), "killed mid-crawl, not after"

    restarted = _spawn_dispatcher(url)
    try:
        await _wait_drained(js)
    finally:
        restarted.send_signal(signal.SIGTERM)
        assert await _wait_exit(restarted) == 0
    tasks = await tasks_by_url(js)  # at most one task per URL
    assert await seen_keys(js) == {fingerprint(u) for u in tasks}, "each admitted URL has a task"
    assert sorted(tasks) == sorted(urls)


async def test_max_pages_holds_across_dispatchers_with_zero_overshoot(
    nats_server: object, nc: NATS, js: JetStreamContext
) -> None:
    settings = settings_for(nats_server.url, max_pages=25, dispatch_batch=3)  # type: ignore[attr-defined]
    urls = [f"https://h{i % 5}.example/p{i}" for i in range(400)]
    async with running(settings) as one, running(settings) as two:
        for i in range(0, len(urls), 4):
            await js.publish(SEEDS, "\n".join(urls[i : i + 4]).encode())  # stored when acked
        await js.publish(SEEDS, b'{"url": "https://other.example/", "job": "other"}')
        await _wait_drained(js)
        assert one.stats.over_limit + two.stats.over_limit == len(urls) - 25
    tasks = await tasks_by_url(js)
    assert len([t for _, t, _ in tasks.values() if t.lineage.job == "default"]) == 25
    assert "https://other.example/" in tasks, "the limit is per job"


async def test_with_recrawl_a_seen_mark_expires_and_the_url_is_admitted_again(
    nats_server: object, nc: NATS, js: JetStreamContext
) -> None:
    settings = settings_for(nats_server.url, recrawl_after_s=1.0)  # type: ignore[attr-defined]
    url = "https://a.example/page"
    async with running(settings) as dispatcher:
        await js.publish(SEEDS, url.encode())
        await finished(dispatcher, 1)

        async def expired() -> bool:
            return fingerprint(url) not in await seen_keys(js)

        await eventually(expired, within_s=10)
        await js.publish(SEEDS, url.encode())
        await finished(dispatcher, 2)
        assert dispatcher.stats.admitted == 2
    tasks = [(m.headers, Task.from_wire(m.data)) for m in await stored(js, TASKS_STREAM)]
    assert [t.url for _, t in tasks] == [url, url]
    first, second = (t.gen for _, t in tasks)
    assert 0 < first < second, "each crawl of the URL has its own generation"
    assert [h["Nats-Msg-Id"] for h, _ in tasks] == [f"{t.fp}-{t.gen}" for _, t in tasks]


async def test_stop_ends_both_waiting_pulls_at_once_and_a_next_dispatcher_takes_over(
    nats_server: object, js: JetStreamContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Pull requests that wait 60 s: a stop that waited for them would blow the bounds below.
    monkeypatch.setattr("dispatcher.service.FETCH_WAIT_S", 60.0)
    monkeypatch.setattr("dispatcher.poison.FETCH_WAIT_S", 60.0)
    settings = settings_for(nats_server.url).replace(ack_wait_s=60.0)  # type: ignore[attr-defined]
    async with Dispatcher(settings) as dispatcher:
        run = asyncio.create_task(dispatcher.run())
        await js.publish(SEEDS, b"http://a.example/")
        await finished(dispatcher, 1)  # its frontier and poison pulls are waiting again
        dispatcher.stop()
        async with asyncio.timeout(10):
            await run
        # Its requests ended with the stop, though its connection is still open: the next
        # seed goes to the next dispatcher at once, not after AckWait (60 s).
        await js.publish(SEEDS, b"http://b.example/")
        async with running(settings) as successor:
            await finished(successor, 1)
        assert set((await tasks_by_url(js)).keys()) == {"http://a.example/", "http://b.example/"}
